"""The bundled demo workloads: small training loops with a known character.

Run as a child process by ``gputop demo`` (``python -m gputop.demo.workload --scenario NAME``).
It imports only the standard library and, when installed, torch — like a user's script would.
It uses the GPU when torch sees one, else the CPU; without torch, a pure-Python loop.

Every workload prints one line per ``--report-every`` seconds to stdout: its own measured
steps/s (``rate <steps_per_s> <total_steps>``), so benchmarks can compare gputop's numbers
with the workload's own.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _report(steps: int, t0: float, last: list, every: float) -> None:
    now = time.perf_counter()
    if now - last[0] >= every:
        dt = now - last[0]
        print(f"rate {(steps - last[1]) / dt:.3f} {steps}", flush=True)
        last[0], last[1] = now, steps


def pure_python(duration: float, every: float) -> None:
    """No torch: a CPU-bound Python loop (the GPU panel will say n/a, the host panel works)."""
    t0 = time.perf_counter()
    last = [t0, 0]
    steps = 0
    while time.perf_counter() - t0 < duration:
        acc = 0
        for i in range(20000):
            acc += i * i % 7
        steps += 1
        _report(steps, t0, last, every)


def torch_train(duration: float, every: float, device_name: str | None = None) -> None:
    """A small MLP trained on synthetic data through a DataLoader with two workers."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    width = 2048 if device.type == "cuda" else 256

    class Synthetic(Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.randn(width, generator=g), torch.randint(0, 10, (), generator=g)

    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Synthetic(), batch_size=64, num_workers=2, pin_memory=device.type == "cuda",
                        persistent_workers=True)
    t0 = time.perf_counter()
    last = [t0, 0]
    steps = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        _report(steps, t0, last, every)
        if time.perf_counter() - t0 >= duration:
            break


SCENARIOS = {
    "default": "a small MLP trained through a DataLoader with 2 workers (GPU if present, else CPU)",
    "python": "a pure-Python CPU loop (no torch needed)",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gputop.demo.workload")
    p.add_argument("--scenario", default="default", choices=sorted(SCENARIOS))
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--report-every", type=float, default=1.0)
    p.add_argument("--device", default=None)
    a = p.parse_args(argv)
    try:
        if a.scenario == "python":
            pure_python(a.duration, a.report_every)
            return 0
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: running the pure-Python loop instead", file=sys.stderr, flush=True)
            pure_python(a.duration, a.report_every)
            return 0
        torch_train(a.duration, a.report_every, a.device)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # gputop went away: stop quietly.
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
