"""What the host source costs: CPU of the sampling, per-tick time, and which calls dominate.

    python benchmarks/host_cost.py OUT_DIR [--procs 10] [--threads 60] [--active 15]
                                           [--seconds 20] [--interval 0.5]

Starts a target: a main Python process with ``--threads`` threads and ``--procs - 1`` child
processes with 2 threads each. ``--active`` of the main process's threads (and every thread of
the children) wake every 10 ms and do ~0.3 ms of work, so CPU times and context switches move;
the other threads block, as most threads of a training process do at any moment (OpenMP pool,
CUDA and pin-memory helpers). ``--active`` equal to ``--threads`` is the worst case: the
source skips re-reading the stat/status of a thread that has not run since the last tick.
Then it runs HostSource at ``--interval`` (default: gputop's default, 0.5 s) for ``--seconds``
in this process, publishing into a real Bus + SampleStore, and reports:

- the sampling's CPU: this process's CPU time delta / wall (everything gputop would pay for
  this source, the store included) and the sampling thread's own CPU time / wall;
- the wall time of one tick: median and p95;
- the split of tick time into phases (system, tree, processes, threads, emit) and a cProfile
  of 40 ticks run afterwards, top functions by own time;
- a side-by-side of three ways to read per-thread CPU times of the main process.

Writes OUT_DIR/host_cost.json and OUT_DIR/host_cost_profile.txt, prints a short table.
Goal (issue 2): the host source at about 1% of one core for ~10 processes and ~60 threads.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import signal
import statistics
import subprocess
import sys
import time

import psutil

from gputop.session.store import Bus, SampleStore
from gputop.sources.host import HostSource
from gputop.sources.target import Target

CHILD = r"""
import threading, time, sys
def work():
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.0003:
            pass
        time.sleep(0.01)
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=work, daemon=True).start()
work()
"""

MAIN = r"""
import subprocess, sys, threading, time
n_procs, n_threads, n_active, child = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
kids = [subprocess.Popen([sys.executable, "-c", child, "2"]) for _ in range(n_procs - 1)]
def work():
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.0003:
            pass
        time.sleep(0.01)
def idle():
    threading.Event().wait()
for i in range(n_threads - 1):
    threading.Thread(target=work if i < n_active else idle, daemon=True).start()
print("ready", flush=True)
try:
    while True:
        time.sleep(1)
finally:
    for k in kids:
        k.kill()
