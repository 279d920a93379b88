"""The host source: the target's process tree, its main process's threads, and the host.

Every tick (2 Hz by default, jittered) it publishes:

- ``system``/"host": host-wide CPU, load, memory, swap rates, and the target's cgroup (CPU
  limit, CFS throttling, memory limit and use);
- ``proc``/PID for every live process of the target's tree (``proc_info`` once per new
  process, and again when its name or role changes, for example after an exec);
- ``thread``/"PID:TID" for every thread of the main process;
- ``target``/PID when the target starts being watched and when it exits;
- ``rank``/PID for every rank of a distributed job in the tree (from the processes'
  environments, read once per new process: gputop/sources/ranks.py);
- ``health``/"host" at start, on change and about every 5 s (with gputop's own sampling cost).

How it stays cheap (budget: ~1% of one core for ~10 processes and ~60 threads at 2 Hz):
per-thread numbers come straight from /proc, and every /proc file read each tick is opened
once and re-read with ``pread(fd, n, 0)`` (procfs regenerates the text on a read from offset
0). On the 2-core CI VM that is ~5 us per thread ``stat`` against ~23 us for Python's
``open().read()`` and ~32 us per thread for ``psutil.Process.threads()`` (which also lacks the
thread names). A held descriptor also pins the identity of the process: once it exits, reads
fail with ESRCH even if its PID is reused. psutil is used for what is read once per process
(command line, user, start time) and for the tree (``Target``).

Context switches are summed over all threads of a process: /proc/PID/status (and psutil's
``num_ctx_switches``) count only the process's *main thread*.

Sources must not import gputop.session: the clock is duck-typed (``clock.now()``).
"""

from __future__ import annotations

import os
import random
import resource
import threading
import time
from collections import deque

from gputop.model import (KIND_HEALTH, KIND_PROC, KIND_PROC_INFO, KIND_SYSTEM, KIND_TARGET,
                          KIND_THREAD, MetricSpec, RateTracker, Sample, clean_float, health_data)
from gputop.sources.ranks import RankFinder

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
HEALTH_EVERY_S = 5.0
MAX_THREAD_ROWS = 256        # more threads than this in the main process: the busiest are shown
LIMIT_REFRESH_S = 5.0        # how often the cgroup's limits (not its counters) are re-read
UNLIMITED = 1 << 60          # cgroup v1 says "no limit" with a huge number (PAGE_COUNTER_MAX)
REFRESH_IDLE_TICKS = 4       # a thread that did not run: re-read its name and state every N ticks
COST_WARN_PCT = 5.0          # own sampling CPU above this (% of one core): health says so

ROLE_MAIN = "main"
ROLE_WORKER = "dataloader_worker"
ROLE_CHILD = "child"
WORKER_NAMES = ("pt_data_worker",)  # torch >= 1.x names a DataLoader worker's main thread so
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
              "multiprocessing.forkserver")

# /proc state letters in the words psutil uses.
STATE_WORDS = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped",
               "t": "tracing-stop", "Z": "zombie", "X": "dead", "x": "dead", "I": "idle",
               "P": "parked", "W": "waking", "K": "wake-kill"}


def _m(kind, field, unit, label, help, aggregate=True):
    return MetricSpec(kind, field, unit, label, help, aggregate)


METRICS: list[MetricSpec] = [
    _m(KIND_SYSTEM, "cpu_pct", "%", "host CPU", "busy share of all cores of the host (100 = every core busy), /proc/stat"),
    _m(KIND_SYSTEM, "cpu_iowait_pct", "%", "iowait", "share of all cores idle while waiting for disk I/O, /proc/stat"),
    _m(KIND_SYSTEM, "cpu_steal_pct", "%", "steal", "share of all cores taken by the hypervisor for other guests (VMs), /proc/stat"),
    _m(KIND_SYSTEM, "cpu_count", "", "cores", "logical CPUs of the host", aggregate=False),
    _m(KIND_SYSTEM, "load1", "", "load 1m", "1-minute load average: runnable + uninterruptible tasks"),
    _m(KIND_SYSTEM, "mem_total", "B", "mem total", "physical memory of the host", aggregate=False),
    _m(KIND_SYSTEM, "mem_available", "B", "mem avail", "memory available for new work without swapping (MemAvailable)"),
    _m(KIND_SYSTEM, "swap_total", "B", "swap total", "swap space of the host", aggregate=False),
    _m(KIND_SYSTEM, "swap_used", "B", "swap used", "swap space in use (SwapTotal - SwapFree)"),
    _m(KIND_SYSTEM, "swap_in_bps", "B/s", "swap in", "bytes read back from swap per second (pswpin x page size)"),
    _m(KIND_SYSTEM, "swap_out_bps", "B/s", "swap out", "bytes written to swap per second (pswpout x page size)"),
    _m(KIND_SYSTEM, "psi_mem_some_pct", "%", "mem stall", "share of time some task was stalled waiting for memory (reclaim, refaults, swap-in), /proc/pressure/memory"),
    _m(KIND_SYSTEM, "psi_mem_full_pct", "%", "mem stall all", "share of time all non-idle tasks were stalled on memory at once"),
    _m(KIND_SYSTEM, "psi_io_some_pct", "%", "io stall", "share of time some task was stalled waiting for I/O, /proc/pressure/io"),
    _m(KIND_SYSTEM, "psi_cpu_some_pct", "%", "cpu stall", "share of time some runnable task waited for a CPU, /proc/pressure/cpu"),
    _m(KIND_SYSTEM, "cgroup_cpu_limit", "cores", "CPU limit", "CPU quota of the target's cgroup in cores (quota / period); none if unlimited"),
    _m(KIND_SYSTEM, "cgroup_throttled_pct", "%", "throttled", "share of the cgroup's CFS periods in which it hit its CPU quota and was paused"),
    _m(KIND_SYSTEM, "cgroup_throttled_ms_per_s", "ms/s", "throttled ms/s", "time the cgroup's tasks spent paused by the CPU quota, per second"),
    _m(KIND_SYSTEM, "cgroup_mem_limit", "B", "cg mem limit", "memory limit of the target's cgroup (tightest of its ancestors); none if unlimited"),
    _m(KIND_SYSTEM, "cgroup_mem_used", "B", "cg mem used", "memory charged to the target's cgroup, page cache included"),
    _m(KIND_PROC, "cpu_pct", "%", "CPU", "CPU time of the process per wall second (100 = one core), user + system"),
    _m(KIND_PROC, "user_pct", "%", "user", "user-mode CPU of the process (100 = one core)"),
    _m(KIND_PROC, "sys_pct", "%", "sys", "kernel-mode CPU of the process (100 = one core)"),
    _m(KIND_PROC, "cpu_wait_pct", "%", "runq wait", "time its threads were ready to run but waited for a CPU (100 = one thread waiting all the time)"),
    _m(KIND_PROC, "rss", "B", "RSS", "resident memory; pages shared with other processes count in each"),
    _m(KIND_PROC, "threads", "", "threads", "number of threads"),
    _m(KIND_PROC, "majflt_ps", "/s", "major faults/s", "page faults per second that had to read from disk or swap (/proc/PID/stat majflt)"),
    _m(KIND_PROC, "ctx_vol_ps", "/s", "vol cs/s", "voluntary context switches per second, all threads (blocking: I/O, locks, the GIL, sleeps)"),
    _m(KIND_PROC, "ctx_invol_ps", "/s", "invol cs/s", "involuntary context switches per second, all threads (preempted: more runnable threads than cores)"),
    _m(KIND_PROC, "io_read_bps", "B/s", "disk read", "bytes the process caused to be read from storage per second (/proc/PID/io read_bytes)"),
    _m(KIND_PROC, "io_write_bps", "B/s", "disk write", "bytes the process caused to be written to storage per second (write_bytes)"),
    _m(KIND_PROC, "io_rchar_bps", "B/s", "read()", "bytes returned by read-like syscalls per second, page cache, pipes and sockets included (rchar)"),
    _m(KIND_PROC, "io_wchar_bps", "B/s", "write()", "bytes passed to write-like syscalls per second (wchar)"),
    _m(KIND_THREAD, "cpu_pct", "%", "CPU", "CPU time of the thread per wall second (100 = one core)"),
    _m(KIND_THREAD, "user_pct", "%", "user", "user-mode CPU of the thread (100 = one core)"),
    _m(KIND_THREAD, "sys_pct", "%", "sys", "kernel-mode CPU of the thread (100 = one core)"),
    _m(KIND_THREAD, "cpu_wait_pct", "%", "runq wait", "time the thread was ready to run but waited for a CPU (100 = all the time)"),
    _m(KIND_THREAD, "ctx_vol_ps", "/s", "vol cs/s", "voluntary context switches of the thread per second"),
    _m(KIND_THREAD, "ctx_invol_ps", "/s", "invol cs/s", "involuntary context switches of the thread per second"),
]


