#!/usr/bin/env python3
"""What the UI costs beyond headless: gputop's CPU attached to a busy Python process.

    python benchmarks/ui_cost.py OUTDIR [--seconds 30] [--size 120x40] [--alternations 2]
                                        [--gputop-args "--no-stacks"] [--profile]

Starts a busy Python process (``python -m gputop.demo.workload --scenario python``: a real
pure-Python CPU loop, no torch, no GPU), then alternates windows of
``gputop --pid P --headless`` and ``gputop --pid P`` (the UI, at defaults) in a real pty of
``--size`` (pty.fork, the size set with TIOCSWINSZ before gputop starts, the output drained as a
terminal would). For each window: CPU seconds of gputop's whole process tree (py-spy children
included, psutil) over the window, which starts SETTLE_S after gputop is up (start-up excluded), as % of one core,
and of its main thread alone (where Textual and the UI tick run).
Headless records (it must) into OUTDIR; the UI runs at defaults (records nothing).

--profile: one more UI window with py-spy sampling gputop itself (``py-spy record --format raw
--threads``, 250 Hz); every sampled stack is put in one component by the innermost frame it
recognises (Textual compositor/render, Rich, the snapshot, each panel, verdicts, sources...) and
by thread (the UI thread is the main thread; sources run on their own).
Results: a table on stdout, OUTDIR/ui_cost.json (and OUTDIR/ui_profile.txt with --profile).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pathlib
import platform
import pty
import re
import select
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
from collections import Counter

import psutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPY_HZ = 250  # py-spy's rate on gputop with --profile: enough samples of a UI that costs ~1%
SETTLE_S = 3.0  # after gputop is up: the first py-spy attach, the first verdicts (one-off costs)
# (--settle 24 measures the steady state: past the stack source's 20 s of 2 s py-spy windows)
UP_TIMEOUT_S = 90.0
FIRST_SCREEN_BYTES = 4000  # the UI's first paint of a 120x40 screen is larger than its set-up codes


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


def main_thread_cpu(proc: psutil.Process) -> float:
    """CPU seconds of the process's main thread (tid == pid): where Textual and the UI tick run;
    the sources, py-spy's reader and Textual's output writer have threads of their own."""
    try:
        for th in proc.threads():
            if th.id == proc.pid:
                return th.user_time + th.system_time
    except psutil.Error:
        pass
    return 0.0


class PtyChild:
    """A command in a new pty of a given size, its output read (and dropped) as it comes."""

    def __init__(self, argv: list[str], cols: int, rows: int, env: dict, up: threading.Event, cwd: str) -> None:
        self.up = up
        pid, fd = pty.fork()
        if pid == 0:  # child: the pty is its controlling terminal and stdin/out/err
            os.chdir(cwd)  # python -m puts the working directory first on sys.path
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            os.execvpe(argv[0], argv, env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.bytes_out = 0
        self._stop = False
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while not self._stop:
            try:
                r, _, _ = select.select([self.fd], [], [], 0.2)
                if r:
                    data = os.read(self.fd, 65536)
                    if not data:
                        return
                    self.bytes_out += len(data)
                    if self.bytes_out >= FIRST_SCREEN_BYTES:
                        self.up.set()
            except OSError:
                return

    def send(self, data: bytes) -> None:
        try:
            os.write(self.fd, data)
        except OSError:
            pass

    def alive(self) -> bool:
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return done == 0

    def close(self, timeout: float = 8.0) -> None:
        self.send(b"q")
        end = time.monotonic() + timeout
        while self.alive() and time.monotonic() < end:
            time.sleep(0.1)
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            time.sleep(1.0)
            if self.alive():
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        self._stop = True
        self._reader.join(timeout=2)
        os.close(self.fd)


def measure(argv: list[str], seconds: float, ui: bool, cols: int, rows: int, on_steady=None,
            root_dir: pathlib.Path = ROOT, mode: str | None = None, settle: float = SETTLE_S) -> dict:
    """One window: start gputop, wait until it is up (the UI painted its first screen; headless
    said what it records) and ``settle`` s more, then measure ``seconds``."""
    env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor", PYTHONPATH=str(root_dir))
    env.pop("NO_COLOR", None)
    t0 = time.monotonic()
    up = threading.Event()
    if ui:
        child = PtyChild(argv, cols, rows, env, up, str(root_dir))
        pid = child.pid
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
                                cwd=str(root_dir))
        pid = proc.pid

        def said():
            for line in proc.stderr:
                if "recording to" in line:
                    up.set()
        threading.Thread(target=said, daemon=True).start()
    root = psutil.Process(pid)
    seen: dict[int, float] = {}
    if not up.wait(UP_TIMEOUT_S):
        raise SystemExit(f"ui_cost: gputop was not up after {UP_TIMEOUT_S:g} s: {' '.join(argv)}")
    started_s = time.monotonic() - t0
    time.sleep(settle)
    hook = on_steady(pid) if on_steady is not None else None
    w0, c0, m0 = time.monotonic(), tree_cpu_seconds(root, seen), main_thread_cpu(root)
    while time.monotonic() < w0 + seconds:
        tree_cpu_seconds(root, seen)  # children that exit meanwhile still count
        time.sleep(0.25)
    w1, c1, m1 = time.monotonic(), tree_cpu_seconds(root, seen), main_thread_cpu(root)
    alive = psutil.pid_exists(pid) and root.status() != psutil.STATUS_ZOMBIE
    out_bytes = None
    if ui:
        out_bytes = child.bytes_out
        child.close()
    else:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"mode": mode or ("ui" if ui else "headless"), "cpu_pct_of_core": 100.0 * (c1 - c0) / (w1 - w0),
            "main_thread_pct": 100.0 * (m1 - m0) / (w1 - w0), "alive_at_end": alive, "up_after_s": started_s,
            "measured_s": w1 - w0, "pty_bytes_total": out_bytes, "hook": hook}


# -- the profile -------------------------------------------------------------------------------
# Innermost match wins: a stack is walked from its innermost frame outwards and the first frame
# that matches a rule names its component.
RULES: list[tuple[str, str]] = [
    (r"gputop/ui/snapshot\.py", "ui: snapshot (store reads, sparkline cells)"),
    (r"gputop/ui/fmt\.py", "ui: fmt (sparklines, numbers)"),
    (r"gputop/ui/panels/(\w+)\.py", "ui: panel {0}"),
    (r"gputop/ui/(procview|joblog)\.py", "ui: {0}"),
    (r"gputop/ui/app\.py", "ui: app (header, tabs, tick)"),
    (r"textual/_compositor\.py", "textual: compositor"),
    (r"textual/(_styles_cache|strip|_segment_tools)\.py", "textual: styles/strips"),
    (r"textual/(css|_layout|layouts)/?", "textual: css/layout"),
    (r"textual/(drivers|_xterm_parser|_writer)", "textual: driver/writer"),
    (r"textual/", "textual: other (message pump, widgets)"),
    (r"rich/", "rich: render"),
    (r"gputop/verdicts/", "verdicts"),
    (r"gputop/derive/", "derive"),
    (r"gputop/session/", "session (store, recorder, processors)"),
    (r"gputop/sources/(\w+)", "source {0}"),
    (r"asyncio/|selectors\.py", "asyncio loop"),
]


# Innermost frames that wait rather than compute: on a loaded machine py-spy sees a thread just
# woken (runnable, not yet on a core) as active, so these are counted apart, not as CPU.
WAITING = re.compile(r"^(?:\w+\.)*(select|poll|sleep|wait|_wait_for_tstate_lock|acquire|read|readline|recv|"
                     r"recv_into|accept|get|join) \(")


def classify(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost last in py-spy's raw (folded) output
        for pattern, name in RULES:
            m = re.search(pattern, frame)
            if m:
                return name.format(*m.groups())
    return "other"


def parse_folded(path: str) -> tuple[Counter, Counter, Counter]:
    by_component: Counter = Counter()
    by_thread: Counter = Counter()
    ui_thread_functions: Counter = Counter()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            thread = "?"
            while frames and frames[0].startswith(("thread", "process")):
                thread = frames.pop(0)
            if not frames:
                continue  # no Python frame at all: py-spy caught the thread between frames
            by_thread[thread] += int(count)
            waiting = WAITING.match(frames[-1])
            component = "(waiting in select, sleep, locks: not CPU)" if waiting else classify(frames)
            by_component[component] += int(count)
            if "MainThread" in thread and not waiting:  # the UI thread
                ui_thread_functions[frames[-1]] += int(count)
    return by_component, by_thread, ui_thread_functions


def profile_window(gputop_argv: list[str], seconds: float, cols: int, rows: int, outdir: str) -> dict:
    spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy")
    raw = os.path.join(outdir, "ui_profile.folded")
    holder: dict = {}

    def start_spy(pid: int):
        holder["proc"] = subprocess.Popen(
            [spy, "record", "--format", "raw", "--threads", "--rate", str(SPY_HZ), "--duration", str(int(seconds)),
             "--pid", str(pid), "--output", raw],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return "py-spy started"

    got = measure(gputop_argv, seconds, True, cols, rows, on_steady=start_spy)
    p = holder.get("proc")
    if p is not None:
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if not os.path.exists(raw):
            raise SystemExit(f"ui_cost: py-spy wrote no profile: {err.decode(errors='replace')[-400:]}")
    comp, threads, funcs = parse_folded(raw)
    total = sum(comp.values()) or 1
    # each sample is 1/SPY_HZ s of one thread on CPU (py-spy leaves out idle threads by default)
    per_pct = 100.0 / (SPY_HZ * int(seconds))
    return {"cpu_pct_of_core_with_spy": got["cpu_pct_of_core"], "samples": total, "rate_hz": SPY_HZ,
            "components_pct_of_core": {k: round(v * per_pct, 2) for k, v in comp.most_common()},
            "components_share": {k: round(v / total, 3) for k, v in comp.most_common()},
            "threads_samples": dict(threads.most_common()),
            "ui_top_functions": funcs.most_common(25)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--seconds", type=float, default=30.0, help="steady seconds measured per window")
    ap.add_argument("--size", default="120x40")
    ap.add_argument("--settle", type=float, default=SETTLE_S, help="seconds after gputop is up before a window")
    ap.add_argument("--alternations", type=int, default=2)
    ap.add_argument("--gputop-args", default="", help="extra arguments for both modes")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-headless", action="store_true", help="only UI windows (quick checks)")
    ap.add_argument("--before", metavar="DIR", help="a checkout of the code before a change (git worktree add "
                    "DIR COMMIT): its UI gets windows of its own ('ui-before'), alternated with the others")
    a = ap.parse_args()
    try:
        cols, rows = (int(x) for x in a.size.lower().split("x"))
    except ValueError:
        print(f"ui_cost: --size wants COLSxROWS, got {a.size!r}", file=sys.stderr)
        return 2
    a.outdir = os.path.abspath(a.outdir)
    os.makedirs(a.outdir, exist_ok=True)
    extra = shlex.split(a.gputop_args)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    target = subprocess.Popen([sys.executable, "-m", "gputop.demo.workload", "--scenario", "python",
                               "--duration", "100000"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env)
    windows = []
    try:
        time.sleep(2.0)
        base = [sys.executable, "-m", "gputop", "--pid", str(target.pid), *extra]
        for i in range(a.alternations):
            if not a.no_headless:
                rec = os.path.join(a.outdir, f"headless-{i}.gtrec")
                if os.path.exists(rec):
                    os.remove(rec)
                windows.append(measure([*base, "--headless", "--duration", str(a.seconds + a.settle + 30),
                                        "--record", rec], a.seconds, False, cols, rows, settle=a.settle))
                print(f"  headless {i}: {windows[-1]['cpu_pct_of_core']:.2f}% of one core "
                      f"(main thread {windows[-1]['main_thread_pct']:.2f}%)", flush=True)
            if a.before:
                windows.append(measure(base, a.seconds, True, cols, rows, root_dir=pathlib.Path(a.before),
                                       mode="ui-before", settle=a.settle))
                print(f"  ui-before {i}: {windows[-1]['cpu_pct_of_core']:.2f}% of one core "
                      f"(main thread {windows[-1]['main_thread_pct']:.2f}%)", flush=True)
            windows.append(measure(base, a.seconds, True, cols, rows, settle=a.settle))
            print(f"  ui       {i}: {windows[-1]['cpu_pct_of_core']:.2f}% of one core "
                  f"(main thread {windows[-1]['main_thread_pct']:.2f}%)", flush=True)
        prof = profile_window(base, a.seconds, cols, rows, a.outdir) if a.profile else None
    finally:
        target.terminate()
        target.wait(timeout=10)

    def mean(mode):
        xs = [w["cpu_pct_of_core"] for w in windows if w["mode"] == mode]
        return statistics.mean(xs) if xs else None

    hl, ui = mean("headless"), mean("ui")
    ui_main = statistics.mean([w["main_thread_pct"] for w in windows if w["mode"] == "ui"])
    summary = {"machine": f"{platform.node()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}",
               "size": a.size, "before": a.before, "ui_before_pct": mean("ui-before"), "seconds": a.seconds,
               "gputop_args": extra,
               "headless_pct": hl, "ui_pct": ui, "ui_minus_headless_pct": (ui - hl) if hl is not None else None,
               "ui_main_thread_pct": ui_main,
               "windows": windows, "profile": prof}
    with open(os.path.join(a.outdir, "ui_cost.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"\nui_cost {a.size}, {a.seconds:g} s windows, {summary['machine']}")
    print(f"{'mode':<10} {'tree, % of one core (each)':<28} {'mean':>6}  main thread (mean)")
    for mode in ("headless", "ui-before", "ui"):
        xs = [w["cpu_pct_of_core"] for w in windows if w["mode"] == mode]
        ms = [w["main_thread_pct"] for w in windows if w["mode"] == mode]
        if xs:
            print(f"{mode:<10} {' '.join(f'{x:6.2f}' for x in xs):<28} {statistics.mean(xs):6.2f}  "
                  f"{statistics.mean(ms):6.2f}")
    if hl is not None:
        print(f"UI - headless: {ui - hl:+.2f} points")
    if a.before:
        print(f"UI now - UI before: {ui - mean('ui-before'):+.2f} points")
    if prof:
        lines = [f"profile of one UI window (py-spy {SPY_HZ} Hz on gputop; tree CPU with py-spy on it: "
                 f"{prof['cpu_pct_of_core_with_spy']:.2f}%)", f"{'component':<48} {'% of core':>9} {'share':>6}"]
        for k, v in prof["components_pct_of_core"].items():
            lines.append(f"{k:<48} {v:9.2f} {100 * prof['components_share'][k]:5.1f}%")
        lines.append("threads (samples): " + ", ".join(f"{k} {v}" for k, v in prof["threads_samples"].items()))
        lines.append("hottest innermost frames of the UI:")
        lines += [f"  {n:6d}  {fr}" for fr, n in prof["ui_top_functions"]]
        text = "\n".join(lines)
        with open(os.path.join(a.outdir, "ui_profile.txt"), "w") as f:
            f.write(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
