"""A GIL ground-truth workload for the stack source's tests and benchmarks/gil_accuracy.py.

The main thread does pure-Python work beside ``--spinners`` pure-Python spinner threads,
an optional ``--sleeper`` (time.sleep(0.05) in a loop) and ``--hashers`` threads that hash a
large buffer with hashlib (which releases the GIL while it hashes).

Every ``--every`` seconds the main thread prints one JSON line of *cumulative* counters per
thread, read at that instant, so a caller can compute the truth over any window [a, b]:

    {"mono": CLOCK_MONOTONIC seconds, "threads": {"main": {"tid", "cpu", "runq", "thread_time",
     "overshoot", "sleeps"}, "spinner0": {...}, ...}}

- ``cpu`` and ``runq``: seconds on a CPU and waiting on the run queue (/proc/self/task/TID/schedstat);
- ``thread_time``: time.thread_time() of the main thread (the issue's check: GIL wait ~
  (wall - thread_time) / wall, which on a busy machine also includes run-queue time);
- ``overshoot`` (sleeper): total time its sleeps took beyond what was asked: after a sleep
  ends the thread must retake the GIL, so this is its GIL wait (plus run-queue time and
  timer slack, both reported).

For a thread that never blocks on anything else (main, spinners, hashers), the true GIL wait
over [a, b] is (wall - d_cpu - d_runq) / wall; for the sleeper it is (d_overshoot - d_runq) / wall.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time

STATE: dict[str, dict] = {}


def schedstat(tid: int) -> tuple[float, float]:
    with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
        parts = f.read().split()
    return int(parts[0]) / 1e9, int(parts[1]) / 1e9


def register(name: str) -> dict:
    d = STATE[name] = {"tid": threading.get_native_id(), "overshoot": 0.0, "sleeps": 0}
    return d


def spinner(name: str) -> None:
    register(name)
    x = 0
    while True:
        x += 1


def sleeper(name: str, nap: float) -> None:
    d = register(name)
    while True:
        t = time.monotonic()
        time.sleep(nap)
        d["overshoot"] += time.monotonic() - t - nap
        d["sleeps"] += 1


def hasher(name: str, size: int) -> None:
    register(name)
    buf = os.urandom(1 << 20) * (size >> 20)
    while True:
        hashlib.sha256(buf).digest()


def snapshot(main: dict) -> dict:
    main["thread_time"] = time.thread_time()
    out = {}
    for name, d in list(STATE.items()):
        try:
            cpu, runq = schedstat(d["tid"])
        except OSError:
            continue
        out[name] = {**d, "cpu": cpu, "runq": runq}
    return {"mono": time.monotonic(), "pid": os.getpid(), "threads": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spinners", type=int, default=0)
    ap.add_argument("--sleeper", action="store_true")
    ap.add_argument("--hashers", type=int, default=0)
    ap.add_argument("--hash-mb", type=int, default=32)
    ap.add_argument("--nap", type=float, default=0.05)
    ap.add_argument("--every", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=600.0)
    # (a target that only has to be there -- a source's schedule under test, not what it reads --
    # need not burn a core of the suite's two: the main thread sleeps between its lines)
    ap.add_argument("--idle-main", action="store_true")
    a = ap.parse_args()
    md = register("main")
    for i in range(a.spinners):
        threading.Thread(target=spinner, args=(f"spinner{i}",), name=f"spinner{i}", daemon=True).start()
    if a.sleeper:
        threading.Thread(target=sleeper, args=("sleeper", a.nap), name="sleeper", daemon=True).start()
    for i in range(a.hashers):
        threading.Thread(target=hasher, args=(f"hasher{i}", a.hash_mb << 20), name=f"hasher{i}", daemon=True).start()
    time.sleep(0.2)  # let every thread register before the first line
    t_end = time.monotonic() + a.duration
    next_report = time.monotonic()
    x = 0
    while True:
        if a.idle_main:
            time.sleep(max(0.0, next_report - time.monotonic()))
        for i in range(2000):  # ~0.1 ms of pure-Python work between clock checks
            x += i
        now = time.monotonic()
        if now >= next_report:
            sys.stdout.write(json.dumps(snapshot(md)) + "\n")
            sys.stdout.flush()
            next_report = now + a.every
            if now >= t_end:
                break


if __name__ == "__main__":
    main()
