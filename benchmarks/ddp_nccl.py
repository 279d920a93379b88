"""DDP and FSDP on real ranks: does gputop name the straggler and communication-bound jobs from
the collectives it times inside each rank (issue 17, part 4)? And what does the DDP hook cost?

    python benchmarks/ddp_nccl.py OUTDIR [--nproc N] [--gloo-cpu] [--duration 12] [--only NAMES]

Each scenario is a ``torchrun --standalone --nproc-per-node N`` job of this file's worker (an MLP,
DDP or FSDP, NCCL on one GPU per rank; ``--gloo-cpu``: gloo on CPU), started with gputop's probe
(``gputop.session.launch.launch_with_probe``), watched through the launcher by the real sources
(host, py-spy stacks, NVML, probe client) in a recorded LiveSession, then judged by replaying the
recording through the verdict processors. NVLink multicast stays off in every program started:
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.

Scenarios (N >= 2):
  ddp_balanced      every rank the same work: no straggler expected
  ddp_straggler     rank N-1 sleeps --slow-ms before backward: the others wait inside DDP's
                    all-reduce; straggler_rank should name rank N-1
  ddp_comm          a large model (--comm-dim) with a tiny batch: the all-reduce dominates;
                    communication_bound expected (no straggler)
  fsdp_balanced, fsdp_straggler   the same with FSDP2 (fully_shard per Linear layer)
With N = 1 (one GPU): ``ddp_probe`` vs ``ddp_noprobe`` (started without the probe), alternated --reps
times: the hook installs (``ddp_comm`` on) and its cost is the steps/s ratio.

Writes OUTDIR/ddp_nccl.json (per scenario: verdicts seen active, the straggler named, primary
verdict counts, per-rank probe collective wait share, the job's own steps/s) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)   # and so in every program this one starts


# ---------------------------------------------------------------------------------------------
# The worker (one rank): python ddp_nccl.py --worker ...

def worker(a) -> int:
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dist.init_process_group(a.backend)
    if a.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.dim, a.dim), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.dim, 1)).to(dev)
    if a.wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local] if a.device == "cuda" else None)
    else:
        try:   # FSDP2 (torch >= 2.6); FSDP1 needs an accelerator, FSDP2 runs on CPU with gloo too
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(a.batch, a.dim, device=dev)
    y = torch.randn(a.batch, 1, device=dev)
    slow = rank == a.slow_rank
    flag = torch.zeros(1, device=dev)
    steps, t0 = 0, time.monotonic()
    while True:
        loss = ((model(x) - y) ** 2).mean()
        if slow and a.slow_ms > 0:
            time.sleep(a.slow_ms / 1000.0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps % 10 == 0:    # stop together (a flag every 10 steps keeps the loop's own syncs rare)
            flag.fill_(1.0 if (rank == 0 and time.monotonic() - t0 >= a.duration) else 0.0)
            dist.all_reduce(flag)
            if flag.item() > 0:
                break
    if a.device == "cuda":
        torch.cuda.synchronize()
    wall = time.monotonic() - t0
    if a.out:
        with open(f"{a.out}.{rank}", "w") as f:
            json.dump({"rank": rank, "world": world, "steps": steps, "wall_s": wall, "steps_per_s": steps / wall}, f)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------
# The driver

def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _scenarios(a) -> list[dict]:
    n, last = a.nproc, a.nproc - 1
    base = {"layers": 4, "dim": a.dim, "batch": a.batch, "slow_rank": -1, "slow_ms": 0.0, "probe": True}
    if n == 1:
        out = []
        for i in range(a.reps):
            out.append({**base, "name": f"ddp_probe#{i}", "wrap": "ddp"})
            out.append({**base, "name": f"ddp_noprobe#{i}", "wrap": "ddp", "probe": False})
        return out
    comm = {**base, "dim": a.comm_dim, "batch": 2, "layers": 4}
    return [{**base, "name": "ddp_balanced", "wrap": "ddp"},
            {**base, "name": "ddp_straggler", "wrap": "ddp", "slow_rank": last, "slow_ms": a.slow_ms},
            {**comm, "name": "ddp_comm", "wrap": "ddp"},
            {**base, "name": "fsdp_balanced", "wrap": "fsdp"},
            {**base, "name": "fsdp_straggler", "wrap": "fsdp", "slow_rank": last, "slow_ms": a.slow_ms}]


def run_scenario(a, sc: dict, tmp: pathlib.Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from gputop.session.launch import launch_with_probe
    from gputop.session.recording import Recorder, RecordingWriter
    from gputop.session.replay import ReplaySession
    from gputop.session.session import LiveSession, SessionClock, base_meta
    from gputop.session.store import CallbackSubscriber
    from gputop.derive.threads import ThreadStateProcessor
    from gputop.sources.host import HostSource
    from gputop.sources.nvml import NvmlSource
    from gputop.sources.probe_client import ProbeClientSource
    from gputop.sources.stacks import StackSource
    from gputop.sources.target import Target
    from gputop.verdicts import default_processors

    name = sc["name"].replace("#", "_")
    out = tmp / name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(a.nproc),
           "--master-port", str(_port()), str(pathlib.Path(__file__).resolve()), "--worker",
           "--wrap", sc["wrap"], "--backend", "gloo" if a.gloo_cpu else "nccl",
           "--device", "cpu" if a.gloo_cpu else "cuda", "--dim", str(sc["dim"]), "--layers", str(sc["layers"]),
           "--batch", str(sc["batch"]), "--slow-rank", str(sc["slow_rank"]), "--slow-ms", str(sc["slow_ms"]),
           "--duration", str(a.duration), "--out", str(out)]
    env = dict(os.environ, **NO_MULTICAST, GPUTOP_PROBE_DIR=str(tmp / "sock"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(tmp / f"{name}.log", "w")
    if sc["probe"]:
        proc = launch_with_probe(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    else:  # a plain start: launch_with_probe would load the probe whatever GPUTOP_PROBE_OFF says
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    samples: list = []
    rec = tmp / f"{name}.gtrec"
    try:
        clock = SessionClock()
        target = Target(proc.pid)
        sources = [HostSource(clock, target), StackSource(clock, target), NvmlSource(clock, target),
                   ProbeClientSource(clock, target, scan_interval_s=0.5)]
        meta = base_meta(clock, ["benchmarks/ddp_nccl.py", name])
        meta["target"] = target.describe()
        session = LiveSession(sources, clock, meta, recorder=Recorder(RecordingWriter(str(rec), meta)),
                              processors=[ThreadStateProcessor()])
        session.bus.subscribe(CallbackSubscriber(samples.extend))
        session.start()
        deadline = time.monotonic() + a.duration + 240
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        session.stop()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    res: dict = {"name": sc["name"], "rc": proc.returncode, "wrap": sc["wrap"], "probe": sc["probe"]}
    ranks = []
    for r in range(a.nproc):
        try:
            ranks.append(json.loads(pathlib.Path(f"{out}.{r}").read_text()))
        except (OSError, ValueError):
            pass
    res["steps_per_s"] = min((x["steps_per_s"] for x in ranks), default=None)
    waits: dict[str, list] = {}
    hooks = {}
    for s in samples:
        if s.kind == "probe_step" and s.get("collective_exposed_s_sum") is not None and s.get("step_s_sum"):
            w = waits.setdefault(str(s.get("rank")), [0.0, 0.0])
            w[0] += s.get("collective_exposed_s_sum")
            w[1] += s.get("step_s_sum")
        elif s.kind == "probe_config":
            hooks[str(s.get("rank"))] = (s.get("hooks") or {}).get("ddp_comm")
    res["probe_wait_pct"] = {k: round(100 * e / t, 1) for k, (e, t) in sorted(waits.items()) if t}
    # the probe's kernel trace (GPUTOP_KERNEL_SAMPLE=1 in the environment): each rank's latest
    # kernels' time per step, or why it has none
    kernel: dict = {}
    for s in samples:
        if s.kind == "probe_step":
            k = s.get("kernel_ms_per_step")
            kernel[str(s.get("rank"))] = (f"{k} ms of kernels per step (step p50 {s.get('step_ms_p50')} ms)"
                                          if k is not None else s.get("kernel_off"))
    res["kernel"] = kernel
    res["ddp_comm_hook"] = hooks
    if proc.returncode != 0 or not sc["probe"]:
        res["log_tail"] = (tmp / f"{name}.log").read_text()[-1500:] if proc.returncode else None
        return res
    replay = ReplaySession(str(rec), processors=default_processors(), start_playing=False, seek_window_s=0.0)
    got: list = []
    replay.bus.subscribe(CallbackSubscriber(got.extend))
    replay.play_to(replay.t_end)
    replay.stop()
    active = sorted({s.key for s in got if s.kind == "verdict" and s.get("active")})
    named = sorted({s.get("evidence", {}).get("straggler") for s in got
                    if s.kind == "verdict" and s.key == "straggler_rank" and s.get("active")}, key=str)
    prim: dict[str, int] = {}
    for s in got:
        if s.kind == "verdict_primary" and s.get("id"):
            prim[s.get("id")] = prim.get(s.get("id"), 0) + 1
    res.update(active=active, straggler_named=named, primaries=prim)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--wrap", default="ddp")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--nproc", type=int, default=None)
    ap.add_argument("--gloo-cpu", action="store_true", help="gloo on CPU (to check the script without GPUs)")
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--dim", type=int, default=None)
    ap.add_argument("--comm-dim", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--slow-ms", type=float, default=30.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    a = ap.parse_args()
    if a.worker:
        a.dim, a.batch = a.dim or 64, a.batch or 16
        return worker(a)
    if not a.outdir:
        ap.error("OUTDIR is required")
    if a.nproc is None:
        a.nproc = 3 if a.gloo_cpu else _gpu_count()
    if a.nproc < 1:
        print("no GPU found (use --gloo-cpu to run on CPUs)", file=sys.stderr)
        return 2
    a.dim = a.dim or (64 if a.gloo_cpu else 4096)
    a.comm_dim = a.comm_dim or (512 if a.gloo_cpu else 8192)
    a.batch = a.batch or (16 if a.gloo_cpu else 2048)
    outdir = pathlib.Path(a.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    only = {x for x in a.only.split(",") if x}
    results = []
    with tempfile.TemporaryDirectory(prefix="gputop-ddp-") as td:
        for sc in _scenarios(a):
            if only and sc["name"].split("#")[0] not in only:
                continue
            t0 = time.monotonic()
            res = run_scenario(a, sc, pathlib.Path(td))
            res["wall_s"] = round(time.monotonic() - t0, 1)
            results.append(res)
            print(_row(res), flush=True)
    doc = {"nproc": a.nproc, "backend": "gloo" if a.gloo_cpu else "nccl", "duration_s": a.duration,
           "env": NO_MULTICAST, "results": results}
    if a.nproc == 1:
        on = [r["steps_per_s"] for r in results if r["probe"] and r["steps_per_s"]]
        off = [r["steps_per_s"] for r in results if not r["probe"] and r["steps_per_s"]]
        if on and off:
            doc["probe_cost_pct"] = round(100 * (1 - (sum(on) / len(on)) / (sum(off) / len(off))), 2)
            print(f"probe + DDP hook cost: {doc['probe_cost_pct']}% of steps/s (mean of {len(on)} vs {len(off)} runs)")
    (outdir / "ddp_nccl.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {outdir / 'ddp_nccl.json'}")
    return 0


def _row(r: dict) -> str:
    sps = "n/a" if r.get("steps_per_s") is None else f"{r['steps_per_s']:.1f}"
    return (f"{r['name']:<16} rc={r['rc']} steps/s={sps:>7} wait%={r.get('probe_wait_pct')} "
            f"straggler={r.get('straggler_named')} active={r.get('active')} ({r.get('wall_s')} s)")


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
