"""The kernel wait sampler: per thread, which kind of wait it is in, ~25 times a second.

One ``pread`` of /proc/PID/task/TID/syscall says "running" or the system call the thread is
blocked in with its arguments. That is how **GIL wait** is measured: py-spy shows a thread
waiting for the GIL exactly like an idle one, but the kernel shows it blocked in ``futex`` on an
address inside the Python runtime's own static data (``_PyRuntime``'s GIL condition variable, in
the rw segment of the python executable or libpython: ``procfs.PythonInfo``), while a lock,
queue or event wait blocks on heap memory, ``time.sleep`` in ``clock_nanosleep`` and I/O in
``poll``/``read``. Once a second /proc/PID/task/TID/schedstat gives the exact time on a CPU and
waiting for one; ``KernelSampler.harvest`` turns the counts into one ``thread_kernel`` sample's
data per process. The stack source drives it from its own thread (gputop/sources/stacks.py).

A thread that was not scheduled once in the last second (its time slices in schedstat did not
move) sat in one wait all that second, and most threads of a training process do: 31 of the 35
threads of the H200's GPU-bound loop (CUDA's, the intra-op pool's). Such a thread is *parked*:
its system call is read every ``PARK_CHECK_TICKS``-th tick only, the ticks between counted in
the wait it is parked in, which is what reading them would have given while it stays asleep. A
read that finds another wait, or a second in which it was scheduled (schedstat, read each second
anyway), unparks it; so a thread that wakes is counted in its old wait for at most
``PARK_CHECK_TICKS`` ticks (0.2 s at 25 Hz) before it is read every tick again, and its CPU and
run-queue time stay exact (schedstat). That saves ~80% of the reads of a typical torch process.
"""

from __future__ import annotations

import errno
import os
import platform

# The kind and the wait classes (in the column order of a thread_kernel row) live in the
# catalogue; importable from here as before.
from gputop.catalogue import KIND_THREAD_KERNEL, WAIT_CLASSES  # noqa: F401
from gputop.sources.procfs import FdBudget, PythonInfo, read_schedstat, read_small, stat_state

MAX_KERNEL_THREADS = 256      # threads read by the kernel sampler (main process first)
PARK_CHECK_TICKS = 5          # a parked thread's system call is read every 5th tick (module docstring)
NAME_EVERY_HARVESTS = 5       # a known thread's name is read again every 5th harvest (names rarely change)

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
    __slots__ = ("tid", "fd", "counts", "name", "sched0", "t0", "gone", "parked", "skip", "name_age")

    def __init__(self, tid: int, fd: int | None, name: str):
        self.tid = tid
        self.fd = fd
        self.counts = [0] * len(WAIT_CLASSES)
        self.name = name
        self.sched0: tuple[int, int, int] | None = None
        self.t0: float | None = None
        self.gone = False
        self.parked = -1      # the wait class it is parked in, -1 when read every tick
        self.skip = 0         # ticks until a parked thread is read again
        self.name_age = 0     # harvests since its name was read


class _KProc:
    def __init__(self, pid: int):
        self.pid = pid
        self.info = PythonInfo(pid)
        self.threads: dict[int, _KThread] = {}
        self.syscall_denied = False
        self.n_ticks = 0
        self.t0: float | None = None


class KernelSampler:
    """Counts, per thread, how often it is running or blocked in which kind of wait."""

    def __init__(self, max_threads: int = MAX_KERNEL_THREADS):
        self.table = SyscallTable()
        self.arch_known = self.table.known
        self.max_threads = max_threads
        self.procs: dict[int, _KProc] = {}
        self.n_threads = 0
        self.capped = 0
        self.fds = FdBudget()   # its share of the process's /proc descriptors (procfs.FdBudget)

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
            for tid in sorted(keep):
                if tid in proc.threads:
                    continue
                fd = None
                if not proc.syscall_denied:
                    if not self.fds.take():
                        # the process's descriptors are spent (docs/metrics.md, "thread_kernel"):
                        # fewer threads are sampled, and the stack source's health says how many
                        self.capped += 1
                        continue
                    try:
                        fd = os.open(f"/proc/{pid}/task/{tid}/syscall", os.O_RDONLY)
                    except PermissionError:
                        self.fds.give()
                        proc.syscall_denied = True
                    except OSError as e:
                        self.fds.give()
                        if e.errno in (errno.EMFILE, errno.ENFILE):
                            self.capped += 1   # (a thread that ended meanwhile is no cap)
                        continue
                th = _KThread(tid, fd, "")
                th.sched0 = read_schedstat(pid, tid)
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
            self.fds.give()

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
                if th.parked >= 0:
                    th.skip -= 1
                    if th.skip > 0:
                        th.counts[th.parked] += 1
                        continue
                    th.skip = PARK_CHECK_TICKS
                if th.fd is None:
                    th.parked = -1   # (its syscall file was closed: no way to see a wait change)
                    raw = read_small(f"/proc/{proc.pid}/task/{th.tid}/stat", 256)
                    if raw is None:
                        th.gone = True
                        continue
                    # Without /syscall (no ptrace right) only running vs not is known.
                    th.counts[_RUN if stat_state(raw) == b"R" else _OTHER] += 1
                    continue
                try:
                    raw = pread(th.fd, 64, 0)
                except PermissionError:
                    # No ptrace right (the check is made at read time): fall back to stat.
                    proc.syscall_denied = True
                    self._close(th)
                    th.parked = -1
                    continue
                except OSError:
                    th.gone = True
                    continue
                cls = classify(raw, ranges, table)
                th.counts[cls] += 1
                if cls != th.parked:
                    th.parked = -1   # awake, or in another wait: read every tick again

    def harvest(self, now: float, main_pid: int | None = None) -> list[tuple[int, dict]]:
        """(pid, data) of a thread_kernel sample per process; counters start again."""
        out = []
        for proc in list(self.procs.values()):
            rows = []
            for th in list(proc.threads.values()):
                sched = read_schedstat(proc.pid, th.tid)
                th.name_age -= 1
                if th.name_age <= 0 or not th.name:
                    th.name_age = NAME_EVERY_HARVESTS
                    comm = read_small(f"/proc/{proc.pid}/task/{th.tid}/comm", 64)
                    if comm:
                        th.name = comm.decode("utf-8", "replace").strip()
                cpu_s = runq_s = None
                asleep = False
                if sched is not None and th.sched0 is not None and sched[0] >= th.sched0[0]:
                    cpu_s = round((sched[0] - th.sched0[0]) / 1e9, 4)
                    runq_s = round((sched[1] - th.sched0[1]) / 1e9, 4)
                    # not scheduled once since the last harvest: one wait all the while
                    asleep = sched[2] >= 0 and sched[2] == th.sched0[2] and sched[0] == th.sched0[0]
                span = round(now - th.t0, 4) if th.t0 is not None else None
                if sum(th.counts) or cpu_s is not None:
                    rows.append([th.tid, th.name, *th.counts, cpu_s, runq_s, span])
                waits = [i for i, c in enumerate(th.counts) if c]
                if asleep and th.fd is not None and len(waits) == 1 and waits[0] != _RUN:
                    if th.parked != waits[0]:
                        th.parked, th.skip = waits[0], PARK_CHECK_TICKS
                else:
                    th.parked = -1
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

