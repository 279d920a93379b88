"""A small data-parallel training job with one deliberately slow rank (the straggler).

Run under a launcher, one process per rank::

    python -m torch.distributed.run --standalone --nproc-per-node 3 tests/workloads/ranks_train.py \
        --slow-rank 2 --slow-ms 60 --duration 20

or by hand / from a shell wrapper / mpirun: the rank comes from --rank, else RANK (or
OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID), the world size from --world-size, else WORLD_SIZE
(or their *_SIZE twins), the rendezvous from MASTER_ADDR / MASTER_PORT (default 127.0.0.1:29500).
With --rank the rank is in the arguments only, as ``mp.spawn`` recipes do: nothing in the
process's environment says it is a rank (only gputop's probe, asking torch.distributed, can).

Every step every rank runs a tiny MLP forward/backward on CPU (or CUDA with --device cuda), DDP
all-reduces the gradients, and one more ``dist.all_reduce`` of a stop flag (the step's "metric
sync") keeps every rank on the same step count, so the job ends together at --duration (or
--steps). The slow rank does extra work each step -- sleeping (--slow-mode sleep: off the CPU,
like a rank waiting on its disk) or spinning (--slow-mode cpu: on the CPU, like a rank with a
heavier data path) -- and the fast ranks wait for it:

  --slow-at sync      (default) after the optimizer step: the fast ranks wait in
                      ``dist.all_reduce`` (torch.distributed's Python frames are on their stack:
                      gputop classifies the wait as "collective");
  --slow-at backward  before loss.backward(): the fast ranks wait inside DDP's gradient
                      all-reduce, which runs in C++ under ``Tensor.backward`` (no
                      torch.distributed frame on the stack: py-spy shows ``_engine_run_backward``).

Each rank prints one JSON line per second to stdout ({"rank", "pid", "steps", "steps_per_s"})
and a final line with "done": true; --out PATH also writes PATH.<rank> (JSON) at the end.

Flags:
  --rank R, --world-size N   this process's rank and the world size (default: the environment)
  --slow-rank R     the straggler (default: env GPUTOP_SLOW_RANK, else none)
  --slow-ms MS      extra time per step on the slow rank (default 50)
  --slow-mode M     sleep | cpu (default sleep)
  --slow-at W       sync | backward (default sync; see above)
  --slow-after S    the slow rank is slow only after S seconds of training (default 0): one job
                    is first balanced, then has a straggler; it prints {"slow_from": wall time}
  --step-ms MS      CPU work per step on every rank, on top of the model (default 2)
  --grad-sync S     ddp (default: torch's DistributedDataParallel) | allreduce (one
                    ``dist.all_reduce`` of the flattened gradients after backward: the same
                    traffic without DDP's ~4 s of imports per rank, for quick tests; the slow
                    rank's wait is then in torch.distributed's Python frames with either --slow-at)
  --workers N       DataLoader worker processes per rank (default 0: batches made in the loop)
  --probe           load gputop's in-process probe (gputop.probe.install())
  --device D        cpu | cuda (cuda: rank r uses cuda:(LOCAL_RANK % device count))
  --backend B       gloo (default) | nccl
  --dim N           width of the MLP (default 64)
  --gpu-matmuls N   with --device cuda: N extra 4096x4096 matmuls per step on every rank (keeps
                    the GPU busy without a big model to all-reduce; default 0)
  --hold-file PATH  after the last step, wait (<= 60 s) until PATH exists before exiting
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

RANK_VARS = (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
             ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
             ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))


def _who() -> tuple[int, int, int]:
    for rank_var, size_var, local_var in RANK_VARS:
        if rank_var in os.environ:
            rank = int(os.environ[rank_var])
            return rank, int(os.environ.get(size_var, "1")), int(os.environ.get(local_var, str(rank)))
    return 0, 1, 0


class Batches:
    """A map-style dataset of random batches (module level so worker processes can unpickle it)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i):
        import torch
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), torch.randn(1, generator=g)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: use --duration)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of training (rank 0 decides)")
    env_slow = os.environ.get("GPUTOP_SLOW_RANK")
    ap.add_argument("--slow-rank", type=int, default=int(env_slow) if env_slow not in (None, "") else -1)
    ap.add_argument("--slow-ms", type=float, default=50.0)
    ap.add_argument("--slow-mode", choices=("sleep", "cpu"), default="sleep")
    ap.add_argument("--slow-at", choices=("sync", "backward"), default="sync")
    ap.add_argument("--slow-after", type=float, default=0.0)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--grad-sync", choices=("ddp", "allreduce"), default="ddp")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--gpu-matmuls", type=int, default=0)
    ap.add_argument("--hold-file", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--world-size", type=int, default=None)
    args = ap.parse_args()

    rank, world, local_rank = _who()
    if args.rank is not None:
        rank, local_rank = args.rank, args.rank
    if args.world_size is not None:
        world = args.world_size
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")

    import torch
    import torch.distributed as dist
    import torch.utils.data as tud

    torch.set_num_threads(1)   # a few ranks share a small machine: no thread pools fighting
    if args.probe:
        import gputop.probe
        gputop.probe.install()
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    if args.device == "cuda":
        device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.dim, args.dim), torch.nn.ReLU(),
                                torch.nn.Linear(args.dim, args.dim), torch.nn.ReLU(),
                                torch.nn.Linear(args.dim, 1)).to(device)
    if args.grad_sync == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        ddp = model
        for p in model.parameters():   # the same start on every rank, as DDP's broadcast gives
            dist.broadcast(p.data, 0)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    loader = tud.DataLoader(Batches(args.dim), batch_size=args.batch_size, num_workers=args.workers,
                            persistent_workers=args.workers > 0)
    slow = rank == args.slow_rank
    slowing = slow and args.slow_after <= 0
    load = torch.randn(4096, 4096, device=device) if args.gpu_matmuls and device.type == "cuda" else None
    stop_flag = torch.zeros(1, device=device)

    def slow_work() -> None:
        if args.slow_ms <= 0:
            return
        if args.slow_mode == "sleep":
            time.sleep(args.slow_ms / 1000.0)
        else:
            _spin(args.slow_ms / 1000.0)

    def say(**kw) -> None:
        print(json.dumps({"rank": rank, "pid": os.getpid(), "world_size": world, "slow": slow, **kw}), flush=True)

    say(started=True)
    it = iter(loader)
    steps = 0
    t_start = time.monotonic()
    last_t, last_steps = t_start, 0
    while True:
        x, y = next(it)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = ((ddp(x) - y) ** 2).mean()
        if load is not None:
            with torch.no_grad():
                z = load
                for _ in range(args.gpu_matmuls):
                    z = torch.tanh(z @ load)
        if args.step_ms > 0:
            _spin(args.step_ms / 1000.0)
        if slow and not slowing and time.monotonic() - t_start >= args.slow_after:
            slowing = True
            say(slow_from=time.time())
        if slowing and args.slow_at == "backward":
            slow_work()
        loss.backward()          # DDP's gradient all-reduce (--slow-at backward: fast ranks wait here)
        if args.grad_sync == "allreduce":
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= world
            torch.nn.utils.vector_to_parameters(flat, grads)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if slowing and args.slow_at == "sync":
            slow_work()
        steps += 1
        now = time.monotonic()
        if rank == 0:
            done = (args.steps and steps >= args.steps) or (not args.steps and now - t_start >= args.duration)
            stop_flag.fill_(1.0 if done else 0.0)
        else:
            stop_flag.zero_()
        dist.all_reduce(stop_flag)   # everyone stops at the same step (--slow-at sync: fast ranks wait here)
        if now - last_t >= 1.0:
            say(steps=steps, steps_per_s=round((steps - last_steps) / (now - last_t), 2))
            last_t, last_steps = now, steps
        if stop_flag.item() > 0:
            break
    wall = time.monotonic() - t_start
    result = {"steps": steps, "wall_s": round(wall, 3), "steps_per_s": round(steps / wall, 3) if wall > 0 else None,
              "local_rank": local_rank, "done": True}
    say(**result)
    if args.out:
        path = f"{args.out}.{rank}"
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": rank, "pid": os.getpid(), "world_size": world, "slow": slow, **result}, f)
        os.replace(path + ".tmp", path)
    if args.hold_file:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.hold_file) and time.monotonic() < deadline:
            time.sleep(0.05)
    # The DDP wrapper holds the gloo process group (and may sit in a reference cycle): torn down
    # with the interpreter, gloo's threads can abort the process ("terminate called without an
    # active exception", SIGABRT after every rank said done: seen once in a suite beside two CPU
    # hogs, as ddp_math.py was). Freed here first, while the interpreter is whole.
    del it, opt, ddp, model
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
