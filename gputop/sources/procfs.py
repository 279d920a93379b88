"""/proc, read one way for every source: stat lines, liveness, "is this Python?", child roles.

The host source, the target's tree, the rank finder and the stack source all read /proc; each
fact about a process is parsed here, once:

- ``parse_stat`` / ``stat_fields`` / ``stat_state`` / ``read_ppid``: /proc/PID/stat. The name
  (field 2) is in parentheses and may itself hold spaces and ')': every parser splits after the
  *last* ')'.
- ``still_running`` (exists and is not a zombie) and ``pid_exists`` (a signal could reach it).
- ``looks_like_python`` (by names: the executable, the command line's first word, the process
  name) and ``PythonInfo`` (by /proc/PID/maps: is a Python runtime mapped, which version, where
  its static data lies -- what the GIL wait measurement needs).
- Child roles in one vocabulary (``ROLE_*``), with one list of multiprocessing's helpers.
- ``File`` and ``FdBudget``: a /proc file kept open and re-read with ``pread(fd, n, 0)``
  (procfs regenerates the text on a read from offset 0), the host source's cheap way to read
  the same files every tick.
"""

from __future__ import annotations

import os
import re
import resource
import threading

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# How old a tree every source accepts. The host source (each tick), the stack source's kernel
# sampler, the probe client's scan and NVML's process read each ask once a second, out of step:
# with the ages they asked for before (0.2-1 s) the tree was walked ~3 times a second, 0.20% of a
# core on the H200 (its /proc walk: benchmarks/cpu_profile.py, run 12); at one age of 1 s the
# first asker after it expires walks it for all, once a second. A new DataLoader worker is seen
# up to a second later. (Target.tree in sources/target.py reads it; it lives here, in the module
# the host source imports without psutil.)
TREE_MAX_AGE_S = 1.0

# /proc state letters in the words psutil uses.
STATE_WORDS = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped",
               "t": "tracing-stop", "Z": "zombie", "X": "dead", "x": "dead", "I": "idle",
               "P": "parked", "W": "waking", "K": "wake-kill"}
GONE_STATES = ("Z", "X", "x")   # a zombie or a dead task: nothing left to read


# ---------------------------------------------------------------------------------------------
# Files kept open


class Gone(Exception):
    """The process or thread behind a file no longer exists."""


class FdBudget:
    """How many /proc files may stay open. ``FdBudget()`` is a share of the one budget of the
    whole process (``process_budget``): at most ``share`` of it, taken from it and given back to
    it, so every source of every session (the agent runs one per job) draws on the same
    descriptors. Beyond it files are re-opened at every read (slower, still correct), or, for
    the kernel sampler, fewer threads are sampled and its health says so. ``FdBudget(limit=n)``
    is a budget of its own, for tests and tiny fixed needs."""

    def __init__(self, limit: int | None = None, share: float = 0.5) -> None:
        self.pool = process_budget() if limit is None else None
        if self.pool is not None:
            limit = max(0, int(self.pool.limit * share))
        self.limit = self.left = limit

    def take(self) -> bool:
        if self.left > 0 and (self.pool is None or self.pool.take()):
            self.left -= 1
            return True
        return False

    def give(self) -> None:
        self.left += 1
        if self.pool is not None:
            self.pool.give()


