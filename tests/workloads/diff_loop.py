"""A small CPU training loop for the `gputop diff` tests: an MLP fed by a DataLoader whose
batches sleep (an input pipeline waiting on storage), so the step rate depends on num_workers and
hardly on how busy the shared test machine's CPUs are (one wake-up per batch, little CPU).

    python diff_loop.py --workers 3 --batch-ms 150 --seconds 60 --ready FILE --stop FILE

It loads gputop's probe itself (so `gputop --pid` attaches to a loop already past its imports),
writes --ready after its first 5 steps, and ends when --stop exists or --seconds have passed.
"""

from __future__ import annotations

import argparse
import time

import os

import torch
from torch.utils.data import DataLoader, Dataset


class SleepyBatches(Dataset):
    """Each item is a whole batch (the loader's batch_size=None): one read per batch."""

    def __init__(self, batch_ms: float):
        self.batch_s = batch_ms / 1000.0

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        time.sleep(self.batch_s)  # a read from slow storage: wall time, hardly any CPU
        return torch.full((8, 64), float(i % 7)), torch.full((8,), i % 4, dtype=torch.long)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-ms", type=float, default=150.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--ready", default=None)
    ap.add_argument("--stop", default=None)
    a = ap.parse_args()
    import gputop.probe

    gputop.probe.install()
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(SleepyBatches(a.batch_ms), batch_size=None, num_workers=a.workers,
                        persistent_workers=a.workers > 0)
    end = time.monotonic() + a.seconds
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step == 5 and a.ready:
            with open(a.ready, "w") as f:
                f.write(str(os.getpid()))
        if time.monotonic() >= end or (step % 10 == 0 and a.stop and os.path.exists(a.stop)):
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
