"""A small CPU training job for the probe tests: it measures itself, so a test can compare the
probe's numbers with the job's own.

Writes a JSON file (--out) with its own counts and timings: steps, batches, samples, the time
it spent blocked in next() on the DataLoader iterator (timed around next(), as a user would),
and its wall time between the first and the last step boundary.

Flags beyond the obvious:
  --wait-monitor S   wait up to S seconds for a probe monitor before training (so every step is
                     inside a monitored window); needs the probe loaded.
  --hold-file PATH   after training, wait until PATH exists (the test has read what it needs).
  --marker           no optimizer: mark steps with gputop.probe.step().
  --install          call gputop.probe.install() (instead of relying on `gputop run`).
  --old-torch        delete torch's register_optimizer_step_post_hook before installing, as a
                     torch older than 2.0 would lack it.
  --break-hook NAME  make the probe's own code for hook NAME raise (fault injection).
  --second-probe     try to install a second copy of the probe module in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--sample-ms", type=float, default=1.0, help="CPU time each sample costs the dataset")
    ap.add_argument("--compute-ms", type=float, default=0.0, help="extra host time per step")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--mp-context", default=None)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--compile-wrap", action="store_true", help="call torch.compile on the model (never run it)")
    ap.add_argument("--marker", action="store_true")
    ap.add_argument("--install", action="store_true")
    ap.add_argument("--old-torch", action="store_true")
    ap.add_argument("--break-hook", default=None)
    ap.add_argument("--second-probe", action="store_true")
    ap.add_argument("--wait-monitor", type=float, default=0.0)
    ap.add_argument("--hold-file", default=None)
    ap.add_argument("--ddp", action="store_true", help="torch.distributed (gloo) from torchrun's environment")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import torch.utils.data as tud

    if args.old_torch:
        import torch.optim.optimizer as optmod
        del optmod.register_optimizer_step_post_hook
    if args.install:
        import gputop.probe
        first = gputop.probe.install()
        assert gputop.probe.install() is first, "install() twice must return the same probe"
    if args.second_probe:
        import importlib.util
        import gputop.probe
        path = os.path.join(os.path.dirname(gputop.probe.__file__), "__init__.py")
        spec = importlib.util.spec_from_file_location("copy_of_gputop_probe", path)
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
        second = copy.install()
        print(json.dumps({"second_probe": second is not None}), file=sys.stderr)
    if args.break_hook:
        import gputop.probe.core as core
        if args.break_hook == "dataloader":
            def broken(*a, **k):
                raise RuntimeError("injected fault in the probe's DataLoader accounting")
            core.Probe.on_batch = broken
        elif args.break_hook == "optimizer_step":
            def broken(*a, **k):
                raise RuntimeError("injected fault in the probe's optimizer accounting")
            core.Probe.on_optimizer_step = broken

    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")

    torch.manual_seed(0)
    kw = {}
    if args.workers:
        kw["persistent_workers"] = args.persistent
        if args.mp_context:
            kw["multiprocessing_context"] = args.mp_context
    loader = tud.DataLoader(Slow(args.sample_ms / 1000.0), batch_size=args.batch_size, num_workers=args.workers, **kw)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    if args.compile_wrap:
        torch.compile(model, mode="reduce-overhead")  # never called: only the call is noted
    opt = None if args.marker else torch.optim.SGD(model.parameters(), lr=0.01)

    if args.wait_monitor:
        import gputop.probe
        deadline = time.monotonic() + args.wait_monitor
        while time.monotonic() < deadline and not gputop.probe.status().get("monitoring"):
            time.sleep(0.05)
    step_fn = None
    if args.marker:
        import gputop.probe
        step_fn = gputop.probe.step

    it = iter(loader)
    steps = batches = samples = 0
    wait = 0.0
    step_times = []
    step_waits = []
    t_first = t_last = None
    last = None
    while steps < args.steps:
        t0 = time.perf_counter()
        x, y = next(it)
        w = time.perf_counter() - t0
        wait += w
        batches += 1
        samples += x.shape[0]
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if args.amp else _null()
        with ctx:
            loss = ((model(x).float() - y) ** 2).mean()
        loss.backward()
        if args.compute_ms:
            end = time.perf_counter() + args.compute_ms / 1000.0
            while time.perf_counter() < end:
                pass
        if opt is not None:
            opt.step()
            opt.zero_grad()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
            step_fn()
        now = time.perf_counter()
        steps += 1
        if last is not None:
            step_times.append(now - last)
            step_waits.append(w)
        else:
            t_first = now
        last = t_last = now
    del it
    result = {
        "pid": os.getpid(), "steps": steps, "batches": batches, "samples": samples, "data_wait_s": wait,
        "wall_s": (t_last - t_first) if steps > 1 else None, "step_times": step_times, "step_waits": step_waits,
        "torch": torch.__version__, "rank": int(os.environ.get("RANK", "-1")),
    }
    if args.ddp:
        out = f"{args.out}.{os.environ.get('RANK', '0')}"
    else:
        out = args.out
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out + ".tmp", out)
    if args.hold_file:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.hold_file) and time.monotonic() < deadline:
            time.sleep(0.05)
    if args.ddp:
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


class Slow:
    """A map-style dataset whose samples cost CPU time, like decoding images (module level so
    spawned workers can unpickle it)."""

    def __init__(self, sample_s: float) -> None:
        self.sample_s = sample_s

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        import torch
        end = time.perf_counter() + self.sample_s
        while time.perf_counter() < end:
            pass
        return torch.ones(16) * (i % 7), torch.ones(1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
