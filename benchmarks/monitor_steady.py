"""What watching costs in steady state: every monitor started once, side by side on one target,
measured together after a long settle (a job watched for hours costs what it costs then).

    python benchmarks/monitor_steady.py OUTDIR [--scenario gpu_bound] [--settle 100] [--window 15]
                                        [--windows 6] [--monitors nvitop,nvitop_fast,headless,ui]
                                        [--before TREE]

benchmarks/monitor_cost.py starts each monitor anew for each of its alternated windows, so its
settle (28 s on the H200) must fit ten minutes a command for four monitors and three rounds; it
measures gputop before its calm state (gputop/sources/calm.py: one phase, no verdict change and
no stall for a minute, after which py-spy samples at 10 Hz and NVML at 5 Hz). This one starts
every monitor at once (nvitop and the UI in 120x40 ptys, headless recording to OUTDIR), waits
``--settle`` seconds, then measures every monitor's whole process tree (py-spy's windows
included) over the same ``--windows`` consecutive windows: the same target, the same load, the
same seconds for all. ``--before TREE`` adds ``headless_before``: the headless gputop of another
checkout (``git worktree add TREE REV``), run from TREE, for a before/after in the same windows.

The target's steps/s is measured in a window before any monitor starts and during the measured
windows (all monitors together), so the table's slowdown is that of all of them at once.
Afterwards the headless recording says whether the stack source and NVML were calm in the
measured windows (their health samples' ``calm``). Writes OUTDIR/monitor_steady-<label>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from monitor_cost import MONITORS, PTY_COLS, PTY_ROWS, Pty, RateReader, monitor_command, tree_cpu_seconds  # noqa: E402

TITLES = {"headless": "gputop --pid P --headless", "headless_before": "gputop --headless (--before)",
          "ui": "gputop --pid P (UI, 120x40)", "nvitop": "nvitop (default interval)",
          "nvitop_fast": "nvitop --interval 0.25"}


def _start(name: str, pid: int, outdir: str, before: str | None) -> tuple:
    """(process or None when not installed, its pty or None, its recording or None)."""
    base = "headless" if name == "headless_before" else name
    cmd, rec = monitor_command(base, pid, outdir, 0 if name == "headless" else 1, [])
    if cmd is None:
        return None, None, None
    env = dict(os.environ)
    cwd = None
    if name == "headless_before":
        # first, before this checkout (and whatever else the environment needs: the H200's wheels)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (before, env.get("PYTHONPATH")) if x)
        cwd = before
    pty = Pty() if base != "headless" else None
    if pty is not None:
        env.update(TERM="xterm-256color", COLUMNS=str(PTY_COLS), LINES=str(PTY_ROWS))
        g = subprocess.Popen(cmd, stdin=pty.slave, stdout=pty.slave, stderr=pty.slave, env=env, cwd=cwd,
                             start_new_session=True, preexec_fn=pty.preexec, close_fds=True)
    else:
        g = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env, cwd=cwd, start_new_session=True)
    return g, pty, rec


def _calm_share(rec: str, t0: float, t1: float) -> dict:
    """The share of health samples in [t0, t1] (session time) that say calm, per source."""
    from gputop.session.recording_reader import RecordingReader

    out: dict = {}
    try:
        with RecordingReader(rec) as r:
            for s in r.samples():
                if s.kind == "health" and s.key in ("stacks", "nvml") and t0 <= s.t <= t1 and "calm" in s.data:
                    n, k = out.get(s.key, (0, 0))
                    out[s.key] = (n + 1, k + bool(s.data["calm"]))
    except Exception as e:  # the table says so; the CPU figures stand
        return {"error": f"{type(e).__name__}: {e}"}
    return {key: round(k / n, 3) for key, (n, k) in out.items() if n}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--scenario", default="gpu_bound")
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds of the target alone before the free window")
    ap.add_argument("--free", type=float, default=15.0, help="the window of the target alone")
    ap.add_argument("--settle", type=float, default=100.0)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--monitors", default="nvitop,nvitop_fast,headless,ui")
    ap.add_argument("--before", default=None, metavar="TREE")
    ap.add_argument("--label", default=None)
    a = ap.parse_args()
    names = [m.strip() for m in a.monitors.split(",") if m.strip()]
    bad = [m for m in names if m not in MONITORS]
    if bad or not names:
        print(f"monitor_steady: unknown monitor {', '.join(bad) or '(none)'}; choose from {', '.join(MONITORS)}",
              file=sys.stderr)
        return 2
    if a.before:
        if not os.path.isdir(os.path.join(a.before, "gputop")):
            print(f"monitor_steady: --before {a.before} holds no gputop/ package", file=sys.stderr)
            return 2
        names.append("headless_before")
    os.makedirs(a.outdir, exist_ok=True)
    label = a.label or a.scenario

    w = subprocess.Popen([sys.executable, "-m", "gputop.demo.workload", "--scenario", a.scenario,
                          "--report-every", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    reader = RateReader(w)
    reader.start()
    started: dict = {}
    windows: list[dict] = []
    try:
        time.sleep(a.warmup)
        f0 = time.monotonic()
        time.sleep(a.free)
        free = reader.between(f0 + 1.0, time.monotonic())
        for name in names:
            started[name] = (_start(name, w.pid, a.outdir, a.before), time.monotonic())
        time.sleep(a.settle)
        procs = {n: psutil.Process(g.pid) for n, ((g, _p, _r), _t) in started.items() if g is not None}
        prev = {n: tree_cpu_seconds(p) for n, p in procs.items()}
        t_prev = time.monotonic()
        t_first = t_prev
        for _ in range(a.windows):
            time.sleep(a.window)
            now = time.monotonic()
            cur = {n: tree_cpu_seconds(p) for n, p in procs.items()}
            windows.append({n: (round(100.0 * (cur[n] - prev[n]) / (now - t_prev), 3)
                                if cur[n] is not None and prev[n] is not None else None) for n in procs})
            prev, t_prev = cur, now
        watched = reader.between(t_first, t_prev)
    finally:
        for name, ((g, pty, _rec), _t) in started.items():
            if g is None:
                continue
            if g.poll() is None:
                g.send_signal(signal.SIGTERM)
        for name, ((g, pty, _rec), _t) in started.items():
            if g is None:
                continue
            try:
                g.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(g.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if pty is not None:
                pty.close()
        w.terminate()
        w.wait(timeout=10)

    # session time of the measured windows in the headless recordings: their session began at
    # their start (SessionClock), so the windows are [settle, settle + windows x window]
    summary = {"label": label, "scenario": a.scenario, "settle_s": a.settle, "window_s": a.window,
               "windows": a.windows, "cpu_count": os.cpu_count(), "before": a.before,
               "free_rate": statistics.mean(free) if free else None,
               "watched_rate": statistics.mean(watched) if watched else None, "monitors": {}}
    fr, wr = summary["free_rate"], summary["watched_rate"]
    summary["slowdown_all_pct"] = round(100.0 * (1 - wr / fr), 2) if fr and wr else None
    for name in names:
        (g, _pty, rec), t_start = started.get(name, ((None, None, None), None))
        each = [win.get(name) for win in windows]
        row = {"missing": g is None, "cpu_pct_each": each,
               "cpu_pct_mean": round(statistics.mean([x for x in each if x is not None]), 2)
               if any(x is not None for x in each) else None,
               "returncode": g.returncode if g is not None else None}
        if rec is not None:
            row["calm_share"] = _calm_share(rec, a.settle, a.settle + a.windows * a.window)
        summary["monitors"][name] = row
    with open(os.path.join(a.outdir, f"monitor_steady-{label}.json"), "w") as f:
        json.dump(summary, f, indent=2)

    print(f"\nmonitor_steady [{label}] {a.scenario}: all monitors at once, measured from {a.settle:g} s after their "
          f"start over {a.windows} windows of {a.window:g} s; steps/s alone {fr or 0:.2f}, watched by all "
          f"{wr or 0:.2f} ({summary['slowdown_all_pct']}%)")
    print(f"{'monitor':<32} {'CPU of one core':>16}   each window")
    for name, m in summary["monitors"].items():
        if m["missing"]:
            print(f"{TITLES[name]:<32} {'not installed':>16}")
            continue
        each = " ".join("-" if x is None else f"{x:.2f}" for x in m["cpu_pct_each"])
        mean = f"{m['cpu_pct_mean']:.2f}%" if m["cpu_pct_mean"] is not None else "no reading"
        calm = f"   calm {m['calm_share']}" if "calm_share" in m else ""
        print(f"{TITLES[name]:<32} {mean:>16}   {each}{calm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
