"""The stack source: what every thread of the target is doing, sampled from outside.

Two samplers run on one thread ("gputop-stacks"), neither pauses the target:

1. **py-spy** (the binary of the py-spy package) in short rolling ``record`` windows:
   ``py-spy record --nonblocking --idle --threads [--subprocesses] -f speedscope -r RATE -d WINDOW``.
   py-spy has no streaming output and no Python API, and ``dump --json`` costs ~15 ms of CPU a
   call, so a fresh ``record`` runs for each window (2 s by default) and its speedscope file
   (full file paths, one stack per sample) is folded into one ``stacks`` sample per process:
   de-duplicated stacks with counts, a frame table, and the source text of the innermost
   line of each stack (read from /proc/PID/root, so containers work) for the rules that need
   to see ``.item()`` or ``time.sleep(``. A window's py-spy exits by itself at its end, so a
   py-spy child never outlives gputop by more than one window.

2. **The kernel**, per thread, at ~50 Hz with jittered (Poisson) intervals: one ``pread`` of
   /proc/PID/task/TID/syscall, which says "running" or the system call the thread is blocked
   in with its arguments. That is how **GIL wait** is measured: py-spy shows a thread waiting
   for the GIL exactly like an idle one, but the kernel shows it blocked in ``futex`` on an
   address inside the Python runtime's own static data (``_PyRuntime``'s GIL condition
   variable, in the rw segment of the python executable or libpython), while a lock, queue
   or event wait blocks on heap memory, ``time.sleep`` in ``clock_nanosleep`` and I/O in
   ``poll``/``read``. Once a second /proc/PID/task/TID/schedstat gives the exact time on a
   CPU and waiting for one. The counts are published as one ``thread_kernel`` sample per
   process per second.

The classification into thread states happens later, in ``gputop.derive.threads`` (a
processor), so better rules improve old recordings on replay. docs/metrics.md ("Python stacks")
documents every field and what it costs.

Sources must not import gputop.session: the clock is duck-typed (``clock.now()``).
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict

from gputop.model import KIND_HEALTH, MetricSpec, Sample, health_data
from gputop.sources.target import dies_with_parent

SOURCE_NAME = "stacks"
KIND_STACKS = "stacks"                # one py-spy window, one process: key = PID
KIND_THREAD_KERNEL = "thread_kernel"  # one second of kernel wait states, one process: key = PID

MIN_PYSPY = (0, 3, 14)        # older ones lack Python 3.11 support and os thread ids
DEFAULT_RATE_HZ = 20          # py-spy samples per second (benchmarks/stacks_overhead.py)
DEFAULT_WINDOW_S = 2          # seconds per py-spy run (py-spy takes whole seconds)
DEFAULT_KERNEL_RATE_HZ = 50   # /proc syscall reads per thread per second
DEFAULT_SUBPROCESS_EVERY = 5  # every 5th window also samples child processes (--subprocesses)
KERNEL_EMIT_S = 1.0           # one thread_kernel sample per process per second
HEALTH_EVERY_S = 5.0
MAX_KERNEL_THREADS = 256      # threads read by the kernel sampler (main process first)
MAX_STACKS_PER_THREAD = 64    # distinct stacks kept per thread and window (the rest counted)
MAX_DEPTH = 128               # frames kept per stack (the middle of deeper ones is dropped)
MAX_SOURCE_BYTES = 4 << 20    # source files read for line text at most this big
MAX_LINE_CHARS = 160
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

# Wait classes of the kernel sampler, in the column order of a thread_kernel row.
WAIT_CLASSES = ("run", "gil", "lock", "sleep", "poll", "io", "other")
KERNEL_COLUMNS = ("tid", "name", *WAIT_CLASSES, "cpu_s", "runq_s", "span_s")

# System call numbers (they differ per architecture). futex is what the GIL, locks and
# conditions block in; the rest say "idle" in a specific way.
_SYSCALLS = {
    "x86_64": {"futex": {202}, "sleep": {35, 230}, "poll": {7, 23, 232, 270, 271, 281, 441},
               "io": {0, 1, 17, 18, 19, 20, 43, 44, 45, 46, 47, 61, 247, 288, 299, 307}},
    "aarch64": {"futex": {98}, "sleep": {101, 115}, "poll": {22, 72, 73, 441},
                "io": {63, 64, 65, 66, 67, 68, 202, 206, 207, 211, 212, 242, 243, 260, 269, 95}},
}
_SYSCALLS["amd64"] = _SYSCALLS["x86_64"]
_SYSCALLS["arm64"] = _SYSCALLS["aarch64"]

# "Process 12 Thread 34 "name"" with --subprocesses, "Thread 34 "name"" without.
_PROFILE_NAME = re.compile(r'^(?:Process (\d+) )?Thread (\S+)(?: "(.*)")?$')
_PYTHON_NAME = re.compile(r"^(?:lib)?python(\d+)\.(\d+)(t?)(?:[dmu]*)(?:\.so.*)?$")
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")

METRICS: list[MetricSpec] = [
    MetricSpec(KIND_STACKS, "threads", "", "stacks", "py-spy's de-duplicated stacks of one process over one window, per thread", False),
    MetricSpec(KIND_THREAD_KERNEL, "threads", "", "kernel waits", "per thread: counts of kernel wait states (run, GIL futex, lock, sleep, poll, I/O, other) and exact CPU/run-queue seconds", False),
]


# ---------------------------------------------------------------------------------------------
# Finding py-spy


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


# ---------------------------------------------------------------------------------------------
# What the target is: which Python, where its runtime lives


def parse_python_name(basename: str) -> tuple[str, bool] | None:
    """("3.11", free_threaded) from a python binary or libpython file name, else None.
    "python3.13t" and "libpython3.13t.so.1.0" are free-threaded builds (no GIL)."""
    m = _PYTHON_NAME.match(basename)
    if not m:
        return None
    return f"{m[1]}.{m[2]}", m[3] == "t"


class PythonInfo:
    """What /proc/PID/maps says about a process: is it Python, which version, is it a
    free-threaded build, and the address ranges of the interpreter's static data (where
    the GIL lives)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.python = False
        self.version: str | None = None
        self.free_threaded = False
        self.runtime_ranges: list[tuple[int, int]] = []
        self.error: str | None = None
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError as e:
            exe = ""
            self.error = f"{type(e).__name__}: {e}"
        self.exe = exe
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = f.read().decode("utf-8", "replace")
        except OSError as e:
            self.error = f"cannot read /proc/{pid}/maps: {e.strerror or e}"
            return
        prev_end, prev_runtime = -1, False
        for line in maps.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) < 5:
                continue
            try:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
            except ValueError:
                continue
            path = parts[5].strip() if len(parts) > 5 else ""
            base = os.path.basename(path)
            named = parse_python_name(base) if path else None
            is_runtime = named is not None and (path == exe or base.startswith("libpython"))
            if is_runtime:
                self.python = True
                if self.version is None or base.startswith("libpython"):  # libpython says best
                    self.version, self.free_threaded = named
            writable = parts[1].startswith("rw")
            if is_runtime and writable:
                self.runtime_ranges.append((lo, hi))
            elif prev_runtime and writable and not path and lo == prev_end:
                self.runtime_ranges.append((lo, hi))  # the .bss right after the data segment
            prev_runtime = is_runtime and writable
            prev_end = hi
        if not self.python and exe:
            # A python we could not see in the maps (renamed binary): trust the name only.
            named = parse_python_name(os.path.basename(exe))
            if named:
                self.python = True
                self.version, self.free_threaded = named