class _ProcessBudget:
    """The /proc descriptors the whole process may keep open: half the soft RLIMIT_NOFILE less 32,
    at most 4096, so the recording, py-spy's pipes, sockets and Python's own imports never run
    short (``ulimit -n 256`` and a 150-thread target made gputop die with EMFILE: 4 descriptors
    were kept per thread, and the agent paid that once per job)."""

    def __init__(self) -> None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 8192
        self.limit = self.left = max(0, min(4096, soft // 2 - 32))
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.left > 0:
                self.left -= 1
                return True
            return False

    def give(self) -> None:
        with self._lock:
            self.left = min(self.limit, self.left + 1)


_PROCESS_BUDGET: _ProcessBudget | None = None
_PROCESS_BUDGET_LOCK = threading.Lock()


def process_budget() -> _ProcessBudget:
    global _PROCESS_BUDGET
    with _PROCESS_BUDGET_LOCK:
        if _PROCESS_BUDGET is None:
            _PROCESS_BUDGET = _ProcessBudget()
        return _PROCESS_BUDGET


def pread_all(fd: int, size: int) -> bytes:
    data = os.pread(fd, size, 0)
    while len(data) >= size:  # the text may be longer than the guess: read it whole
        size *= 4
        data = os.pread(fd, size, 0)
    return data


class File:
    """A /proc (or cgroup) file kept open and re-read from offset 0 at each read."""

    __slots__ = ("path", "fd", "budget", "size")

    def __init__(self, path: str, budget: FdBudget | None, size: int = 4096) -> None:
        self.path, self.budget, self.size, self.fd = path, budget, size, None
        if budget is not None and budget.take():
            try:
                self.fd = os.open(path, os.O_RDONLY)
            except (FileNotFoundError, ProcessLookupError):
                budget.give()
                raise Gone(path) from None
            except OSError:
                budget.give()
                raise  # PermissionError: the caller decides what that means
        elif not os.path.exists(path):
            raise Gone(path)

    def read(self) -> bytes:
        try:
            if self.fd is not None:
                return pread_all(self.fd, self.size)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                return pread_all(fd, self.size)
            finally:
                os.close(fd)
        except (FileNotFoundError, ProcessLookupError):
            raise Gone(self.path) from None

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
            if self.budget is not None:
                self.budget.give()


def read_small(path: str, size: int = 512) -> bytes | None:
    """The first ``size`` bytes of a file, or None when it cannot be read (gone, denied)."""
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


# ---------------------------------------------------------------------------------------------
# Parsing


def stat_fields(data: bytes, maxsplit: int = -1) -> list[bytes]:
    """The fields of a /proc/.../stat line from field 3 (the state letter) on."""
    return data[data.rfind(b")") + 2:].split(None, maxsplit)


def parse_stat(data: bytes) -> tuple[str, str, list[bytes]]:
    """(name, state letter, fields from field 3 on) of a /proc/.../stat line."""
    r = data.rfind(b")")
    name = data[data.find(b"(") + 1:r].decode("utf-8", "replace")
    fields = data[r + 2:].split()
    return name, fields[0].decode(), fields


# Indexes into parse_stat's fields (man 5 proc field number minus 3).
F_PPID, F_MAJFLT, F_UTIME, F_STIME, F_THREADS, F_RSS = 1, 9, 11, 12, 17, 21


def stat_state(data: bytes) -> bytes:
    """The state letter of a stat line (b"R", b"S", b"Z"...), b"" when it is not one."""
    r = data.rfind(b")")
    return data[r + 2:r + 3] if r >= 0 else b""


def read_ppid(pid: int) -> int | None:
    """The parent PID from /proc/PID/stat, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return int(stat_fields(data, 2)[F_PPID])
    except (IndexError, ValueError):
        return None


def field_after(data: bytes, label: bytes) -> int | None:
    """The number after ``label`` (which starts with a newline) up to the end of its line."""
    i = data.find(label)
    if i < 0:
        return None
    start = i + len(label)
    end = data.find(b"\n", start)
    words = data[start:end if end >= 0 else len(data)].split()
    try:
        return int(words[0])
    except (IndexError, ValueError):
        return None


def parse_ctx(status: bytes) -> tuple[int | None, int | None]:
    """(voluntary, involuntary) context switches from a /proc/.../status text."""
    return (field_after(status, b"\nvoluntary_ctxt_switches:"),
            field_after(status, b"\nnonvoluntary_ctxt_switches:"))


def parse_kv(data: bytes) -> dict[bytes, int]:
    """'name: value [kB]' or 'name value' lines (io, meminfo, vmstat, cpu.stat)."""
    out = {}
    for line in data.split(b"\n"):
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[parts[0].rstrip(b":")] = int(parts[1])
            except ValueError:
                pass
    return out


def read_schedstat(pid: int, tid: int) -> tuple[int, int, int] | None:
    """(ns on a CPU, ns waiting for one, time slices run) of a thread, or None. The slices are
    -1 where the kernel leaves them out."""
    raw = read_small(f"/proc/{pid}/task/{tid}/schedstat", 128)
    if not raw:
        return None
    parts = raw.split()
    try:
        return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else -1
    except (IndexError, ValueError):
        return None


def schedstat_works() -> bool:
    """/proc/PID/task/TID/schedstat gives run time, run-queue wait and time slices of a thread
    (CONFIG_SCHED_INFO). Some kernels have the file but print zeros: this thread has surely
    run, so a zero run time means the numbers are not kept."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as f:
            return int(f.read().split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


# ---------------------------------------------------------------------------------------------
# Liveness


def still_running(pid: int) -> bool:
    """The process exists and is not a zombie (an exited rank its launcher has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(512)
    except OSError:
        return False
    return stat_state(data) not in (b"Z", b"X", b"x", b"")


def pid_exists(pid: int) -> bool:
    """A signal could reach the PID (a zombie counts; another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------
# Is it Python?


def looks_like_python(*names: str | None) -> bool:
    """By name: any of the executable's base name, the command line's first word or the process
    name starts with python or pypy. Cheap; fooled by a renamed binary (``PythonInfo`` is not)."""
    return any(n.startswith(("python", "pypy")) for n in names if n)


def is_python_process(pid: int, name: str | None, cmdline: list[str] | None) -> bool:
    """A Python interpreter: by its executable, else its command line's first word, else its name."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = None
    return looks_like_python(exe, os.path.basename(cmdline[0]) if cmdline else None, name)


_PYTHON_NAME = re.compile(r"^(?:lib)?python(\d+)\.(\d+)(t?)(?:[dmu]*)(?:\.so.*)?$")


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


# ---------------------------------------------------------------------------------------------
# Child roles: the words of ``proc``/``proc_info`` samples' "role" field

ROLE_MAIN = "main"                  # the target itself
ROLE_WORKER = "dataloader_worker"   # a DataLoader worker (or another multiprocessing child of main)
ROLE_CHILD = "child"                # anything else
# multiprocessing's own helpers (resource tracker, fork server). Recorded as ROLE_CHILD: the
# host source says "child" for them; the stack source needs the difference (py-spy skips them).
ROLE_MP_HELPER = "mp_helper"

WORKER_NAMES = ("pt_data_worker",)  # torch >= 1.x names a DataLoader worker's main thread so
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
              "multiprocessing.forkserver")
_MP_HELPERS_B = tuple(h.encode() for h in MP_HELPERS)


def is_mp_helper(cmdline: str | bytes) -> bool:
    """A command line (joined with spaces, or raw /proc/PID/cmdline bytes) of one of
    multiprocessing's helper processes."""
    if isinstance(cmdline, bytes):
        return any(h in cmdline for h in _MP_HELPERS_B)
    return any(h in cmdline for h in MP_HELPERS)


def role_by_name(name: str | bytes, cmdline: str | bytes) -> str:
    """What a child's name and command line alone say: ROLE_WORKER (torch named it),
    ROLE_MP_HELPER, or ROLE_CHILD."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    if name in WORKER_NAMES:
        return ROLE_WORKER
    return ROLE_MP_HELPER if is_mp_helper(cmdline) else ROLE_CHILD


def process_role(proc, main_pid: int, main_cmdline: list[str] | None, parent) -> str:
    """The recorded role of one process of the tree (``proc`` and ``parent`` have ``is_main``,
    ``name``, ``cmdline``, ``ppid``, ``mp_helper``; ``parent`` may be None).

    main: the target. dataloader_worker: a process torch named ``pt_data_worker``, or a Python
    multiprocessing child of the main process (spawn: ``--multiprocessing-fork`` in its command
    line; fork: the same command line as the main process; forkserver: a child of the main
    process's fork server). child: anything else, including multiprocessing's own helpers."""
    if proc.is_main:
        return ROLE_MAIN
    if proc.name in WORKER_NAMES:
        return ROLE_WORKER
    if proc.mp_helper:
        return ROLE_CHILD
    cmd = proc.cmdline or []
    if proc.ppid == main_pid and ("--multiprocessing-fork" in cmd or cmd == main_cmdline):
        return ROLE_WORKER
    if parent is not None and parent.ppid == main_pid and parent.mp_helper \
            and "multiprocessing.forkserver" in " ".join(parent.cmdline or []):
        return ROLE_WORKER
    return ROLE_CHILD