# ---------------------------------------------------------------------------------------------
# Reading /proc cheaply


class _Gone(Exception):
    """The process or thread behind a file no longer exists."""


class _FdBudget:
    """How many /proc files may stay open: half the soft RLIMIT_NOFILE, so gputop's other parts
    (the recording, py-spy pipes, sockets) never run short. Beyond it files are re-opened at
    every read: slower, still correct."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is None:
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            if soft == resource.RLIM_INFINITY:
                soft = 8192
            limit = max(0, min(4096, soft // 2 - 32))
        self.limit = self.left = limit

    def take(self) -> bool:
        if self.left > 0:
            self.left -= 1
            return True
        return False

    def give(self) -> None:
        self.left += 1


def _pread_all(fd: int, size: int) -> bytes:
    data = os.pread(fd, size, 0)
    while len(data) >= size:  # the text may be longer than the guess: read it whole
        size *= 4
        data = os.pread(fd, size, 0)
    return data


class _File:
    """A /proc (or cgroup) file kept open and re-read from offset 0 at each read."""

    __slots__ = ("path", "fd", "budget", "size")

    def __init__(self, path: str, budget: _FdBudget | None, size: int = 4096) -> None:
        self.path, self.budget, self.size, self.fd = path, budget, size, None
        if budget is not None and budget.take():
            try:
                self.fd = os.open(path, os.O_RDONLY)
            except (FileNotFoundError, ProcessLookupError):
                budget.give()
                raise _Gone(path) from None
            except OSError:
                budget.give()
                raise  # PermissionError: the caller decides what that means
        elif not os.path.exists(path):
            raise _Gone(path)

    def read(self) -> bytes:
        try:
            if self.fd is not None:
                return _pread_all(self.fd, self.size)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                return _pread_all(fd, self.size)
            finally:
                os.close(fd)
        except (FileNotFoundError, ProcessLookupError):
            raise _Gone(self.path) from None

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
            if self.budget is not None:
                self.budget.give()


def _parse_stat(data: bytes) -> tuple[str, str, list[bytes]]:
    """(name, state letter, fields from field 3 on) of a /proc/.../stat line. The name is in
    parentheses and may itself hold spaces and ')', so split at the last ')'."""
    r = data.rfind(b")")
    name = data[data.find(b"(") + 1:r].decode("utf-8", "replace")
    fields = data[r + 2:].split()
    return name, fields[0].decode(), fields


# Indexes into _parse_stat's fields (man 5 proc field number minus 3).
F_PPID, F_MAJFLT, F_UTIME, F_STIME, F_THREADS, F_RSS = 1, 9, 11, 12, 17, 21


def _field_after(data: bytes, label: bytes) -> int | None:
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


def _parse_ctx(status: bytes) -> tuple[int | None, int | None]:
    return (_field_after(status, b"\nvoluntary_ctxt_switches:"),
            _field_after(status, b"\nnonvoluntary_ctxt_switches:"))


def _parse_kv(data: bytes) -> dict[bytes, int]:
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


def _pct(x: float | None) -> float | None:
    """A share (1.0 = one core) as a percentage with one decimal. The inputs are differences
    of kernel integers over a positive time, so never NaN or infinite."""
    return None if x is None else round(x * 100.0, 1)


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _bps(x: float | None) -> int | None:
    return None if x is None else int(round(x))


def _schedstat_works() -> bool:
    """/proc/PID/task/TID/schedstat gives run time, run-queue wait and time slices of a thread
    (CONFIG_SCHED_INFO). Some kernels have the file but print zeros: this thread has surely
    run, so a zero run time means the numbers are not kept."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as f:
            return int(f.read().split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


# ---------------------------------------------------------------------------------------------
# The target's cgroup


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _unescape_mount(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


class Cgroup:
    """The target's cgroup: where its CPU quota, throttling and memory numbers live.

    v2: one hierarchy; the limits are the tightest ``cpu.max`` / ``memory.max`` from the
    target's cgroup up to the root. v1: the ``cpu`` and ``memory`` hierarchies; the CPU limit is
    the tightest ``cpu.cfs_quota_us / cpu.cfs_period_us`` up the tree, the memory limit is
    ``memory.stat``'s ``hierarchical_memory_limit``. Throttling counters are read from the
    cgroup that holds the tightest CPU quota (a pod-level quota throttles there, not below).
    Where a controller is mounted in both (a hybrid host), the v1 hierarchy is the one in use.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.version: str | None = None
        self.cpu_dir: str | None = None          # the target's own cgroup (cpu controller)
        self.cpu_limit_dir: str | None = None    # the one whose quota is tightest
        self.cpu_v: str | None = None            # "v1" | "v2"
        self.mem_dir: str | None = None
        self.mem_v: str | None = None
        self.problem: str | None = None
        self.cpu_limit: float | None = None
        self.mem_limit: int | None = None
        self._limits_at = -1e9
        self._budget = _FdBudget(limit=2)
        self._held: dict[str, _File] = {}        # cpu.stat and memory.current (or v1 usage)
        self.discover()

    def discover(self) -> None:
        mounts = _read_text("/proc/self/mountinfo")
        groups = _read_text(f"/proc/{self.pid}/cgroup")
        if mounts is None or groups is None:
            self.problem = "cgroup not readable (/proc/self/mountinfo or /proc/PID/cgroup)"
            return
        v1: dict[str, tuple[str, str]] = {}     # controller -> (mount point, mount root)
        v2: tuple[str, str] | None = None
        for line in mounts.splitlines():
            left, _, right = line.partition(" - ")
            lf, rf = left.split(), right.split()
            if len(lf) < 5 or len(rf) < 3:
                continue
            root, point, fstype = _unescape_mount(lf[3]), _unescape_mount(lf[4]), rf[0]
            if fstype == "cgroup2" and v2 is None:
                v2 = (point, root)
            elif fstype == "cgroup":
                for opt in rf[2].split(","):
                    if opt in ("cpu", "memory") and opt not in v1:
                        v1[opt] = (point, root)
        paths_v1: dict[str, str] = {}
        path_v2: str | None = None
        for line in groups.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            hid, ctrls, path = parts
            if hid == "0" and ctrls == "":
                path_v2 = path
            else:
                for c in ctrls.split(","):
                    paths_v1[c] = path
        v2_ctrls = set()
        if v2 is not None:
            v2_ctrls = set((_read_text(os.path.join(v2[0], "cgroup.controllers")) or "").split())

        def resolve(mount: tuple[str, str], path: str) -> str | None:
            point, root = mount
            rel = path
            if root != "/" and (path == root or path.startswith(root + "/")):
                rel = path[len(root):]
            d = os.path.normpath(point + "/" + rel.lstrip("/"))
            return d if os.path.isdir(d) else None

        found = []
        for ctrl in ("cpu", "memory"):
            d, ver = None, None
            if ctrl in v1 and ctrl in paths_v1:
                d, ver = resolve(v1[ctrl], paths_v1[ctrl]), "v1"
            elif v2 is not None and path_v2 is not None and ctrl in v2_ctrls:
                d, ver = resolve(v2, path_v2), "v2"
            if d is None:
                continue
            found.append(ver)
            if ctrl == "cpu":
                self.cpu_dir, self.cpu_v = d, ver
                self._cpu_mount = v1[ctrl][0] if ver == "v1" else v2[0]
            else:
                self.mem_dir, self.mem_v = d, ver
                self._mem_mount = v1[ctrl][0] if ver == "v1" else v2[0]
        self.version = "+".join(sorted(set(found))) or None
        if not found:
            self.problem = "no cgroup cpu or memory controller found for the target"
        self.refresh_limits(force=True)

    @staticmethod
    def _ancestors(d: str, mount: str) -> list[str]:
        out = [d]
        while d != mount and len(d) > len(mount):
            d = os.path.dirname(d)
            out.append(d)
        return out

    def refresh_limits(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._limits_at < LIMIT_REFRESH_S:
            return
        self._limits_at = now
        if self.cpu_dir is not None:
            best, best_dir = None, None
            for d in self._ancestors(self.cpu_dir, self._cpu_mount):
                if self.cpu_v == "v2":  # "max 100000" or "50000 100000"
                    words = (_read_text(os.path.join(d, "cpu.max")) or "").split() + ["", ""]
                    q, p = _int(words[0]), _int(words[1])
                else:                   # quota -1 = none
                    q = _int(_read_text(os.path.join(d, "cpu.cfs_quota_us")))
                    p = _int(_read_text(os.path.join(d, "cpu.cfs_period_us")))
                if q is not None and p and q > 0 and (best is None or q / p < best):
                    best, best_dir = q / p, d
            self.cpu_limit = best
            self.cpu_limit_dir = best_dir or self.cpu_dir
        if self.mem_dir is not None:
            limit = None
            if self.mem_v == "v2":
                for d in self._ancestors(self.mem_dir, self._mem_mount):
                    # memory.high counts too: above it the kernel throttles and reclaims the
                    # cgroup hard (no OOM kill), which is where a job feels the limit
                    for name in ("memory.max", "memory.high"):
                        value = _int(_read_text(os.path.join(d, name)))  # "max" = none
                        if value is not None and (limit is None or value < limit):
                            limit = value
            else:
                stat = _parse_kv((_read_text(os.path.join(self.mem_dir, "memory.stat")) or "").encode())
                limit = stat.get(b"hierarchical_memory_limit")
                if limit is None:
                    limit = _int(_read_text(os.path.join(self.mem_dir, "memory.limit_in_bytes")))
            self.mem_limit = limit if limit is not None and limit < UNLIMITED else None

    def _read_held(self, path: str) -> bytes | None:
        """A counter file, kept open and re-read with pread (kernfs regenerates it like
        procfs does). None when it is missing or was removed (ENODEV)."""
        f = self._held.get(path)
        try:
            if f is None:
                f = self._held[path] = _File(path, self._budget, 1024)
            return f.read()
        except (_Gone, OSError):
            if f is not None:
                self._held.pop(path, None)
                f.close()
            return None

    def read(self) -> tuple[dict[bytes, int] | None, int | None]:
        """(cpu.stat counters of the limiting cgroup, memory in use) right now."""
        self.refresh_limits()
        want = []
        cpu = mem = None
        if self.cpu_limit_dir is not None:
            want.append(os.path.join(self.cpu_limit_dir, "cpu.stat"))
            data = self._read_held(want[-1])
            cpu = _parse_kv(data) if data is not None else None
        if self.mem_dir is not None:
            name = "memory.current" if self.mem_v == "v2" else "memory.usage_in_bytes"
            want.append(os.path.join(self.mem_dir, name))
            data = self._read_held(want[-1])
            mem = _field_after(b"\n" + data, b"\n") if data is not None else None
        for path in [p for p in self._held if p not in want]:  # the limiting cgroup moved
            self._held.pop(path).close()
        return cpu, mem

    def close(self) -> None:
        for f in self._held.values():
            f.close()
        self._held.clear()

    def describe(self) -> dict:
        return {"version": self.version, "cpu_dir": self.cpu_dir, "cpu_limit_dir": self.cpu_limit_dir,
                "cpu_version": self.cpu_v, "memory_dir": self.mem_dir, "memory_version": self.mem_v,
                "cpu_limit": self.cpu_limit, "mem_limit": self.mem_limit, "problem": self.problem}


# ---------------------------------------------------------------------------------------------
# Processes and threads


class _Task:
    """One thread: its open files and its latest counters."""

    __slots__ = ("stat", "status", "schedstat", "run_ns", "wait_ns", "vol", "invol", "utime",
                 "stime", "name", "state", "prev", "t")

    def __init__(self, base: str, budget: _FdBudget, with_stat: bool, with_schedstat: bool) -> None:
        self.stat = self.status = self.schedstat = None
        try:
            self.status = _File(base + "/status", budget)
            if with_schedstat:
                self.schedstat = _File(base + "/schedstat", budget, 256)
            if with_stat:
                self.stat = _File(base + "/stat", budget, 1024)
        except BaseException:
            self.close()
            raise
        self.run_ns: int | None = None
        self.wait_ns: int | None = None
        self.vol = self.invol = self.utime = self.stime = 0
        self.name, self.state = "", "?"
        self.prev: tuple | None = None   # (utime, stime, vol, invol, wait_ns) at time t
        self.t = 0.0

    def read(self, refresh: bool) -> None:
        """Read the thread's counters. A thread that has not run since the last read (its
        run time in schedstat did not move) cannot have switched or used CPU: its stat and
        status are read again only every few ticks (``refresh``), for its name and state.
        Raises _Gone when the thread has exited."""
        if self.schedstat is not None:
            sched = self.schedstat.read().split()
            run_ns, self.wait_ns = int(sched[0]), int(sched[1])
            ran, self.run_ns = run_ns != self.run_ns, run_ns
            if not (ran or refresh):
                return
        vol, invol = _parse_ctx(self.status.read())
        if vol is not None and invol is not None:
            self.vol, self.invol = vol, invol
        if self.stat is not None:
            self.name, self.state, f = _parse_stat(self.stat.read())
            self.utime, self.stime = int(f[F_UTIME]), int(f[F_STIME])

    def close(self) -> None:
        for f in (self.stat, self.status, self.schedstat):
            if f is not None:
                f.close()


class _Proc:
    """One process of the tree: open files, rates and what was last said about it."""

    def __init__(self, pid: int, is_main: bool, budget: _FdBudget) -> None:
        self.pid, self.is_main = pid, is_main
        self.base = f"/proc/{pid}"
        self.stat = _File(self.base + "/stat", budget, 1024)
        try:
            self.io: _File | None = _File(self.base + "/io", budget, 512)
            self.io_denied = False
        except PermissionError:
            self.io, self.io_denied = None, True
        except _Gone:
            self.stat.close()
            raise
        self.tasks: dict[int, _Task] = {}
        self.relist = True         # list /proc/PID/task again at the next read
        self.dead = [0, 0, 0]      # vol, invol, wait_ns of threads that exited
        self.rates = RateTracker()
        self.name = ""
        self.cmdline: list[str] | None = None
        self.mp_helper = False
        self.ppid: int | None = None
        self.role = ""
        self.info_said: tuple | None = None   # (name, role) last published as proc_info

    def close(self) -> None:
        self.stat.close()
        if self.io is not None:
            self.io.close()
        for task in self.tasks.values():
            task.close()
        self.tasks.clear()

    def retire(self, tid: int) -> None:
        task = self.tasks.pop(tid)
        self.dead[0] += task.vol
        self.dead[1] += task.invol
        self.dead[2] += task.wait_ns or 0
        task.close()


# ---------------------------------------------------------------------------------------------
# The source


class HostSource:
    name = "host"

    def __init__(self, clock, target, interval_s: float = 0.5) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.clock = clock
        self.target = target
        self.interval_s = float(interval_s)
        self._rng = random.Random()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._emit = None
        self._budget = _FdBudget()
        self._procs: dict[int, _Proc] = {}
        self._skip: set[int] = set()              # zombies of the tree: nothing to sample
        self._sys_rates = RateTracker()
        self._cpu_prev: tuple[int, int, int, int] | None = None
        self._cg_prev: tuple | None = None         # (periods, throttled, usec, t, cgroup dir)
        self._sys_files: dict[str, _File] = {}
        self._psi_missing: set[str] = set()          # /proc/pressure files this kernel lacks
        self._has_schedstat = _schedstat_works()
        self.target_state: str | None = None       # None until the first tick
        self.target_exit_t: float | None = None
        self.cpu_count = os.cpu_count() or 1
        self.mem_total: int | None = None
        try:
            self.cgroup: Cgroup | None = Cgroup(target.pid)
        except Exception as e:  # never let a strange cgroup layout stop the source
            self.cgroup = None
            self._cgroup_error = f"cgroup: {type(e).__name__}: {e}"
        else:
            self._cgroup_error = self.cgroup.problem
        # Accounting of our own cost (read by health and benchmarks/host_cost.py).
        self.ticks = 0
        self.cpu_s = 0.0                           # thread CPU time spent in ticks
        # Thread CPU seconds by phase of the tick (benchmarks/host_cost.py prints them).
        # system: /proc/stat, meminfo, vmstat, cgroup; main: the main process and its threads'
        # counters; tree: finding the descendants; children: their counters; rows: building
        # the samples; emit: handing them to the bus (the store and the recorder's queue).
        self.phase_s = {"system": 0.0, "main": 0.0, "tree": 0.0, "children": 0.0, "rows": 0.0, "emit": 0.0}
        self.tick_wall_s: deque[float] = deque(maxlen=4096)
        self._health_said: tuple | None = None
        self._health_at = -1e9
        self._health_cpu = (0.0, 0.0, 0)           # (cpu_s, monotonic, ticks) at last health
        self._cost_pct: float | None = None         # own CPU, % of one core, last window
        self._error: str | None = None
        self._thread_rows_capped = 0
        self._n_threads = 0
        self.ranks = RankFinder(target.pid)

    # -- Source protocol ------------------------------------------------------------------
    def start(self, emit) -> None:
        if self._thread is not None:
            return
        self._emit = emit
        self._thread = threading.Thread(target=self._run, name="gputop-host", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close_all()

    def describe(self) -> dict:
        return {
            "interval_s": self.interval_s,
            "rate_hz": round(1.0 / self.interval_s, 3),
            "jitter": "interval x (0.5 + Exp(mean 0.5)), capped at 3x",
            "cpu_count": self.cpu_count,
            "mem_total": self.mem_total if self.mem_total is not None else self._mem_total_now(),
            "page_size": PAGE_SIZE,
            "clk_tck": CLK_TCK,
            "cgroup": self.cgroup.describe() if self.cgroup else {"problem": self._cgroup_error},
            "thread_rows": f"threads of the main process (at most {MAX_THREAD_ROWS}, busiest first)",
            "fd_budget": self._budget.limit,
            "ranks": "RANK / OMPI_COMM_WORLD_RANK / PMI_RANK / SLURM_PROCID from /proc/PID/environ, once per new process",
        }

    # -- the loop ---------------------------------------------------------------------------
    def _next_delay(self) -> float:
        """A jittered interval: never periodic, so samples cannot lock onto a training step's
        period. Mean ~ interval_s, never below half of it or above three times it."""
        return self.interval_s * min(3.0, 0.5 + self._rng.expovariate(2.0))

    def _run(self) -> None:
        while not self._stop.is_set():
            # The next tick is due a jittered delay after this one *started*: a late tick
            # (a busy box) pushes the next one back instead of causing a burst to catch up.
            due = time.monotonic() + self._next_delay()
            self._tick_guarded()
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
        self._close_all()

    def _tick_guarded(self) -> None:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        t = self.clock.now()
        try:
            self._tick(t)
            self._error = None
        except Exception as e:  # a bug or a surprise of the machine: say it, keep going
            self._error = f"{type(e).__name__}: {e}"
        wall = time.perf_counter() - wall0
        self.cpu_s += time.thread_time() - cpu0
        self.ticks += 1
        self.tick_wall_s.append(wall)
        try:
            self._maybe_health(t)
        except Exception:
            pass

    def _tick(self, t: float) -> None:
        emit = self._emit
        p0 = time.thread_time()
        system = self._sample_system(t)
        p1 = time.thread_time()
        emit(Sample(t, KIND_SYSTEM, "host", system))
        p2 = time.thread_time()
        self.phase_s["system"] += p1 - p0
        self.phase_s["emit"] += p2 - p1
        if self.target_state != "exited":
            self._sample_tree(t)

    # -- system -----------------------------------------------------------------------------
    def _sys_file(self, path: str, size: int) -> _File:
        f = self._sys_files.get(path)
        if f is None:
            f = self._sys_files[path] = _File(path, self._budget, size)
        return f

    @staticmethod
    def _mem_total_now() -> int | None:
        """For describe() before the first tick (another thread: no held files here)."""
        try:
            with open("/proc/meminfo", "rb") as f:
                kib = _field_after(b"\n" + f.read(), b"\nMemTotal:")
        except OSError:
            return None
        return None if kib is None else kib * 1024

    def _sample_system(self, t: float) -> dict:
        d: dict = {"cpu_count": self.cpu_count}
        try:
            line = self._sys_file("/proc/stat", 1024).read().split(b"\n", 1)[0].split()
            v = [int(x) for x in line[1:9]] + [0] * (9 - len(line))
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            total = user + nice + system + idle + iowait + irq + softirq + steal
            busy = total - idle - iowait
            cur = (total, busy, iowait, steal)
            prev, self._cpu_prev = self._cpu_prev, cur
            if prev is not None and cur[0] > prev[0]:
                dt = cur[0] - prev[0]
                d["cpu_pct"] = clean_float(100.0 * (cur[1] - prev[1]) / dt, 1)
                d["cpu_iowait_pct"] = clean_float(100.0 * (cur[2] - prev[2]) / dt, 1)
                d["cpu_steal_pct"] = clean_float(100.0 * (cur[3] - prev[3]) / dt, 1)
            else:
                d["cpu_pct"] = d["cpu_iowait_pct"] = d["cpu_steal_pct"] = None
        except (_Gone, OSError, ValueError, IndexError):
            d["cpu_pct"] = d["cpu_iowait_pct"] = d["cpu_steal_pct"] = None
        try:
            d["load1"] = round(os.getloadavg()[0], 2)
        except OSError:
            d["load1"] = None
        try:
            mem = b"\n" + self._sys_file("/proc/meminfo", 8192).read()
        except (_Gone, OSError):
            mem = b""
        kib = lambda label: None if (v := _field_after(mem, label)) is None else v * 1024  # noqa: E731
        d["mem_total"] = kib(b"\nMemTotal:")
        self.mem_total = d["mem_total"] or self.mem_total
        d["mem_available"] = kib(b"\nMemAvailable:")
        d["swap_total"] = kib(b"\nSwapTotal:")
        free = kib(b"\nSwapFree:")
        d["swap_used"] = d["swap_total"] - free if d["swap_total"] is not None and free is not None else None
        try:
            vm = b"\n" + self._sys_file("/proc/vmstat", 16384).read()
        except (_Gone, OSError):
            vm = b""
        rates = self._sys_rates
        pin, pout = _field_after(vm, b"\npswpin "), _field_after(vm, b"\npswpout ")
        d["swap_in_bps"] = _bps(rates.rate("swpin", None if pin is None else pin * PAGE_SIZE, t))
        d["swap_out_bps"] = _bps(rates.rate("swpout", None if pout is None else pout * PAGE_SIZE, t))
        self._sample_pressure(t, d)
        self._sample_cgroup(t, d)
        return d

    def _sample_pressure(self, t: float, d: dict) -> None:
        """Pressure stall information (Linux >= 4.20): the share of wall time in which some (or
        all) runnable tasks were stalled on memory, I/O or CPU, from the cumulative ``total=``
        microsecond counters over our own interval (not the kernel's 10 s average, which lags)."""
        rates = self._sys_rates
        for res, lines in (("mem", ("some", "full")), ("io", ("some",)), ("cpu", ("some",))):
            path = f"/proc/pressure/{'memory' if res == 'mem' else res}"
            try:
                text = self._sys_file(path, 256).read() if path not in self._psi_missing else b""
            except (_Gone, OSError):
                self._psi_missing.add(path)
                text = b""
            for which in lines:
                total = None
                for line in text.split(b"\n"):
                    if line.startswith(which.encode()):
                        _, _, tail = line.rpartition(b"total=")
                        total = int(tail) if tail.strip().isdigit() else None
                rate = rates.rate(f"psi_{res}_{which}", None if total is None else total / 1e6, t)
                d[f"psi_{res}_{which}_pct"] = None if rate is None else clean_float(min(100.0, 100.0 * rate), 2)

    def _sample_cgroup(self, t: float, d: dict) -> None:
        d["cgroup_cpu_limit"] = d["cgroup_throttled_pct"] = d["cgroup_throttled_ms_per_s"] = None
        d["cgroup_mem_limit"] = d["cgroup_mem_used"] = None
        cg = self.cgroup
        if cg is None:
            return
        cpu, mem = cg.read()
        d["cgroup_cpu_limit"] = clean_float(cg.cpu_limit, 3)
        d["cgroup_mem_limit"] = cg.mem_limit
        d["cgroup_mem_used"] = mem
        if cpu is None:
            self._cg_prev = None
            return
        periods, throttled = cpu.get(b"nr_periods"), cpu.get(b"nr_throttled")
        usec = cpu.get(b"throttled_usec")
        if usec is None and b"throttled_time" in cpu:  # v1 counts nanoseconds
            usec = cpu[b"throttled_time"] // 1000
        if periods is None or throttled is None or usec is None:
            self._cg_prev = None
            return
        cur = (periods, throttled, usec, t, cg.cpu_limit_dir)
        prev, self._cg_prev = self._cg_prev, cur
        if cg.cpu_limit is None or prev is None or prev[4] != cur[4] or t <= prev[3] \
                or periods < prev[0] or usec < prev[2]:
            return  # unlimited, first reading, another cgroup's counters, or a reset
        dp = periods - prev[0]
        if dp > 0:
            d["cgroup_throttled_pct"] = clean_float(100.0 * (throttled - prev[1]) / dp, 1)
        d["cgroup_throttled_ms_per_s"] = clean_float((usec - prev[2]) / 1000.0 / (t - prev[3]), 2)

    # -- the tree ---------------------------------------------------------------------------
    def _sample_tree(self, t: float) -> None:
        clock = time.thread_time
        p0 = clock()
        main_pid = self.target.pid
        main = self._procs.get(main_pid)
        if main is None:
            try:
                main = self._procs[main_pid] = _Proc(main_pid, True, self._budget)
            except _Gone:
                self._target_exited(t)
                return
        try:
            main_stat = self._read_proc(main, t)
        except _Gone:
            self._target_exited(t)
            return
        if self.target_state is None:
            self.target_state = "running"
            self._emit(Sample(t, KIND_TARGET, str(main_pid), self._target_data("running")))
        p1 = clock()
        tree = self.target.tree(max_age_s=min(0.2, self.interval_s / 2))
        p2 = clock()
        by_pid = {p.pid: p for p in tree}
        for pid in list(self._procs):
            if pid not in by_pid:
                self._procs.pop(pid).close()
        self._skip &= set(by_pid)
        stats = {main_pid: main_stat}
        for pid in by_pid:
            if pid == main_pid or pid in self._skip:
                continue
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = _Proc(pid, False, self._budget)
                stats[pid] = self._read_proc(proc, t)
            except (_Gone, OSError) as e:
                gone = self._procs.pop(pid, None)
                if gone is not None:
                    gone.close()
                if isinstance(e, _Gone):
                    self._skip.add(pid)  # a zombie: nothing to read until it is reaped
        # The parents just read decide: a process whose parent exited was re-parented out of
        # the tree (the tree's cached parents are re-checked only every second).
        kids: dict[int, list[int]] = {}
        for pid, data in stats.items():
            kids.setdefault(data["ppid"], []).append(pid)
        inside, queue = {main_pid}, [main_pid]
        while queue:
            for kid in kids.get(queue.pop(), ()):
                if kid not in inside:
                    inside.add(kid)
                    queue.append(kid)
        p3 = clock()
        out: list[Sample] = []
        for pid, data in stats.items():
            if pid not in inside:
                continue
            proc = self._procs[pid]
            self._update_identity(proc, by_pid.get(pid), data.pop("_name"))
            data["role"] = proc.role
            if proc.info_said != (proc.name, proc.role):
                proc.info_said = (proc.name, proc.role)
                out.append(Sample(t, KIND_PROC_INFO, str(pid), self._info(proc, by_pid.get(pid))))
            out.append(Sample(t, KIND_PROC, str(pid), data))
        out.extend(self._thread_samples(main, t))
        out.extend(self.ranks.update(t, {pid: (stats[pid]["ppid"], self._procs[pid].name, self._procs[pid].cmdline)
                                         for pid in inside}))
        p4 = clock()
        for s in out:
            self._emit(s)
        p5 = clock()
        ph = self.phase_s
        ph["main"] += p1 - p0
        ph["tree"] += p2 - p1
        ph["children"] += p3 - p2
        ph["rows"] += p4 - p3
        ph["emit"] += p5 - p4

    def _read_proc(self, proc: _Proc, t: float) -> dict:
        """One process's numbers now. Raises _Gone when it exited (a zombie counts as gone)."""
        name, state, f = _parse_stat(proc.stat.read())
        if state in ("Z", "X", "x"):
            raise _Gone(proc.base)
        nthreads = int(f[F_THREADS])
        utime, stime = int(f[F_UTIME]), int(f[F_STIME])
        majflt = int(f[F_MAJFLT])
        proc.ppid = int(f[F_PPID])
        # Threads: context switches and run-queue waits are per thread in Linux. The task
        # directory is listed again only when the thread count changed or a thread vanished
        # (a held file of an exited thread fails with ESRCH): same count, all readable = same set.
        if nthreads <= 1 and not proc.is_main:
            tids = [proc.pid]
        elif nthreads == len(proc.tasks) and not proc.relist:
            tids = list(proc.tasks)
        else:
            try:
                tids = [int(x) for x in os.listdir(proc.base + "/task")]
            except FileNotFoundError:
                raise _Gone(proc.base) from None
        proc.relist = False
        seen = set()
        refresh_every = REFRESH_IDLE_TICKS
        for tid in tids:
            task = proc.tasks.get(tid)
            try:
                if task is None:
                    task = proc.tasks[tid] = _Task(f"{proc.base}/task/{tid}", self._budget, proc.is_main,
                                                   self._has_schedstat)
                task.read(refresh=(self.ticks + tid) % refresh_every == 0)
            except (_Gone, OSError, ValueError, IndexError):
                proc.relist = True
                continue
            seen.add(tid)
        if len(seen) != len(proc.tasks):
            for tid in [x for x in proc.tasks if x not in seen]:
                proc.retire(tid)
        live = proc.tasks.values()
        vol = proc.dead[0] + sum(x.vol for x in live)
        invol = proc.dead[1] + sum(x.invol for x in live)
        wait_ns = None if not self._has_schedstat else proc.dead[2] + sum(x.wait_ns or 0 for x in live)
        r = proc.rates
        cpu = r.rate("cpu", (utime + stime) / CLK_TCK, t)
        user = r.rate("user", utime / CLK_TCK, t)
        sys_ = r.rate("sys", stime / CLK_TCK, t)
        wait = r.rate("wait", None if wait_ns is None else wait_ns / 1e9, t)
        d = {
            "_name": name,
            "ppid": proc.ppid,
            "name": name,
            "cpu_pct": _pct(cpu), "user_pct": _pct(user), "sys_pct": _pct(sys_), "cpu_wait_pct": _pct(wait),
            "rss": int(f[F_RSS]) * PAGE_SIZE,
            "threads": nthreads,
            "majflt_ps": _r1(r.rate("majflt", majflt, t)),
            "ctx_vol_ps": _r1(r.rate("vol", vol, t)),
            "ctx_invol_ps": _r1(r.rate("invol", invol, t)),
            "io_read_bps": None, "io_write_bps": None, "io_rchar_bps": None, "io_wchar_bps": None,
            "state": STATE_WORDS.get(state, state),
        }
        if proc.io is not None:
            try:
                io = _parse_kv(proc.io.read())
            except PermissionError:
                proc.io, proc.io_denied = None, True
                io = {}
            d["io_read_bps"] = _bps(r.rate("rb", io.get(b"read_bytes"), t))
            d["io_write_bps"] = _bps(r.rate("wb", io.get(b"write_bytes"), t))
            d["io_rchar_bps"] = _bps(r.rate("rc", io.get(b"rchar"), t))
            d["io_wchar_bps"] = _bps(r.rate("wc", io.get(b"wchar"), t))
        return d

    def _update_identity(self, proc: _Proc, ps_proc, name: str) -> None:
        """Name, command line and role. The command line is read again only when the name
        changes (an exec, or torch renaming a DataLoader worker)."""
        if proc.cmdline is None or name != proc.name:
            proc.cmdline = self._cmdline(proc, ps_proc)
            joined = " ".join(proc.cmdline)
            proc.mp_helper = any(h in joined for h in MP_HELPERS)
        proc.name = name
        proc.role = self._role(proc)

    @staticmethod
    def _cmdline(proc: _Proc, ps_proc) -> list[str]:
        try:
            if ps_proc is not None:
                return ps_proc.cmdline()
            with open(proc.base + "/cmdline", "rb") as f:
                return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except Exception:
            return []

    def _role(self, proc: _Proc) -> str:
        """main: the target. dataloader_worker: a process torch named ``pt_data_worker``, or a
        Python multiprocessing child of the main process (spawn: ``--multiprocessing-fork`` in
        its command line; fork: the same command line as the main process; forkserver: a child
        of the main process's fork server). child: anything else, including multiprocessing's
        own helpers (resource tracker, fork server)."""
        if proc.is_main:
            return ROLE_MAIN
        if proc.name in WORKER_NAMES:
            return ROLE_WORKER
        if proc.mp_helper:
            return ROLE_CHILD
        main_pid = self.target.pid
        cmd = proc.cmdline or []
        if proc.ppid == main_pid and ("--multiprocessing-fork" in cmd or cmd == self.target.cmdline):
            return ROLE_WORKER
        parent = self._procs.get(proc.ppid) if proc.ppid is not None else None
        if parent is not None and parent.ppid == main_pid and parent.mp_helper \
                and "multiprocessing.forkserver" in " ".join(parent.cmdline or []):
            return ROLE_WORKER
        return ROLE_CHILD

    @staticmethod
    def _info(proc: _Proc, ps_proc) -> dict:
        create_time = user = None
        if ps_proc is not None:
            try:
                create_time = round(ps_proc.create_time(), 2)
            except Exception:
                pass
            try:
                user = ps_proc.username()
            except Exception:
                pass
        return {"name": proc.name, "cmdline": list(proc.cmdline or []), "ppid": proc.ppid,
                "create_time": create_time, "role": proc.role, "user": user}

    def _thread_samples(self, main: _Proc, t: float) -> list[Sample]:
        """Rows for the main process's threads, from the counters ``_read_proc`` just read."""
        rows = []
        for tid, task in main.tasks.items():
            if task.stat is None or not task.name:
                continue
            cpu = user = sys_ = wait = vol = invol = None
            prev = task.prev
            if prev is not None and t > task.t:
                dt = t - task.t
                du, ds = task.utime - prev[0], task.stime - prev[1]
                if du >= 0 and ds >= 0:
                    user, sys_ = du / CLK_TCK / dt, ds / CLK_TCK / dt
                    cpu = user + sys_
                if task.vol >= prev[2] and task.invol >= prev[3]:
                    vol, invol = (task.vol - prev[2]) / dt, (task.invol - prev[3]) / dt
                if task.wait_ns is not None and prev[4] is not None and task.wait_ns >= prev[4]:
                    wait = (task.wait_ns - prev[4]) / 1e9 / dt
            task.prev = (task.utime, task.stime, task.vol, task.invol, task.wait_ns)
            task.t = t
            rows.append((cpu or 0.0, tid, {
                "name": task.name, "state": STATE_WORDS.get(task.state, task.state),
                "cpu_pct": _pct(cpu), "user_pct": _pct(user), "sys_pct": _pct(sys_),
                "cpu_wait_pct": _pct(wait),
                "ctx_vol_ps": _r1(vol), "ctx_invol_ps": _r1(invol),
            }))
        self._n_threads = len(rows)
        self._thread_rows_capped = max(0, len(rows) - MAX_THREAD_ROWS)
        if self._thread_rows_capped:
            rows.sort(key=lambda r: -r[0])
            rows = rows[:MAX_THREAD_ROWS]
        key = f"{main.pid}:"
        return [Sample(t, KIND_THREAD, key + str(tid), data) for _c, tid, data in rows]

    # -- the target's life ------------------------------------------------------------------
    def _target_data(self, state: str) -> dict:
        d = {"state": state, "pid": self.target.pid, "command": self.target.command,
             "python": bool(self.target.is_python())}
        if state == "exited":
            d["exit_t"] = self.target_exit_t
        return d

    def _target_exited(self, t: float) -> None:
        self.target_state = "exited"
        self.target_exit_t = round(t, 3)
        try:
            self.target.note_exited()
        except AttributeError:
            pass
        self._close_procs()
        for s in self.ranks.end_all(t):
            self._emit(s)
        self._emit(Sample(t, KIND_TARGET, str(self.target.pid), self._target_data("exited")))
        self._maybe_health(t, force=True)

    def _close_procs(self) -> None:
        for proc in self._procs.values():
            proc.close()
        self._procs.clear()
        self._n_threads = 0
        self._thread_rows_capped = 0

    def _close_all(self) -> None:
        self._close_procs()
        for f in self._sys_files.values():
            f.close()
        self._sys_files.clear()
        if self.cgroup is not None:
            self.cgroup.close()

    # -- health -----------------------------------------------------------------------------
    def _maybe_health(self, t: float, force: bool = False) -> None:
        problems = []
        if self._error:
            problems.append(f"sampling failed: {self._error}")
        if self.target_state == "exited":
            problems.append(f"the target (PID {self.target.pid}) exited at t={self.target_exit_t:.1f} s: "
                            f"its process and thread samples stopped, host-wide samples go on")
        denied = sorted(p.pid for p in self._procs.values() if p.io_denied)
        if denied:
            shown = ", ".join(map(str, denied[:5])) + (" ..." if len(denied) > 5 else "")
            problems.append(f"I/O counters not readable for PID {shown}: run gputop as the same user or root")
        if self._cgroup_error:
            problems.append(self._cgroup_error)
        env_denied = sorted(self.ranks.denied)
        if env_denied:
            shown = ", ".join(map(str, env_denied[:5])) + (" ..." if len(env_denied) > 5 else "")
            problems.append(f"environment of PID {shown} not readable (another user's process): their ranks "
                            f"come from the in-process probe only; run gputop as the same user or root")
        if self._thread_rows_capped:
            problems.append(f"the main process has {self._n_threads} threads: only the busiest "
                            f"{MAX_THREAD_ROWS} are shown")
        now = time.monotonic()
        cpu0, at0, ticks0 = self._health_cpu
        window = now - at0 >= 1.0 and at0 > 0   # a cost over a shorter window is noise
        cost = 100.0 * (self.cpu_s - cpu0) / (now - at0) if window else self._cost_pct
        if cost is not None and cost > COST_WARN_PCT:
            problems.append(f"sampling costs {cost:.1f}% of a core ({len(self._procs)} processes, "
                            f"{self._n_threads} threads): more than planned")
        state = "failed" if self._error and self.ticks and self.target_state is None else (
            "degraded" if problems else "ok")
        message = "; ".join(problems) if problems else (
            f"sampling the target's processes and threads and the host every ~{self.interval_s:g} s (jittered)")
        said = (state, message)
        if not force and said == self._health_said and t - self._health_at < HEALTH_EVERY_S:
            return
        recent = list(self.tick_wall_s)[-max(1, self.ticks - ticks0):] if self.tick_wall_s else []
        self._health_said, self._health_at = said, t
        if window or at0 == 0:
            self._health_cpu = (self.cpu_s, now, self.ticks)
            self._cost_pct = cost
        self._emit(Sample(t, KIND_HEALTH, self.name, health_data(
            state, message, rate_hz=round(1.0 / self.interval_s, 3),
            target_state=self.target_state, procs=len(self._procs), threads=self._n_threads,
            ranks=len(self.ranks.running),
            cost_pct=clean_float(cost, 2),
            tick_ms=clean_float(1000.0 * sum(recent) / len(recent), 2) if recent else None,
            cgroup=self.cgroup.version if self.cgroup else None)))