_RUN, _GIL, _LOCK, _SLEEP, _POLL, _IO, _OTHER = range(len(WAIT_CLASSES))


class SyscallTable:
    """System call numbers of this machine, sorted into wait classes."""

    def __init__(self, machine: str | None = None):
        machine = (machine or platform.machine()).lower()
        self.known = machine in _SYSCALLS
        t = _SYSCALLS.get(machine, _SYSCALLS["x86_64"])
        self.futex = frozenset(t["futex"])
        self.by_nr = {**{n: _SLEEP for n in t["sleep"]}, **{n: _POLL for n in t["poll"]},
                      **{n: _IO for n in t["io"]}}


def classify_syscall(raw: bytes, ranges: list[tuple[int, int]], table: SyscallTable) -> int:
    """The start of /proc/PID/task/TID/syscall -> an index into WAIT_CLASSES.

    "running" (on a CPU or runnable) -> run; futex on an address inside the Python runtime's
    static data (``ranges``) -> gil; any other futex -> lock; then sleep / poll / io by
    system call number; anything else (including "-1": blocked outside a system call) -> other.
    """
    if raw[:1] == b"r":
        return _RUN
    sp = raw.find(b" ")
    try:
        nr = int(raw[:sp] if sp > 0 else raw)
    except ValueError:
        return _OTHER
    if nr in table.futex:
        if ranges:
            end = raw.find(b" ", sp + 1)
            try:
                addr = int(raw[sp + 1:end if end > 0 else None], 16)
            except ValueError:
                return _LOCK
            for lo, hi in ranges:
                if lo <= addr < hi:
                    return _GIL
        return _LOCK
    return table.by_nr.get(nr, _OTHER)


# ---------------------------------------------------------------------------------------------
# The kernel sampler


