"""A small training loop that stops stepping, for the stall tests (and the H200 benchmark).

Every step is a tiny MLP forward/backward/optimizer step (CPU, or CUDA with --device cuda; the
probe counts steps at optimizer.step). Its scenes, in order, each --stall-s long, with
--train-s of training before, between and after them:

  sleep       the main thread sleeps in ``stuck_in_sleep()``                    (line STALL-SLEEP)
  lock        the main thread waits on a threading.Lock that ``hold_the_lock()`` holds while it
              sleeps in another thread                         (lines STALL-LOCK, STALL-HOLDER)
  collective  (--world-size 2) rank 1 sleeps in ``rank_elsewhere()`` (STALL-ELSEWHERE) while
              rank 0 waits in ``dist.all_reduce`` (STALL-ALLREDUCE), gloo
  loader      (torch) the main thread waits for a DataLoader batch (STALL-NEXT) that its two
              workers, asleep in the dataset's __getitem__ (STALL-LOADER), do not make: a hung
              input pipeline

--scenes picks them (default: sleep,lock). --first-train-s sets the training before the first
scene only (default: --train-s). --plain drops torch: a step is a little pure-Python work marked
with ``gputop.probe.step()`` (the sleep and lock scenes are not about torch, and importing it
costs seconds on a loaded machine). Before the first step it sleeps --startup-s (a
start-up with no step yet). A ticker thread counts every millisecond and, with --ticks PATH,
writes "monotonic_time count" lines to PATH every 10 ms, so a test can see that the process
never stopped while it was dumped. --events PATH gets one JSON line per scene start and end
(monotonic times). --launch-ranks N starts N copies of itself as ranks (RANK, WORLD_SIZE,
MASTER_ADDR/PORT in their environment) and waits for them, like a tiny torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time


def stuck_in_sleep(seconds: float) -> None:
    time.sleep(seconds)  # STALL-SLEEP


def hold_the_lock(lock: threading.Lock, seconds: float, held: threading.Event) -> None:
    with lock:
        held.set()
        time.sleep(seconds)  # STALL-HOLDER


def wait_for_lock(lock: threading.Lock) -> None:
    with lock:  # STALL-LOCK
        pass


def rank_elsewhere(seconds: float) -> None:
    time.sleep(seconds)  # STALL-ELSEWHERE


class Ticker(threading.Thread):
    def __init__(self, path: str | None) -> None:
        super().__init__(name="ticker", daemon=True)
        self.path, self.count = path, 0

    def run(self) -> None:
        f = open(self.path, "w") if self.path else None
        last = 0.0
        while True:
            self.count += 1
            now = time.monotonic()
            if f is not None and now - last >= 0.01:
                f.write(f"{now:.4f} {self.count}\n")
                f.flush()
                last = now
            time.sleep(0.001)


def launch(n: int, argv: list[str]) -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env))
    return max(p.wait() for p in procs)


def run_scenes(a, train, event, collective=None, loader=None) -> None:
    """The start-up, then each scene with training before and after it."""
    time.sleep(a.startup_s)
    event(scene="training")
    train(a.train_s if a.first_train_s is None else a.first_train_s)
    for scene in a.scenes.split(","):
        event(scene=scene, start=True)
        if scene == "sleep":
            stuck_in_sleep(a.stall_s)
        elif scene == "lock":
            lock, held = threading.Lock(), threading.Event()
            threading.Thread(target=hold_the_lock, args=(lock, a.stall_s, held), name="holder", daemon=True).start()
            held.wait()
            wait_for_lock(lock)
        elif scene == "collective" and collective is not None:
            collective()
        elif scene == "loader" and loader is not None:
            loader()
        event(scene=scene, end=True)
        train(a.train_s)


def plain(a) -> int:
    """The scenes without torch: each step is a little arithmetic and a --step-ms sleep, marked
    with the probe's ``step()`` (already imported by the launcher's sitecustomize)."""
    probe = sys.modules.get("gputop.probe")
    ticker = Ticker(a.ticks)
    ticker.start()
    events = open(a.events, "a") if a.events else None

    def event(**kw) -> None:
        if events is not None:
            events.write(json.dumps({"t": time.monotonic(), "rank": 0, **kw}) + "\n")
            events.flush()

    def train(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(i * i for i in range(a.dim * 32))
            time.sleep(a.step_ms / 1000.0)
            if probe is not None:
                probe.step()

    run_scenes(a, train, event)
    event(scene="done", ticks=ticker.count)
    sys.stdout.flush()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenes", default="sleep,lock")
    ap.add_argument("--stall-s", type=float, default=8.0)
    ap.add_argument("--train-s", type=float, default=4.0)
    ap.add_argument("--first-train-s", type=float, default=None, help="training before the first scene")
    ap.add_argument("--startup-s", type=float, default=0.0)
    ap.add_argument("--plain", action="store_true", help="no torch: marker steps (not with ranks or cuda)")
    ap.add_argument("--step-ms", type=float, default=20.0, help="host time per step on top of the model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--gpu-matmuls", type=int, default=0, help="extra dim x dim matmuls a step (keeps a GPU busy)")
    ap.add_argument("--ticks", default=None)
    ap.add_argument("--events", default=None)
    ap.add_argument("--launch-ranks", type=int, default=0)
    a, rest = ap.parse_known_args()
    if a.launch_ranks:
        argv = [x for x in sys.argv[1:]]
        i = argv.index("--launch-ranks")
        del argv[i:i + 2]
        return launch(a.launch_ranks, argv)
    if a.plain:
        return plain(a)

    import torch

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    dist = None
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = torch.device(a.device if a.device != "cuda" else f"cuda:{rank % max(1, torch.cuda.device_count())}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(a.dim, a.dim), torch.nn.ReLU(), torch.nn.Linear(a.dim, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, a.dim, device=dev), torch.randn(32, 1, device=dev)
    big = torch.randn(a.dim, a.dim, device=dev) if a.gpu_matmuls else None
    ticker = Ticker(f"{a.ticks}.{rank}" if a.ticks and world > 1 else a.ticks)
    ticker.start()
    events = open(a.events, "a") if a.events else None

    def event(**kw) -> None:
        if events is not None:
            events.write(json.dumps({"t": time.monotonic(), "rank": rank, **kw}) + "\n")
            events.flush()

    def step(done: bool = False) -> bool:
        """One step; with ranks, the gradients' all_reduce also carries each rank's "my time is
        up" flag, so every rank takes the same number of steps. True: a rank is done."""
        for _ in range(a.gpu_matmuls):
            big.copy_(torch.tanh(big @ big))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if dist is not None:
            flag = torch.tensor([1.0 if done else 0.0], device=dev)
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()] + [flag])
            dist.all_reduce(flat)  # STALL-ALLREDUCE
            done = bool(flat[-1].item() > 0)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        time.sleep(a.step_ms / 1000.0)
        return done

    def train(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not step(time.monotonic() >= end):
            pass

    def collective() -> None:
        if rank == 1:
            rank_elsewhere(a.stall_s)
        step()   # rank 0 waits in the all_reduce until rank 1 comes

    def loader() -> None:
        class Hung(torch.utils.data.Dataset):
            def __len__(self):
                return 2

            def __getitem__(self, i):
                time.sleep(a.stall_s)  # STALL-LOADER
                return torch.zeros(1)

        it = iter(torch.utils.data.DataLoader(Hung(), batch_size=1, num_workers=2))
        next(it)  # STALL-NEXT
        del it

    run_scenes(a, train, event, collective, loader)
    event(scene="done", ticks=ticker.count)
    if dist is not None:
        dist.destroy_process_group()
    # torch's interpreter teardown takes seconds on a loaded machine: longer than the tests' short
    # stall threshold (the default of 10 s is not reached by it)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
