"""A long-running loop that prints its own step rate, for benchmarks/stacks_overhead.py.

Every ``--every`` seconds: one JSON line {"mono": CLOCK_MONOTONIC s, "steps": cumulative steps}.
Modes:
  launch       many tiny torch CPU ops per step (launch/dispatch-bound, like a small model)
  python       pure-Python arithmetic
  gpu          bf16 8192x8192 matmuls on CUDA, synchronized every step (GPU-bound)
  cuda-launch  many tiny CUDA kernels per step, synchronized (launch-bound on a GPU)
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="launch", choices=("launch", "python", "gpu", "cuda-launch"))
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    a = ap.parse_args()
    step = None
    if a.mode != "python":
        import torch
        torch.set_num_threads(a.threads)
        if a.mode == "launch":
            x = torch.randn(64)

            def step():
                y = x
                for _ in range(50):
                    y = y * 1.0001 + 0.5
                return y
        elif a.mode == "gpu":
            m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

            def step():
                for _ in range(4):
                    m @ m
                torch.cuda.synchronize()
        else:
            x = torch.randn(64, device="cuda")

            def step():
                y = x
                for _ in range(100):
                    y = y * 1.0001 + 0.5
                torch.cuda.synchronize()
    else:
        def step():
            s = 0
            for i in range(2000):
                s += i
            return s
    steps = 0
    t_end = time.monotonic() + a.duration
    nxt = time.monotonic()
    while True:
        step()
        steps += 1
        now = time.monotonic()
        if now >= nxt:
            sys.stdout.write(json.dumps({"mono": now, "steps": steps}) + "\n")
            sys.stdout.flush()
            nxt += a.every
            if nxt < now:
                nxt = now + a.every
            if now >= t_end:
                break


if __name__ == "__main__":
    main()