class _KThread:
    __slots__ = ("tid", "fd", "counts", "name", "sched0", "t0", "gone")

    def __init__(self, tid: int, fd: int | None, name: str):
        self.tid = tid
        self.fd = fd
        self.counts = [0] * len(WAIT_CLASSES)
        self.name = name
        self.sched0: tuple[int, int] | None = None
        self.t0: float | None = None
        self.gone = False


class _KProc:
    def __init__(self, pid: int):
        self.pid = pid
        self.info = PythonInfo(pid)
        self.threads: dict[int, _KThread] = {}
        self.syscall_denied = False
        self.n_ticks = 0
        self.t0: float | None = None


def _read_small(path: str, size: int = 512) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def _schedstat(pid: int, tid: int) -> tuple[int, int] | None:
    raw = _read_small(f"/proc/{pid}/task/{tid}/schedstat", 128)
    if not raw:
        return None
    parts = raw.split()
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


class KernelSampler:
    """Counts, per thread, how often it is running or blocked in which kind of wait."""

    def __init__(self, max_threads: int = MAX_KERNEL_THREADS):
        self.table = SyscallTable()
        self.arch_known = self.table.known
        self.max_threads = max_threads
        self.procs: dict[int, _KProc] = {}
        self.n_threads = 0
        self.capped = 0

    def refresh(self, pids: list[int], now: float) -> None:
        """Follow the tree: new processes and threads in, gone ones out. ``pids`` lists the
        main process first, so it keeps its threads when the cap bites."""
        live = set(pids)
        for pid in [p for p in self.procs if p not in live]:
            self._drop_proc(pid)
        budget = self.max_threads
        self.capped = 0
        for pid in pids:
            proc = self.procs.get(pid)
            if proc is None:
                proc = self.procs[pid] = _KProc(pid)
                proc.t0 = now
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except (OSError, ValueError):
                self._drop_proc(pid)
                continue
            tids.sort()
            keep = set(tids[:max(0, budget)])
            self.capped += len(tids) - len(keep)
            budget -= len(keep)
            for tid in [t for t in proc.threads if t not in keep]:
                self._close(proc.threads.pop(tid))
            for tid in keep:
                if tid in proc.threads:
                    continue
                fd = None
                if not proc.syscall_denied:
                    try:
                        fd = os.open(f"/proc/{pid}/task/{tid}/syscall", os.O_RDONLY)
                    except PermissionError:
                        proc.syscall_denied = True
                    except OSError:
                        continue
                th = _KThread(tid, fd, "")
                th.sched0 = _schedstat(pid, tid)
                th.t0 = now
                proc.threads[tid] = th
        self.n_threads = sum(len(p.threads) for p in self.procs.values())

    def _close(self, th: _KThread) -> None:
        if th.fd is not None:
            try:
                os.close(th.fd)
            except OSError:
                pass
            th.fd = None

    def _drop_proc(self, pid: int) -> None:
        proc = self.procs.pop(pid, None)
        if proc:
            for th in proc.threads.values():
                self._close(th)

    def close(self) -> None:
        for pid in list(self.procs):
            self._drop_proc(pid)

    def tick(self) -> None:
        """One read of every thread's current system call (the hot path: ~5 us a thread)."""
        table, pread, classify = self.table, os.pread, classify_syscall
        for proc in self.procs.values():
            proc.n_ticks += 1
            ranges = proc.info.runtime_ranges
            for th in proc.threads.values():
                if th.gone:
                    continue
                if th.fd is None:
                    raw = _read_small(f"/proc/{proc.pid}/task/{th.tid}/stat", 256)
                    if raw is None:
                        th.gone = True
                        continue
                    # Without /syscall (no ptrace right) only running vs not is known.
                    state = raw[raw.rfind(b")") + 2:raw.rfind(b")") + 3]
                    th.counts[_RUN if state == b"R" else _OTHER] += 1
                    continue
                try:
                    raw = pread(th.fd, 64, 0)
                except PermissionError:
                    # No ptrace right (the check is made at read time): fall back to stat.
                    proc.syscall_denied = True
                    self._close(th)
                    continue
                except OSError:
                    th.gone = True
                    continue
                th.counts[classify(raw, ranges, table)] += 1

    def harvest(self, now: float, main_pid: int | None = None) -> list[tuple[int, dict]]:
        """(pid, data) of a thread_kernel sample per process; counters start again."""
        out = []
        for proc in list(self.procs.values()):
            rows = []
            for th in list(proc.threads.values()):
                sched = _schedstat(proc.pid, th.tid)
                comm = _read_small(f"/proc/{proc.pid}/task/{th.tid}/comm", 64)
                if comm:
                    th.name = comm.decode("utf-8", "replace").strip()
                cpu_s = runq_s = None
                if sched is not None and th.sched0 is not None and sched[0] >= th.sched0[0]:
                    cpu_s = round((sched[0] - th.sched0[0]) / 1e9, 4)
                    runq_s = round((sched[1] - th.sched0[1]) / 1e9, 4)
                span = round(now - th.t0, 4) if th.t0 is not None else None
                if sum(th.counts) or cpu_s is not None:
                    rows.append([th.tid, th.name, *th.counts, cpu_s, runq_s, span])
                th.counts = [0] * len(WAIT_CLASSES)
                th.sched0, th.t0 = sched, now
                if th.gone or sched is None:
                    self._close(proc.threads.pop(th.tid))
            t0 = proc.t0 if proc.t0 is not None else now
            if rows:
                out.append((proc.pid, {
                    "t0": round(t0, 4), "dur_s": round(now - t0, 4), "ticks": proc.n_ticks,
                    "main": proc.pid == main_pid,
                    "python": proc.info.python, "python_version": proc.info.version,
                    "gil_known": bool(proc.info.runtime_ranges) and not proc.syscall_denied,
                    "cols": list(KERNEL_COLUMNS), "threads": rows,
                }))
            proc.t0, proc.n_ticks = now, 0
        return out



