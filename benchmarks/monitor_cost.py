"""What watching costs: each monitor's CPU (its whole process tree) and the target's slowdown,
side by side in one run, conditions alternated; and the size of gputop's recording.

    python benchmarks/monitor_cost.py OUTDIR [--scenario default] [--window 8] [--alternations 3]
                                             [--monitors headless] [--settle 3]
                                             [--gputop-args "--no-stacks"] [--label NAME]

Starts a bundled workload (``python -m gputop.demo.workload``, which prints its own steps/s
every 0.5 s), then, ``--alternations`` times, a window without any monitor followed by one
window per monitor of ``--monitors`` (a comma-separated list; the order rotates each round so
no monitor always comes after the same one):

- ``headless``: ``gputop --pid W --headless`` (recording to OUTDIR; its MB/min is printed);
- ``ui``: ``gputop --pid W``, the Textual UI, in a pty of 120x40;
- ``nvitop``: nvitop at its default interval, in a pty of 120x40;
- ``nvitop_fast``: ``nvitop --interval 0.25``, in a pty of 120x40.

A monitor's CPU is the slope of its tree's CPU seconds (the monitor, its live descendants and
every descendant it reaped: py-spy's windows) between ``--settle`` s after its start (imports,
NVML init) and the end of the window, in % of one core. A monitor that is not installed, or
that exits early (nvitop without an NVIDIA driver), is a row that says so, not a failure.
Prints a table and writes OUTDIR/monitor_cost-<label>.json.

The issue-14 run on the H200 (nvitop's wheel shipped with the tree):

    python3 benchmarks/monitor_cost.py OUT --scenario gpu_bound --window 12 --alternations 3 \\
        --monitors nvitop,nvitop_fast,headless,ui --settle 4 --label monitors-gpu_bound
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time

import psutil

MONITORS = ("headless", "ui", "nvitop", "nvitop_fast")
PTY_COLS, PTY_ROWS = 120, 40


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


def tree_cpu_seconds(root: psutil.Process) -> float | None:
    """CPU seconds of root's whole tree so far: every live process of it (itself and the
    children it reaped) — a descendant that exited and was reaped is in its parent's count."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            if p is root:
                return None
    return total


def nvitop_command() -> list[str] | None:
    if importlib.util.find_spec("nvitop") is not None:
        return [sys.executable, "-m", "nvitop"]
    exe = shutil.which("nvitop")
    return [exe] if exe else None


def monitor_command(name: str, pid: int, outdir: str, n: int, extra: list[str]) -> tuple[list[str] | None, str | None]:
    """(command line, recording path) of one monitor; None when it is not installed."""
    if name == "headless":
        rec = os.path.join(outdir, f"window-{n}.gtrec")
        if os.path.exists(rec):
            os.remove(rec)
        return [sys.executable, "-m", "gputop", "--pid", str(pid), "--headless", "--duration", "3600",
                "--record", rec, *extra], rec
    if name == "ui":
        return [sys.executable, "-m", "gputop", "--pid", str(pid), *extra], None
    nv = nvitop_command()
    if nv is None:
        return None, None
    return (nv + (["--interval", "0.25"] if name == "nvitop_fast" else [])), None


