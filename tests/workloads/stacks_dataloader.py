"""A DataLoader-bound training loop that measures its own time in next(iterator).

Used by tests/test_threads_live.py and benchmarks/gil_accuracy.py (data-wait accuracy).
Each sample costs ``--sample-ms`` of CPU in a worker; each step costs ``--step-ms`` of work in
the main thread (small torch ops), then ``--gpu-matmuls`` big matmuls are queued on the GPU and
(``--sync``) ``loss.item()`` waits for them. Every ``--every`` seconds it prints one JSON line of cumulative counters:

    {"mono": CLOCK_MONOTONIC s, "pid": ..., "steps": n, "next_s": time inside next(it),
     "sync_s": time inside .item()}

so the truth over a window [a, b] is d(next_s) / (b - a) for data wait, d(sync_s) / (b - a) for
sync wait. ``--device cuda`` runs the model on the GPU (benchmarks on the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class BusyDataset(Dataset):
    def __init__(self, n: int, sample_ms: float, dim: int):
        self.n, self.sample_s, self.dim = n, sample_ms / 1000.0, dim

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        end = time.perf_counter() + self.sample_s
        x = 0
        while time.perf_counter() < end:  # decode/augment stand-in: pure CPU in the worker
            x += 1
        return torch.full((self.dim,), float(i % 7)), i % 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sample-ms", type=float, default=2.0)
    ap.add_argument("--step-ms", type=float, default=8.0)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sync", action="store_true", help="call loss.item() every step")
    ap.add_argument("--gpu-matmuls", type=int, default=0,
                    help="queue this many 4096x4096 bf16 matmuls per step before .item() (CUDA)")
    ap.add_argument("--every", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=600.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device(a.device)
    model = torch.nn.Sequential(torch.nn.Linear(a.dim, a.dim), torch.nn.ReLU(), torch.nn.Linear(a.dim, 3)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(BusyDataset(10**9, a.sample_ms, a.dim), batch_size=a.batch, num_workers=a.workers,
                        persistent_workers=a.workers > 0, shuffle=False)
    big = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) if a.gpu_matmuls else None
    it = iter(loader)
    next_s = sync_s = 0.0
    steps = 0
    t_end = time.monotonic() + a.duration
    next_report = 0.0
    while True:
        t = time.monotonic()
        x, y = next(it)
        next_s += time.monotonic() - t
        x, y = x.to(dev), y.to(dev)
        end = time.perf_counter() + a.step_ms / 1000.0
        while True:  # the step: forward/backward of a tiny model until step-ms is spent
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if time.perf_counter() >= end:
                break
        for _ in range(a.gpu_matmuls):  # GPU work the .item() below has to wait for
            big = (big @ big) * 1e-3
        if a.sync:
            t = time.monotonic()
            loss.item()
            sync_s += time.monotonic() - t
        steps += 1
        now = time.monotonic()
        if now >= next_report:
            sys.stdout.write(json.dumps({"mono": now, "pid": os.getpid(), "steps": steps,
                                         "next_s": next_s, "sync_s": sync_s}) + "\n")
            sys.stdout.flush()
            next_report = now + a.every
            if now >= t_end:
                break


if __name__ == "__main__":
    main()