"""


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def compare_thread_reads(pid: int, rounds: int = 50) -> dict:
    """Per-tick cost of three ways to get per-thread CPU times (and names) of one process."""
    proc = psutil.Process(pid)
    base = f"/proc/{pid}/task"

    def psutil_threads():
        proc.threads()

    def open_read():
        for tid in os.listdir(base):
            try:
                with open(f"{base}/{tid}/stat", "rb") as f:
                    f.read()
                with open(f"{base}/{tid}/comm", "rb") as f:
                    f.read()
            except OSError:
                pass

    fds = []
    for tid in os.listdir(base):
        try:
            fds.append(os.open(f"{base}/{tid}/stat", os.O_RDONLY))
        except OSError:
            pass

    def held_pread():
        os.listdir(base)
        for fd in fds:
            try:
                os.pread(fd, 1024, 0)
            except OSError:
                pass

    out = {}
    for name, fn in (("psutil Process.threads()", psutil_threads),
                     ("open+read task/*/stat + comm", open_read),
                     ("held fd, pread task/*/stat", held_pread)):
        fn()
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        out[name] = (time.perf_counter() - t0) / rounds * 1e3
    for fd in fds:
        os.close(fd)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--procs", type=int, default=10, help="processes in the target tree (main + children)")
    ap.add_argument("--threads", type=int, default=60, help="threads of the main process")
    ap.add_argument("--active", type=int, default=15, help="of those, how many wake every 10 ms")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=0.5)
    a = ap.parse_args()
    a.active = min(a.active, a.threads)
    os.makedirs(a.out_dir, exist_ok=True)

    # Its own session, so that the whole tree can be killed at the end.
    target_proc = subprocess.Popen([sys.executable, "-c", MAIN, str(a.procs), str(a.threads), str(a.active), CHILD],
                                   stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if target_proc.stdout.readline().strip() != "ready":
            print("the target did not start", file=sys.stderr)
            return 1
        time.sleep(1.0)
        target = Target(target_proc.pid)
        n_procs = len(target.tree_pids(0))
        n_threads_total = sum(psutil.Process(p).num_threads() for p in target.tree_pids(0))

        bus, store = Bus(), SampleStore()
        bus.subscribe(store)
        clock = Clock()
        src = HostSource(clock, target, interval_s=a.interval)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        src.start(bus.publish)
        time.sleep(a.seconds)
        src.stop()
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0

        ticks = list(src.tick_wall_s)
        phases = {k: v / max(1, src.ticks) * 1e3 for k, v in src.phase_s.items()}

        # Which calls dominate: the same ticks under cProfile, run here synchronously.
        prof_src = HostSource(clock, target, interval_s=a.interval)
        prof_src._emit = bus.publish
        prof_src._tick_guarded()  # warm: opens files, first readings
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(40):
            prof_src._tick_guarded()
            time.sleep(0.01)
        prof.disable()
        prof_src.stop()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        reads = compare_thread_reads(target.pid)

        result = {
            "machine": {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
                        "cpus": os.cpu_count(), "processes_on_host": len(psutil.pids())},
            "config": {"procs": a.procs, "threads_main": a.threads, "active_threads_main": a.active,
                       "seconds": a.seconds, "interval_s": a.interval},
            "tree": {"processes": n_procs, "threads_total": n_threads_total},
            "ticks": src.ticks,
            "process_cpu_pct_of_core": round(100 * cpu / wall, 3),
            "sampling_thread_cpu_pct_of_core": round(100 * src.cpu_s / wall, 3),
            "tick_ms_median": round(statistics.median(ticks) * 1e3, 3) if ticks else None,
            "tick_ms_p95": round(pct(ticks, 0.95) * 1e3, 3) if ticks else None,
            "phase_ms_per_tick": {k: round(v, 3) for k, v in phases.items()},
            "thread_read_ms_per_tick": {k: round(v, 3) for k, v in reads.items()},
            "samples_in_store": {k: len(store.keys(k)) for k in store.kinds()},
            "cgroup": src.describe()["cgroup"],
            "last_system_sample": dict(store.latest("system", "host").data) if store.latest("system", "host") else None,
        }
        with open(os.path.join(a.out_dir, "host_cost.json"), "w") as f:
            json.dump(result, f, indent=2)
        with open(os.path.join(a.out_dir, "host_cost_profile.txt"), "w") as f:
            f.write(buf.getvalue())

        print(f"host source cost  ({result['machine']['cpus']} CPUs, {result['machine']['processes_on_host']} processes "
              f"on the host, Python {result['machine']['python']})")
        print(f"  target tree            {n_procs} processes, {n_threads_total} threads "
              f"({a.threads} in the main process, {a.active} of them active)")
        print(f"  interval               {a.interval} s (jittered), {src.ticks} ticks in {wall:.1f} s")
        print(f"  process CPU / wall     {result['process_cpu_pct_of_core']:.2f}% of one core")
        print(f"  sampling thread CPU    {result['sampling_thread_cpu_pct_of_core']:.2f}% of one core")
        print(f"  tick wall time         median {result['tick_ms_median']:.2f} ms, p95 {result['tick_ms_p95']:.2f} ms")
        print("  phases (ms per tick)   " + ", ".join(f"{k} {v:.2f}" for k, v in result["phase_ms_per_tick"].items()))
        cg = result["cgroup"]
        print(f"  cgroup found           {cg.get('version')} cpu={cg.get('cpu_limit_dir')} "
              f"limit={cg.get('cpu_limit')} mem={cg.get('memory_dir')} {cg.get('problem') or ''}")
        print("  per-thread CPU reads of the main process (ms per tick):")
        for k, v in result["thread_read_ms_per_tick"].items():
            print(f"    {k:32s} {v:.3f}")
        print("  top functions by own time (40 ticks under cProfile):")
        lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
        start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), len(lines))
        for ln in lines[start:start + 9]:
            print("    " + ln.strip()[:110])
        return 0
    finally:
        try:
            os.killpg(target_proc.pid, signal.SIGKILL)
        except OSError:
            pass
        target_proc.wait()


if __name__ == "__main__":
    sys.exit(main())