# ---------------------------------------------------------------------------------------------
# py-spy windows


class SourceLines:
    """The text of a source line, as the target sees its files (/proc/PID/root/...).
    Only read, never run; bounded in file size and in the number of files cached."""

    def __init__(self, max_files: int = 256):
        self.max_files = max_files
        self._files: OrderedDict[str, list[str] | None] = OrderedDict()

    def line(self, pid: int, path: str, lineno: int) -> str | None:
        if not path or path.startswith("<") or lineno <= 0:
            return None
        key = f"{pid}\0{path}"
        lines = self._files.get(key, False)
        if lines is False:
            lines = self._load(pid, path)
            self._files[key] = lines
            while len(self._files) > self.max_files:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(key)
        if not lines or lineno > len(lines):
            return None
        return lines[lineno - 1].strip()[:MAX_LINE_CHARS]

    @staticmethod
    def _load(pid: int, path: str) -> list[str] | None:
        for candidate in (f"/proc/{pid}/root{path}" if path.startswith("/") else None, path):
            if not candidate:
                continue
            try:
                if os.path.getsize(candidate) > MAX_SOURCE_BYTES:
                    return None
                with open(candidate, "rb") as f:
                    return f.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
        return None

    def clear(self) -> None:
        self._files.clear()


def _is_pseudo(frame: dict) -> bool:
    """py-spy's own frames for the process and the thread (no file)."""
    name = frame.get("name") or ""
    return not frame.get("file") and (name.startswith("process ") or name.startswith("thread ("))


def run_lengths(order: list[tuple], index: dict[tuple, int]) -> list[int]:
    """The samples' stacks in time order as run lengths: [stack index, count, stack index,
    count, ...], the index into the thread's ``stacks`` (-1 for a stack that was dropped).
    py-spy samples every thread at each tick, so sample i of a window of n samples fell at
    about t0 + (i + 0.5) * dur_s / n: this is what lets the time budget join a thread's state
    with the GPU's at the moment it was in it."""
    out: list[int] = []
    for key in order:
        i = index.get(key, -1)
        if out and out[-2] == i:
            out[-1] += 1
        else:
            out += [i, 1]
    return out


