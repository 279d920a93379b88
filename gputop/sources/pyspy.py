"""py-spy, the program: finding it, its version, one ``record`` window in flight, and what
its complaints mean for the user.

py-spy has no streaming output and no Python API, and ``dump --json`` costs ~15 ms of CPU a
call, so the stack source runs a fresh ``py-spy record --nonblocking --idle --threads
[--subprocesses] -f speedscope -r RATE -d WINDOW`` for each window (2 s for the first 20 s,
then 5 s: stacks.py). A window's
py-spy exits by itself at its end, so a py-spy child never outlives gputop by more than one
window (and it gets SIGKILL if gputop's thread dies: ``target.dies_with_parent``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

from gputop.sources.procfs import PythonInfo, pid_exists

MIN_PYSPY = (0, 3, 14)        # older ones lack Python 3.11 support and os thread ids
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)   # waits before a new window after failures

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_SAMPLES_LINE = re.compile(r"Samples:\s*(\d+)\s+Errors:\s*(\d+)")
_BEHIND = re.compile(r"([\d.]+)s behind in sampling")


def find_pyspy() -> str | None:
    """The py-spy binary: next to this Python (a venv's bin/), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def pyspy_version(path: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(out.stdout + out.stderr)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _vstr(v: tuple | None) -> str:
    return ".".join(map(str, v)) if v else "?"


def diagnose_pyspy_error(stderr: str, pid: int, info: PythonInfo | None, version: tuple | None) -> tuple[str, str]:
    """py-spy's complaint -> (health state, one line for the user)."""
    text = stderr.lower()
    ver = f"py-spy {_vstr(version)}"
    if "permission denied" in text or "operation not permitted" in text or "eperm" in text:
        return ("failed", f"py-spy may not read process {pid} (ptrace not permitted): run gputop as the "
                          f"target's user or root; check sysctl kernel.yama.ptrace_scope (0 or 1); in a "
                          f"container add --cap-add SYS_PTRACE (and --pid=host for a host process)")
    if info is not None and info.free_threaded:
        return ("failed", f"process {pid} runs a free-threaded Python {info.version}t, which {ver} cannot "
                          f"read: no Python stacks (the GIL does not exist there)")
    if ("failed to find python version" in text or "failed to find a python interpreter" in text
            or "unsupported" in text or "failed to get interpreter" in text):
        if info is not None and not info.python:
            return ("off", f"process {pid} is not a Python program ({os.path.basename(info.exe) or '?'}): "
                           f"no Python stacks")
        pv = f"Python {info.version}" if info is not None and info.version else "this Python"
        return ("failed", f"{ver} cannot read {pv} in process {pid}: upgrade py-spy (pip install -U py-spy)")
    if ("no such process" in text or "failed to get process executable name" in text or "no such file" in text) \
            and not pid_exists(pid):
        return ("off", f"process {pid} exited: no more stacks")
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip().lower().startswith("error")), "")
    if not last:
        last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "no message")
    return ("failed", f"py-spy failed: {last[:200]}")



class _Run:
    """One py-spy record window in flight."""

    def __init__(self, proc: subprocess.Popen, out_path: str, err_path: str, t_spawn: float, err_file):
        self.proc = proc
        self.out_path = out_path
        self.err_path = err_path
        self.err_file = err_file
        self.t_spawn = t_spawn
        self.rate = 0
        self.window_s = 0
        self.subprocesses = False
        self.calm_factor = 1      # > 1: sampled at the calm rate, 1/calm_factor of the full one
        self.cut = False          # asked to end early (SIGINT: py-spy writes what it has and exits)

    def interrupt(self) -> None:
        """End the window now: py-spy stops on SIGINT and writes its file, its span the time it
        sampled (the profile's endValue), so the window is complete, only shorter."""
        self.cut = True
        try:
            # os.kill, not Popen.send_signal: that polls first and may reap py-spy itself, and
            # the caller's wait4 would then lose its rusage (py-spy's CPU); the caller's wait4
            # has just seen it unreaped, so the pid is still py-spy's
            os.kill(self.proc.pid, signal.SIGINT)
        except OSError:
            pass

    def kill(self) -> float:
        """Kill and reap it; the CPU seconds it used (0.0 when it was reaped elsewhere)."""
        cpu = 0.0
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            _pid, _status, rusage = os.wait4(self.proc.pid, 0)
            cpu = rusage.ru_utime + rusage.ru_stime
            self.proc.returncode = -9
        except ChildProcessError:
            pass
        self.err_file.close()
        return cpu


def record_command(pyspy: str, rate: int, window_s: int, out_path: str, pid: int, subprocesses: bool) -> list[str]:
    """One window's py-spy command line: never pausing the target, idle threads included, one
    speedscope file with every thread's samples in order."""
    cmd = [pyspy, "record", "--nonblocking", "--idle", "--threads", "-f", "speedscope",
           "-r", str(rate), "-d", str(window_s), "-o", out_path, "-p", str(pid)]
    if subprocesses:
        cmd.append("--subprocesses")
    return cmd

