"""What every corpus job shares: its command line, its device and its own step meter.

A corpus job is a small, realistic training script with one known cause of lost time (or, for a
healthy job, a trap that costs nothing) and a one-line fix behind ``--fixed``. It runs on the GPU
when there is one and, much smaller, on the CPU (CI smoke-runs a few). It prints, like the demo
workloads, ``rate <steps_per_s> <total_steps>`` every ``--report-every`` seconds from its own step
count (then the seconds since its first step), and ``done <steps> <seconds>`` at the end, so
benchmarks/corpus_run.py measures the gain of the fix from the job's own numbers, never from
gputop's.

It trains for ``--seconds`` after its first step (start-up is not counted) and then exits by
itself, so a recording made with ``gputop run`` ends with the job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# Jobs build every model from a config and every batch from random numbers: nothing is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse(description: str, extra=None) -> argparse.Namespace:
    """The job's command line: ``--fixed`` (apply the one-line fix), ``--seconds`` of training,
    ``--report-every``; ``extra(parser)`` adds the job's own options."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--fixed", action="store_true", help="apply the job's one-line fix")
    p.add_argument("--seconds", type=float, default=14.0, help="seconds of training after the first step")
    p.add_argument("--report-every", type=float, default=0.5)
    if extra is not None:
        extra(p)
    return p.parse_args()


def torch_and_device():
    import torch

    return torch, torch.device("cuda" if torch.cuda.is_available() else "cpu")


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def pick(gpu_value, cpu_value):
    """A size for the GPU (an H200) or for a laptop's CPU."""
    return gpu_value if on_gpu() else cpu_value


class Meter:
    """The job's own steps/s. ``step()`` counts one optimizer step (or one inference batch) and
    returns False once ``seconds`` have passed since the first one."""

    def __init__(self, seconds: float, every: float = 0.5):
        self.seconds, self.every = seconds, every
        self.t0 = self.last_t = None
        self.steps = self.last_steps = 0

    def step(self) -> bool:
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = self.last_t = now
            print(f"first_step {time.time():.3f}", flush=True)
        self.steps += 1
        if now - self.last_t >= self.every:
            print(f"rate {(self.steps - self.last_steps) / (now - self.last_t):.3f} {self.steps} {now - self.t0:.3f}",
                  flush=True)
            self.last_t, self.last_steps = now, self.steps
        return now - self.t0 < self.seconds

    def pause(self) -> None:
        """Stop the clock (an evaluation): the job's rate is its training throughput."""
        self._paused_at = time.perf_counter()

    def resume(self) -> None:
        paused = getattr(self, "_paused_at", None)
        if paused is not None and self.t0 is not None:
            gap = time.perf_counter() - paused
            self.t0 += gap
            self.last_t += gap
        self._paused_at = None

    def done(self) -> None:
        if self.t0 is not None:
            print(f"done {self.steps} {time.perf_counter() - self.t0:.3f}", flush=True)
        sys.stdout.flush()


def forever(loader):
    """Batches of ``loader`` epoch after epoch (a job stops on its meter, not on its data)."""
    while True:
        yield from loader