def fold_speedscope(doc: dict, pid: int, lines: SourceLines | None = None) -> dict[int, dict]:
    """A py-spy speedscope document -> {pid: stacks-sample data (without t0/dur_s)}.
    ``pid``: the process py-spy was pointed at (profiles without a process are its own).

    Per process: a frame table ``frames`` ([name, file, line]), ``code`` (frame index -> the
    text of that line, for frames that are the innermost of some stack), and ``threads``:
    [{"tid", "name", "n", "stacks": [[count, [frame index, root first...]], ...], "seq", "dropped"}],
    ``seq`` being the samples' order (``run_lengths``).
    """
    shared = doc.get("shared") or {}
    sframes = shared.get("frames") or []
    pseudo = [_is_pseudo(f) if isinstance(f, dict) else True for f in sframes]
    procs: dict[int, dict] = {}
    target_pid = pid
    for prof in doc.get("profiles") or []:
        m = _PROFILE_NAME.match(str(prof.get("name", "")))
        if not m:
            continue
        pid = int(m[1]) if m[1] else target_pid
        tid_s = m[2]
        tid: int | str = int(tid_s) if tid_s.isdigit() else tid_s
        name = m[3] or ""
        p = procs.setdefault(pid, {"_index": {}, "frames": [], "code": {}, "threads": []})
        index, frames = p["_index"], p["frames"]
        folded: Counter = Counter()
        order: list[tuple] = []   # each sample's stack, in time order (for the time budget)
        n = 0
        for stack in prof.get("samples") or []:
            n += 1
            out = []
            for i in stack:
                if not isinstance(i, int) or i < 0 or i >= len(sframes) or pseudo[i]:
                    continue
                j = index.get(i)
                if j is None:
                    f = sframes[i]
                    j = index[i] = len(frames)
                    frames.append([str(f.get("name") or "?"), str(f.get("file") or ""), int(f.get("line") or 0)])
                out.append(j)
            if len(out) > MAX_DEPTH:
                half = MAX_DEPTH // 2
                out = out[:half] + out[-half:]
            key = tuple(out)
            folded[key] += 1
            order.append(key)
        stacks = folded.most_common()
        kept, dropped = stacks[:MAX_STACKS_PER_THREAD], sum(c for _, c in stacks[MAX_STACKS_PER_THREAD:])
        th = {"tid": tid, "name": name, "n": n, "stacks": [[c, list(s)] for s, c in kept],
              "seq": run_lengths(order, {s: i for i, (s, _c) in enumerate(kept)})}
        if dropped:
            th["dropped"] = dropped
        p["threads"].append(th)
        if lines is not None:
            for s, _c in kept:
                if s and str(s[-1]) not in p["code"]:
                    _n, path, line = frames[s[-1]]
                    text = lines.line(pid, path, line)
                    if text is not None:
                        p["code"][str(s[-1])] = text
    for p in procs.values():
        del p["_index"]
    return procs


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            and not _pid_alive(pid):
        return ("off", f"process {pid} exited: no more stacks")
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip().lower().startswith("error")), "")
    if not last:
        last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "no message")
    return ("failed", f"py-spy failed: {last[:200]}")


_SAMPLES_LINE = re.compile(r"Samples:\s*(\d+)\s+Errors:\s*(\d+)")
_BEHIND = re.compile(r"([\d.]+)s behind in sampling")


class _Run:
    """One py-spy record window in flight."""

    def __init__(self, proc: subprocess.Popen, out_path: str, err_path: str, t_spawn: float, err_file):
        self.proc = proc
        self.out_path = out_path
        self.err_path = err_path
        self.err_file = err_file
        self.t_spawn = t_spawn
        self.rate = 0
        self.subprocesses = False


_MP_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.semaphore_tracker",
               b"multiprocessing.forkserver")
_child_kinds: dict[tuple[int, bytes], str] = {}


def _child_kind(pid: int) -> str:
    """"worker" (a torch DataLoader worker: torch names its thread pt_data_worker), "helper"
    (multiprocessing's trackers), "gone", or "other" (a rank, or any other child)."""
    comm = _read_small(f"/proc/{pid}/comm", 64)
    if comm is None:
        return "gone"
    comm = comm.strip()
    key = (pid, comm)
    kind = _child_kinds.get(key)
    if kind is None:
        if comm == b"pt_data_worker":
            kind = "worker"
        else:
            cmd = _read_small(f"/proc/{pid}/cmdline", 4096) or b""
            kind = "helper" if any(h in cmd for h in _MP_HELPERS) else "other"
            if kind == "other" and PythonInfo(pid).python is False:
                kind = "helper"  # not Python: py-spy skips it anyway
        if len(_child_kinds) > 4096:
            _child_kinds.clear()
        _child_kinds[key] = kind
    return kind


# ---------------------------------------------------------------------------------------------
# The source


