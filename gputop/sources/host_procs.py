"""The host source's readers of one process and its threads: the /proc files it keeps open
(``procfs.File``), the latest counters, and what was last said about the process."""

from __future__ import annotations

import time

from gputop.model import RateTracker
from gputop.sources.procfs import F_STIME, F_UTIME, FdBudget, File, Gone, parse_ctx, parse_stat


class TaskFiles:
    """One thread: its open files and its latest counters."""

    __slots__ = ("stat", "status", "schedstat", "run_ns", "wait_ns", "vol", "invol", "utime",
                 "stime", "name", "state", "prev", "t")

    def __init__(self, base: str, budget: FdBudget, with_stat: bool, with_schedstat: bool) -> None:
        self.stat = self.status = self.schedstat = None
        try:
            self.status = File(base + "/status", budget)
            if with_schedstat:
                self.schedstat = File(base + "/schedstat", budget, 256)
            if with_stat:
                self.stat = File(base + "/stat", budget, 1024)
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
        Raises Gone when the thread has exited."""
        if self.schedstat is not None:
            sched = self.schedstat.read().split()
            run_ns, self.wait_ns = int(sched[0]), int(sched[1])
            ran, self.run_ns = run_ns != self.run_ns, run_ns
            if not (ran or refresh):
                return
        vol, invol = parse_ctx(self.status.read())
        if vol is not None and invol is not None:
            self.vol, self.invol = vol, invol
        if self.stat is not None:
            self.name, self.state, f = parse_stat(self.stat.read())
            self.utime, self.stime = int(f[F_UTIME]), int(f[F_STIME])

    def close(self) -> None:
        for f in (self.stat, self.status, self.schedstat):
            if f is not None:
                f.close()


YOUNG_CMDLINE_TICKS = 5   # a new process's command line is read again at its first 5 ticks...
YOUNG_CMDLINE_S = 15.0    # ...and for its first 15 s in sight: on a loaded machine a launcher's
#                           fork-to-exec (torchrun's) outlasted 5 ticks, and the rank went unnamed


class ProcFiles:
    """One process of the tree: open files, rates and what was last said about it."""

    def __init__(self, pid: int, is_main: bool, budget: FdBudget) -> None:
        self.pid, self.is_main = pid, is_main
        self.base = f"/proc/{pid}"
        self.stat = File(self.base + "/stat", budget, 1024)
        try:
            self.io: File | None = File(self.base + "/io", budget, 512)
            self.io_denied = False
        except PermissionError:
            self.io, self.io_denied = None, True
        except Gone:
            self.stat.close()
            raise
        self.tasks: dict[int, TaskFiles] = {}
        self.relist = True         # list /proc/PID/task again at the next read
        self.dead = [0, 0, 0]      # vol, invol, wait_ns of threads that exited
        self.rates = RateTracker()
        self.name = ""
        self.cmdline: list[str] | None = None
        # ticks left in which the command line is read again whatever the name: a process first
        # seen between its fork and its exec shows its parent's, and torchrun's ranks keep the
        # launcher's name ("python") across the exec (host.py: _update_identity)
        self.young_ticks = YOUNG_CMDLINE_TICKS
        self.young_until = time.monotonic() + YOUNG_CMDLINE_S
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
