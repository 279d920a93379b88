"""What watching costs: gputop's own CPU, the target's slowdown, and the recording's size.

    python benchmarks/monitor_cost.py OUTDIR [--scenario default] [--window 8] [--alternations 3]
                                             [--gputop-args "--no-stacks"] [--label NAME]

Starts a bundled workload (``python -m gputop.demo.workload``, which prints its own steps/s
every 0.5 s), then alternates windows without and with ``gputop --pid W --headless`` attached,
side by side in one run. For each attached window it measures the CPU time of gputop's whole
process tree (gputop plus its py-spy children) and the size of the recording it wrote.
Prints a table and writes OUTDIR/monitor_cost-<label>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time

import psutil


class RateReader(threading.Thread):
    """Collects the workload's own 'rate <steps/s> <total>' lines with the time they arrived."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(daemon=True)
        self.proc = proc
        self.rates: list[tuple[float, float]] = []

    def run(self):
        for line in self.proc.stdout:
            bits = line.split()
            if len(bits) == 3 and bits[0] == "rate":
                self.rates.append((time.monotonic(), float(bits[1])))

    def between(self, t0: float, t1: float) -> list[float]:
        return [r for t, r in self.rates if t0 <= t <= t1]


def tree_cpu_seconds(root: psutil.Process, seen: dict[int, float]) -> float:
    """Cumulative CPU seconds of root and its descendants, remembering processes that exited."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = []
    for p in procs:
        try:
            ct = p.cpu_times()
            seen[p.pid] = max(seen.get(p.pid, 0.0), ct.user + ct.system)
        except psutil.Error:
            pass
    return sum(seen.values())


def attached_window(pid: int, seconds: float, outdir: str, extra: list[str], n: int) -> dict:
    rec = os.path.join(outdir, f"window-{n}.gtrec")
    if os.path.exists(rec):
        os.remove(rec)
    cmd = [sys.executable, "-m", "gputop", "--pid", str(pid), "--headless", "--duration", str(seconds),
           "--record", rec, "--json", *extra]
    t0 = time.monotonic()
    g = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    gp = psutil.Process(g.pid)
    seen: dict[int, float] = {}
    readings: list[tuple[float, float]] = []
    while g.poll() is None:
        readings.append((time.monotonic() - t0, tree_cpu_seconds(gp, seen)))
        time.sleep(0.25)
    out, err = g.communicate()
    wall = time.monotonic() - t0
    # Steady state only: start-up (imports, NVML init) and the report at the end are one-off
    # costs, so the rate is the slope between 2 s after start and the last reading while sampling.
    steady = [(t, c) for t, c in readings if 2.0 <= t <= seconds + 0.5]
    cpu_pct = None
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        cpu_pct = 100.0 * (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
    cpu = sum(seen.values())
    size = os.path.getsize(rec) if os.path.exists(rec) else None
    return {"wall_s": wall, "cpu_s_total": cpu, "cpu_pct_of_core": cpu_pct,
            "record_bytes": size, "record_mb_per_min": (size / 1e6) / (wall / 60.0) if size else None,
            "returncode": g.returncode, "stderr_tail": err[-600:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--gputop-args", default="")
    ap.add_argument("--label", default=None)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    label = a.label or a.scenario
    extra = shlex.split(a.gputop_args)

    w = subprocess.Popen([sys.executable, "-m", "gputop.demo.workload", "--scenario", a.scenario,
                          "--report-every", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    reader = RateReader(w)
    reader.start()
    rows = []
    try:
        time.sleep(a.warmup)
        for i in range(a.alternations):
            t0 = time.monotonic()
            time.sleep(a.window)
            free = reader.between(t0 + 1.0, time.monotonic())
            t0 = time.monotonic()
            att = attached_window(w.pid, a.window, a.outdir, extra, i)
            watched = reader.between(t0 + 1.5, time.monotonic())  # skip attach start-up
            rows.append({"free_rate": statistics.mean(free) if free else None,
                         "watched_rate": statistics.mean(watched) if watched else None, **att})
    finally:
        w.terminate()
        w.wait(timeout=10)

    slow = [100.0 * (1 - r["watched_rate"] / r["free_rate"]) for r in rows if r["free_rate"] and r["watched_rate"]]
    cpu = [r["cpu_pct_of_core"] for r in rows if r["cpu_pct_of_core"] is not None]
    mbpm = [r["record_mb_per_min"] for r in rows if r["record_mb_per_min"]]
    summary = {
        "label": label, "scenario": a.scenario, "gputop_args": extra, "window_s": a.window,
        "cpu_count": os.cpu_count(),
        "slowdown_pct_each": [round(x, 2) for x in slow],
        "slowdown_pct_mean": round(statistics.mean(slow), 2) if slow else None,
        "gputop_cpu_pct_each": [round(x, 2) for x in cpu],
        "gputop_cpu_pct_mean": round(statistics.mean(cpu), 2) if cpu else None,
        "record_mb_per_min_mean": round(statistics.mean(mbpm), 3) if mbpm else None,
        "windows": rows,
    }
    with open(os.path.join(a.outdir, f"monitor_cost-{label}.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"\nmonitor_cost [{label}] scenario={a.scenario} gputop {' '.join(extra) or '(defaults)'}")
    print(f"{'window':>6} {'free steps/s':>13} {'watched':>9} {'slowdown':>9} {'gputop CPU':>11} {'MB/min':>7}")
    for i, r in enumerate(rows):
        sd = 100.0 * (1 - r['watched_rate'] / r['free_rate']) if r['free_rate'] and r['watched_rate'] else float('nan')
        print(f"{i:>6} {r['free_rate'] or float('nan'):>13.2f} {r['watched_rate'] or float('nan'):>9.2f} "
              f"{sd:>8.2f}% {r['cpu_pct_of_core'] or float('nan'):>10.2f}% {r['record_mb_per_min'] or float('nan'):>7.3f}")
        if r["returncode"] != 0:
            print(f"       gputop exited {r['returncode']}: {r['stderr_tail'].strip().splitlines()[-1:]}")
    print(f"mean slowdown {summary['slowdown_pct_mean']}%  gputop CPU {summary['gputop_cpu_pct_mean']}% of one core  "
          f"recording {summary['record_mb_per_min_mean']} MB/min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