class StackSource:
    name = SOURCE_NAME

    def __init__(self, clock, target, rate_hz: int = DEFAULT_RATE_HZ, window_s: int = DEFAULT_WINDOW_S,
                 kernel_rate_hz: float = DEFAULT_KERNEL_RATE_HZ,
                 subprocess_every: int = DEFAULT_SUBPROCESS_EVERY, pyspy: str | None = None) -> None:
        if int(rate_hz) < 1 or int(window_s) < 1 or not kernel_rate_hz > 0:
            raise ValueError("rate_hz, window_s and kernel_rate_hz must be positive")
        self.clock = clock
        self.target = target
        self.rate_hz = int(rate_hz)
        self.window_s = int(window_s)
        self._preexec = dies_with_parent(signal.SIGKILL)  # py-spy never outlives gputop
        self.kernel_rate_hz = float(kernel_rate_hz)
        # py-spy's --subprocesses costs ~3x a main-process-only window (it samples every child
        # at the full rate and scans /proc for new ones): children get every Nth window only.
        self.subprocess_every = max(0, int(subprocess_every))
        self.has_children = False
        self.children_all_windows = False
        self.pyspy_path = pyspy
        self.pyspy_version: tuple | None = None
        self._rng = random.Random()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._emit = None
        self.kernel = KernelSampler()
        self.lines = SourceLines()
        self._tmpdir: str | None = None
        self._run: _Run | None = None
        self._next_spawn = 0.0
        self._failures = 0
        self._subprocess_windows = 0
        # What health says (all read by benchmarks/stacks_overhead.py too).
        self.pyspy_state = "off"              # ok | degraded | failed | off
        self.pyspy_message = "starting"
        self.pyspy_ok = False                 # py-spy usable at all (found, new enough)
        self.restarts = 0
        self.windows = 0
        self.last_error: str | None = None
        self.rate_eff: float | None = None     # py-spy samples per thread per second, last window
        self.behind_s: float | None = None
        self.pyspy_cpu_s = 0.0                 # CPU of all py-spy children so far
        self.sampler_cpu_s = 0.0               # CPU of our own thread so far
        self.kernel_ticks = 0
        self._kernel_t0: float | None = None
        self._health_said: tuple | None = None
        self._health_at = -1e9
        self._cost_prev: tuple[float, float, float] | None = None  # (wall, pyspy cpu, own cpu)
        self.cost_pct: dict[str, float | None] = {"pyspy": None, "sampler": None}
        self._target_gone = False

    # -- Source protocol -----------------------------------------------------------------
    def start(self, emit) -> None:
        if self._thread is not None:
            return
        self._emit = emit
        self._thread = threading.Thread(target=self._main, name="gputop-stacks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._kill_run()
        self.kernel.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def describe(self) -> dict:
        return {
            "pyspy": self.pyspy_path, "pyspy_version": _vstr(self.pyspy_version) if self.pyspy_version else None,
            "rate_hz": self.rate_hz, "window_s": self.window_s, "subprocess_every": self.subprocess_every,
            "kernel_rate_hz": self.kernel_rate_hz, "kernel_arch": platform.machine(),
            "gil_method": "futex wait on the Python runtime's static data (/proc/PID/task/TID/syscall)",
            "nonblocking": True,
        }

    # -- the loop --------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._prepare_pyspy()
        except Exception as e:  # never let a surprise kill the source silently
            self.pyspy_state, self.pyspy_message = "failed", f"py-spy check failed: {type(e).__name__}: {e}"
        mean = 1.0 / self.kernel_rate_hz
        next_emit = time.monotonic() + KERNEL_EMIT_S
        self._refresh_tree()
        while not self._stop.is_set():
            c0 = time.thread_time()
            try:
                self.kernel.tick()
                self.kernel_ticks += 1
                mono = time.monotonic()
                if mono >= next_emit:
                    next_emit = mono + KERNEL_EMIT_S
                    self._emit_kernel()
                    self._refresh_tree()
                self._pyspy_step()
                self._maybe_health()
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
            self.sampler_cpu_s += time.thread_time() - c0
            # Poisson sampling: exponential gaps never lock onto a periodic step or the
            # GIL's 5 ms switch interval. Capped so a long gap cannot starve a window.
            if self._stop.wait(min(4 * mean, self._rng.expovariate(1.0 / mean))):
                break
        self._kill_run()

    def _refresh_tree(self) -> None:
        if self._target_gone:
            return
        try:
            pids = sorted(self.target.tree_pids(max_age_s=1.0), key=lambda p: (p != self.target.pid, p))
        except Exception:
            pids = [self.target.pid]
        if self.target.pid not in pids or not os.path.exists(f"/proc/{self.target.pid}"):
            pids = [p for p in pids if p != self.target.pid]
            self._target_gone = not self.target.alive() if hasattr(self.target, "alive") else True
        now = self.clock.now()
        if self._kernel_t0 is None:
            self._kernel_t0 = now
        self.kernel.refresh(pids, now)
        self.has_children = len(pids) > 1
        # DataLoader workers are sampled in every Nth window; other Python children (ranks
        # under a launcher, a subprocess doing the real work) every window: they may be the
        # part the user is after.
        self.children_all_windows = any(_child_kind(p) == "other" for p in pids if p != self.target.pid)

    def _emit_kernel(self) -> None:
        now = self.clock.now()
        for pid, data in self.kernel.harvest(now, self.target.pid):
            self._emit(Sample(now, KIND_THREAD_KERNEL, str(pid), data))

    # -- py-spy ------------------------------------------------------------------------------
    def _prepare_pyspy(self) -> None:
        if self.pyspy_path and not os.access(self.pyspy_path, os.X_OK):
            self.pyspy_state = "failed"
            self.pyspy_message = (f"py-spy not found at {self.pyspy_path}: pip install py-spy; "
                                  f"Python stacks are off, thread CPU and GIL wait still work")
            return
        path = self.pyspy_path or find_pyspy()
        if not path:
            self.pyspy_state = "failed"
            self.pyspy_message = ("py-spy not found (next to this Python or on PATH): pip install py-spy; "
                                  "Python stacks are off, thread CPU and GIL wait still work")
            return
        self.pyspy_path = path
        self.pyspy_version = pyspy_version(path)
        if self.pyspy_version is None:
            self.pyspy_state, self.pyspy_message = "failed", f"{path} --version gave no version: reinstall py-spy"
            return
        if self.pyspy_version < MIN_PYSPY:
            self.pyspy_state = "failed"
            self.pyspy_message = (f"py-spy {_vstr(self.pyspy_version)} is too old (need >= {_vstr(MIN_PYSPY)}): "
                                  f"pip install -U py-spy")
            return
        info = PythonInfo(self.target.pid)
        if info.free_threaded:
            self.pyspy_state = "failed"
            self.pyspy_message = (f"process {self.target.pid} runs a free-threaded Python {info.version}t, which "
                                  f"py-spy {_vstr(self.pyspy_version)} cannot read: no Python stacks")
            return
        if not info.python and info.error is None:
            self.pyspy_state = "off"
            self.pyspy_message = (f"process {self.target.pid} is not a Python program "
                                  f"({os.path.basename(info.exe) or '?'}): no Python stacks")
            return
        self.pyspy_ok = True
        self.pyspy_state, self.pyspy_message = "ok", "starting py-spy"
        self._tmpdir = tempfile.mkdtemp(prefix="gputop-stacks-")

    def _pyspy_step(self) -> None:
        if not self.pyspy_ok:
            return
        run = self._run
        if run is not None:
            try:
                pid, status, rusage = os.wait4(run.proc.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status, rusage = run.proc.pid, 0, None
            if pid == 0:
                if time.monotonic() - run.t_spawn > self.window_s + 30:  # hung: give up on it
                    self._kill_run()
                    self._window_failed("py-spy did not finish its window (hung); restarted")
                return
            run.proc.returncode = os.waitstatus_to_exitcode(status) if rusage is not None else 0
            if rusage is not None:
                self.pyspy_cpu_s += rusage.ru_utime + rusage.ru_stime
            self._run = None
            self._finish_window(run)
        if self._target_gone:
            self.pyspy_state, self.pyspy_message = "off", f"process {self.target.pid} exited: no more stacks"
            return
        if self._stop.is_set() or time.monotonic() < self._next_spawn:
            return
        self._spawn()

    def _spawn(self) -> None:
        assert self._tmpdir and self.pyspy_path
        self.windows += 1
        out_path = os.path.join(self._tmpdir, f"w{self.windows % 4}.json")
        err_path = os.path.join(self._tmpdir, f"w{self.windows % 4}.err")
        for p in (out_path,):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        # py-spy samples at a fixed period; a +-10% different rate per window (and a fresh start
        # phase each window) keeps it from locking onto a training step of the same period.
        spread = max(1, round(self.rate_hz * 0.1))
        rate = max(1, self.rate_hz + self._rng.randint(-spread, spread))
        cmd = [self.pyspy_path, "record", "--nonblocking", "--idle", "--threads", "-f", "speedscope",
               "-r", str(rate), "-d", str(self.window_s), "-o", out_path, "-p", str(self.target.pid)]
        subs = self.has_children and self.subprocess_every > 0 and (
            self.children_all_windows or self._subprocess_windows * self.subprocess_every <= self.windows)
        if subs:
            self._subprocess_windows += 1
            cmd.append("--subprocesses")
        err_file = open(err_path, "wb")
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_file,
                                    close_fds=True, preexec_fn=self._preexec)
        except OSError as e:
            err_file.close()
            self._window_failed(f"cannot run {self.pyspy_path}: {e}")
            return
        self._run = _Run(proc, out_path, err_path, time.monotonic(), err_file)
        self._run.rate = rate
        self._run.subprocesses = subs

    def _kill_run(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        try:
            run.proc.kill()
        except OSError:
            pass
        try:
            _pid, _status, rusage = os.wait4(run.proc.pid, 0)
            self.pyspy_cpu_s += rusage.ru_utime + rusage.ru_stime
            run.proc.returncode = -9
        except ChildProcessError:
            pass
        run.err_file.close()

    def _finish_window(self, run: _Run) -> None:
        run.err_file.close()
        t_end = self.clock.now()
        try:
            with open(run.err_path, "rb") as f:
                stderr = f.read(65536).decode("utf-8", "replace")
        except OSError:
            stderr = ""
        doc = None
        if os.path.exists(run.out_path):
            try:
                with open(run.out_path, "rb") as f:
                    doc = json.loads(f.read())
            except (OSError, ValueError):
                doc = None
        if doc is None or not isinstance(doc, dict):
            if not self.target.alive() if hasattr(self.target, "alive") else False:
                self._target_gone = True
                self.pyspy_state, self.pyspy_message = "off", f"process {self.target.pid} exited: no more stacks"
                return
            state, message = diagnose_pyspy_error(stderr, self.target.pid, PythonInfo(self.target.pid),
                                                  self.pyspy_version)
            if state == "off":
                # Not Python / gone: no point in retrying every second.
                self.pyspy_state, self.pyspy_message = state, message
                self.pyspy_ok = False
                return
            self._window_failed(message)
            return
        procs = fold_speedscope(doc, self.target.pid, self.lines)
        dur = None
        for prof in doc.get("profiles") or []:
            try:
                dur = max(dur or 0.0, float(prof.get("endValue", 0)) - float(prof.get("startValue", 0)))
            except (TypeError, ValueError):
                pass
        if not dur or dur <= 0:
            dur = float(self.window_s)
        m = _SAMPLES_LINE.search(stderr)
        errors = int(m[2]) if m else None
        behind = [float(x) for x in _BEHIND.findall(stderr)]
        self.behind_s = max(behind) if behind else None
        main_n = max((th["n"] for p in procs.values() for th in p["threads"]), default=0)
        self.rate_eff = round(main_n / dur, 2) if dur else None
        t0 = round(t_end - dur, 4)
        samples = []
        for pid, data in procs.items():
            data["t0"] = t0
            data["dur_s"] = round(dur, 4)
            data["rate_hz"] = run.rate
            data["main"] = pid == self.target.pid
            data["subprocesses"] = run.subprocesses
            if errors:
                data["errors"] = errors
            samples.append(Sample(t_end, KIND_STACKS, str(pid), data))
        for s in samples:
            self._emit(s)
        self._failures = 0
        self._next_spawn = 0.0
        if self.behind_s:
            self.pyspy_state = "degraded"
            self.pyspy_message = (f"py-spy fell {self.behind_s:.1f} s behind at {self.rate_hz} Hz "
                                  f"(effective {self.rate_eff} Hz): lower the stack rate")
        elif not procs:
            self.pyspy_state, self.pyspy_message = "degraded", "py-spy returned no threads in its last window"
        else:
            self.pyspy_state, self.pyspy_message = "ok", ""

    def _window_failed(self, message: str) -> None:
        self.last_error = message
        self.restarts += 1
        delay = BACKOFF_S[min(self._failures, len(BACKOFF_S) - 1)]
        self._failures += 1
        self._next_spawn = time.monotonic() + delay
        self.pyspy_state = "failed"
        self.pyspy_message = f"{message} (retry in {delay:.0f} s)"

    # -- health ------------------------------------------------------------------------------
    def _maybe_health(self, force: bool = False) -> None:
        mono = time.monotonic()
        state, message = self.pyspy_state, self.pyspy_message
        gil_known = any(p.info.runtime_ranges and not p.syscall_denied for p in self.kernel.procs.values())
        denied = any(p.syscall_denied for p in self.kernel.procs.values())
        if denied and state in ("ok", "degraded"):
            state = "degraded"
            message = ((message + "; ") if message else "") + (
                "GIL wait unknown: /proc/PID/task/*/syscall not readable (needs ptrace permission)")
        if not self.kernel.arch_known and state == "ok":
            state, message = "degraded", f"GIL wait unknown on {platform.machine()}: syscall table missing"
        said = (state, message)
        if said == self._health_said and mono - self._health_at < HEALTH_EVERY_S and not force:
            return
        wall = mono
        if self._cost_prev is not None and wall > self._cost_prev[0]:
            dt = wall - self._cost_prev[0]
            self.cost_pct = {"pyspy": round(100 * (self.pyspy_cpu_s - self._cost_prev[1]) / dt, 2),
                             "sampler": round(100 * (self.sampler_cpu_s - self._cost_prev[2]) / dt, 2)}
        self._cost_prev = (wall, self.pyspy_cpu_s, self.sampler_cpu_s)
        self._health_said, self._health_at = said, mono
        now = self.clock.now()
        kt = now - self._kernel_t0 if self._kernel_t0 is not None else None
        self._emit(Sample(now, KIND_HEALTH, self.name, health_data(
            state if state in ("ok", "degraded", "failed", "off") else "failed", message,
            rate_hz=self.rate_eff,
            rate_requested_hz=self.rate_hz, window_s=self.window_s, windows=self.windows,
            restarts=self.restarts, last_error=self.last_error, behind_s=self.behind_s,
            pyspy=self.pyspy_path, pyspy_version=_vstr(self.pyspy_version) if self.pyspy_version else None,
            kernel_rate_hz=round(self.kernel_ticks / kt, 1) if kt and kt > 1 else None,
            kernel_threads=self.kernel.n_threads, kernel_threads_capped=self.kernel.capped,
            gil_known=gil_known,
            pyspy_cpu_pct=self.cost_pct["pyspy"], sampler_cpu_pct=self.cost_pct["sampler"],
        )))