class Pty:
    """A pseudo-terminal of 120x40 for a full-screen program, its output read and thrown away
    on a thread (a terminal nobody reads blocks the program once its buffer is full)."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", PTY_ROWS, PTY_COLS, 0, 0))
        self.bytes = 0
        self.tail = b""
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.bytes += len(chunk)
            self.tail = (self.tail + chunk)[-4000:]

    def preexec(self) -> None:
        """In the child, after setsid: the pty becomes its controlling terminal."""
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    def close(self) -> None:
        for fd in (self.slave, self.master):
            try:
                os.close(fd)
            except OSError:
                pass


def _text_tail(raw: bytes) -> str:
    """The first readable words of what a program wrote to its terminal (escape sequences dropped)."""
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b.", "", raw.decode("utf-8", "replace"))
    return " ".join(text.split())[:200]


def monitor_window(name: str, pid: int, seconds: float, settle: float, outdir: str, extra: list[str],
                   n: int) -> dict:
    cmd, rec = monitor_command(name, pid, outdir, n, extra)
    if cmd is None:
        return {"monitor": name, "missing": f"{name.split('_')[0]} not installed"}
    pty = Pty() if name != "headless" else None
    env = dict(os.environ)
    if pty is not None:
        env.update(TERM="xterm-256color", COLUMNS=str(PTY_COLS), LINES=str(PTY_ROWS))
        g = subprocess.Popen(cmd, stdin=pty.slave, stdout=pty.slave, stderr=pty.slave, env=env,
                             start_new_session=True, preexec_fn=pty.preexec, close_fds=True)
    else:
        g = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=env, start_new_session=True, text=True)
    t0 = time.monotonic()
    gp = psutil.Process(g.pid)
    readings: list[tuple[float, float]] = []
    early_exit = None
    try:
        while time.monotonic() - t0 < settle + seconds:
            c = tree_cpu_seconds(gp)
            if g.poll() is not None:
                early_exit = g.returncode
                break
            if c is not None:
                readings.append((time.monotonic() - t0, c))
            time.sleep(0.25)
    finally:
        t_measured = time.monotonic()
        if g.poll() is None:
            g.send_signal(signal.SIGTERM)   # gputop quits (and finishes its recording), nvitop quits
            try:
                g.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(g.pid, signal.SIGKILL)
                g.wait()
        try:
            os.killpg(g.pid, signal.SIGKILL)   # a py-spy window still running
        except ProcessLookupError:
            pass
        if pty is not None:
            time.sleep(0.1)
            pty.close()
    steady = [(t, c) for t, c in readings if t >= settle]
    cpu_pct = None
    if early_exit is None and len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        cpu_pct = 100.0 * (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
    row = {"monitor": name, "command": cmd, "cpu_pct_of_core": cpu_pct, "t_start": t0,
           "t_steady": t0 + settle, "t_end": t_measured, "returncode": g.returncode}
    if early_exit is not None:
        why = _text_tail(pty.tail) if pty is not None else (g.stderr.read() or "")[-300:]
        row["exited_early"] = f"{name} exited ({early_exit}) after {readings[-1][0] if readings else 0:.1f} s: {why}"
    if pty is not None:
        row["pty_bytes"] = pty.bytes
    if rec is not None:
        size = os.path.getsize(rec) if os.path.exists(rec) else None
        wall = t_measured - t0
        row["record_bytes"] = size
        row["record_mb_per_min"] = (size / 1e6) / (wall / 60.0) if size else None
    return row


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.mean(xs), 2) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after a monitor starts before it is measured")
    ap.add_argument("--nvitop-settle", type=float, default=None,
                    help="the same for nvitop (default --settle): it has no warm-up, and a long settle for every "
                         "monitor makes a three-round run outlast the GPU machine's 10 minutes a command")
    ap.add_argument("--monitors", default="headless", help=f"comma-separated, of: {', '.join(MONITORS)}")
    ap.add_argument("--gputop-args", default="")
    ap.add_argument("--label", default=None)
    a = ap.parse_args()
    monitors = [m.strip() for m in a.monitors.split(",") if m.strip()]
    bad = [m for m in monitors if m not in MONITORS]
    if bad or not monitors:
        print(f"monitor_cost: unknown monitor {', '.join(bad) or '(none)'}; choose from {', '.join(MONITORS)}",
              file=sys.stderr)
        return 2
    os.makedirs(a.outdir, exist_ok=True)
    label = a.label or a.scenario
    extra = shlex.split(a.gputop_args)

    w = subprocess.Popen([sys.executable, "-m", "gputop.demo.workload", "--scenario", a.scenario,
                          "--report-every", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    reader = RateReader(w)
    reader.start()
    rounds = []
    try:
        time.sleep(a.warmup)
        if w.poll() is not None:
            print(f"monitor_cost: the workload {a.scenario} exited ({w.returncode})", file=sys.stderr)
            return 1
        n = 0
        for i in range(a.alternations):
            t0 = time.monotonic()
            time.sleep(a.window)
            free = reader.between(t0 + 1.0, time.monotonic())
            rows = {}
            for k in range(len(monitors)):
                name = monitors[(i + k) % len(monitors)]
                settle = a.nvitop_settle if name.startswith("nvitop") and a.nvitop_settle is not None else a.settle
                row = monitor_window(name, w.pid, a.window, settle, a.outdir, extra, n)
                n += 1
                if "missing" not in row:
                    watched = reader.between(row["t_steady"], row["t_end"])
                    row["watched_rate"] = statistics.mean(watched) if watched else None
                rows[name] = row
            rounds.append({"free_rate": statistics.mean(free) if free else None, "monitors": rows})
    finally:
        w.terminate()
        w.wait(timeout=10)

    summary = {"label": label, "scenario": a.scenario, "gputop_args": extra, "window_s": a.window,
               "settle_s": a.settle, "nvitop_settle_s": a.nvitop_settle, "cpu_count": os.cpu_count(), "monitors": {}, "rounds": rounds}
    for name in monitors:
        rows = [r["monitors"][name] for r in rounds]
        missing = next((r["missing"] for r in rows if "missing" in r), None)
        early = next((r["exited_early"] for r in rows if "exited_early" in r), None)
        slow = [100.0 * (1 - r["monitors"][name]["watched_rate"] / r["free_rate"]) for r in rounds
                if r["free_rate"] and r["monitors"][name].get("watched_rate")]
        summary["monitors"][name] = {
            "missing": missing, "exited_early": early,
            "cpu_pct_each": [round(r["cpu_pct_of_core"], 2) for r in rows if r.get("cpu_pct_of_core") is not None],
            "cpu_pct_mean": _mean([r.get("cpu_pct_of_core") for r in rows]),
            "slowdown_pct_each": [round(x, 2) for x in slow],
            "slowdown_pct_mean": _mean(slow),
            "record_mb_per_min_mean": _mean([r.get("record_mb_per_min") for r in rows]),
        }
    # the one-monitor summary of the earlier version of this benchmark (h200.sh reads it)
    if "headless" in summary["monitors"]:
        h = summary["monitors"]["headless"]
        summary.update(gputop_cpu_pct_each=h["cpu_pct_each"], gputop_cpu_pct_mean=h["cpu_pct_mean"],
                       slowdown_pct_each=h["slowdown_pct_each"], slowdown_pct_mean=h["slowdown_pct_mean"],
                       record_mb_per_min_mean=h["record_mb_per_min_mean"])
    with open(os.path.join(a.outdir, f"monitor_cost-{label}.json"), "w") as f:
        json.dump(summary, f, indent=2)

    free = [r["free_rate"] for r in rounds]
    print(f"\nmonitor_cost [{label}] scenario={a.scenario}, {a.alternations} rounds of {a.window:g} s windows, "
          f"gputop {' '.join(extra) or '(defaults)'}; free steps/s per round: "
          + " ".join(f"{x:.2f}" if x else "-" for x in free))
    print(f"{'monitor':<30} {'CPU of one core':>16} {'each round':>24} {'slowdown':>9} {'MB/min':>7}")
    titles = {"headless": "gputop --pid P --headless", "ui": "gputop --pid P (UI, 120x40)",
              "nvitop": "nvitop (default interval)", "nvitop_fast": "nvitop --interval 0.25"}
    for name, m in summary["monitors"].items():
        if m["missing"]:
            print(f"{titles[name]:<30} {m['missing']:>16}")
            continue
        if m["cpu_pct_mean"] is None:
            print(f"{titles[name]:<30} {'no reading':>16}  {(m['exited_early'] or '')[:120]}")
            continue
        each = " ".join(f"{x:.2f}" for x in m["cpu_pct_each"])
        sd = f"{m['slowdown_pct_mean']:.2f}%" if m["slowdown_pct_mean"] is not None else "-"
        mb = f"{m['record_mb_per_min_mean']:.3f}" if m["record_mb_per_min_mean"] else "-"
        print(f"{titles[name]:<30} {m['cpu_pct_mean']:>15.2f}% {each:>24} {sd:>9} {mb:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
