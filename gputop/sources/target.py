"""The target: the process gputop watches, and its tree of descendants.

Shared by the sources: the host source samples every process of the tree, the NVML source
picks the GPUs the tree uses, the stack source samples the main process and its children.

Finding the tree is the part that costs: psutil's ``children(recursive=True)`` reads
/proc/PID/stat of *every* process on the machine each time (3.6 ms for 80 processes on the
2-core CI VM; tens of ms on a busy GPU box). ``tree()`` instead keeps a map PID -> parent PID
and reads the stat file only of processes it has not seen before, so a refresh costs one
``listdir("/proc")`` plus the new processes. Every ``VERIFY_S`` it also re-reads the parent of
each member of the tree, to drop the children of a process that exited (even as a zombie not
yet reaped: its children were re-parented away at once); the host source, which reads every
member's stat anyway, drops such orphans at its next tick. The whole map is re-read every
``FULL_RESCAN_S`` seconds, for the rare orphan re-parented *onto* a process of the tree (a
sub-reaper).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import psutil

from gputop.sources.procfs import TREE_MAX_AGE_S, looks_like_python, read_ppid

FULL_RESCAN_S = 30.0
VERIFY_S = 1.0   # how often the cached parents of the tree's members are read again


class TargetError(Exception):
    """The target cannot be watched. The message is one line for the user."""


class Target:
    def __init__(self, pid: int):
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise TargetError(f"--pid must be a positive process id, not {pid}")
        try:
            self.process = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise TargetError(f"no process with PID {pid}: check the number (ps aux | grep python)") from None
        except psutil.AccessDenied:
            raise TargetError(f"no permission to read process {pid}: run gputop as its owner or as root") from None
        except (OSError, ValueError, OverflowError) as e:  # an out-of-range number, /proc missing...
            raise TargetError(f"cannot read process {pid}: {e}") from None
        self.pid = pid
        try:
            with self.process.oneshot():
                self.create_time = self.process.create_time()
                self.name = self.process.name()
                status = self.process.status()
            self.username = self._safe(self.process.username, "?")
            if status == psutil.STATUS_ZOMBIE:
                raise TargetError(f"process {pid} has already exited (zombie): nothing to watch")
            self.ptrace_denied = self._check_permission()
            self.cmdline = self._safe(self.process.cmdline, [])
        except psutil.ZombieProcess:
            raise TargetError(f"process {pid} has already exited (zombie): nothing to watch") from None
        except psutil.NoSuchProcess:
            raise TargetError(f"process {pid} exited while gputop was starting: nothing to watch") from None
        except psutil.AccessDenied:  # not even its stat and status (hidepid, another namespace)
            raise TargetError(f"no permission to read process {pid}: run gputop as its owner or as root") from None
        if not self.alive():  # it may have died between the checks above
            raise TargetError(f"process {pid} exited while gputop was starting: nothing to watch")
        self._lock = threading.Lock()
        self._tree: list[psutil.Process] = [self.process]
        self._tree_at = -1e9
        self._ppid_of: dict[int, int] = {}   # every live PID on the machine -> its parent
        self._full_scan_at = -1e9
        self._verify_at = -1e9
        self.exited_at: float | None = None  # wall time we noticed it was gone

    @staticmethod
    def _safe(fn, default):
        try:
            return fn()
        except (psutil.Error, OSError):
            return default

    def _no_permission(self) -> str:
        """Why gputop cannot read the target's private parts (one line, for health samples)."""
        who = f" (owned by {self.username})" if getattr(self, "username", "?") != "?" else ""
        if os.geteuid() == 0:
            return (f"ptrace not permitted on process {self.pid}{who}, even as root: it belongs to "
                    f"another container/user namespace or made itself non-dumpable")
        return (f"ptrace not permitted on process {self.pid}{who}: "
                f"run gputop as the same user or with sudo")

    def _check_permission(self) -> str | None:
        """Reading a process's stacks, I/O counters and environment needs ptrace's read access
        (same user, or root); /proc/PID/exe asks exactly that, a plain ``ps`` does not. Without
        it the target is still watched — NVML, its /proc stat/status/schedstat (readable by
        anyone), a probe whose socket this user can reach — and the reason returned here names
        what is missing (the stack source reports it in its health)."""
        try:
            os.readlink(f"/proc/{self.pid}/exe")
        except PermissionError:
            return self._no_permission()
        except FileNotFoundError:
            # A kernel thread has no exe; a vanished process has no directory.
            if not os.path.exists(f"/proc/{self.pid}"):
                raise TargetError(f"process {self.pid} exited while gputop was starting: nothing to watch") from None
        except OSError:
            pass
        return None

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else self.name

    def is_python(self) -> bool:
        exe = os.path.basename(self._safe(self.process.exe, "") or "")
        first = os.path.basename(self.cmdline[0]) if self.cmdline else ""
        return looks_like_python(exe, first, self.name)

    def alive(self) -> bool:
        try:
            return self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
        except OSError:
            # it cannot be told now (out of descriptors: EMFILE): a watched job is not declared
            # gone on that; the host source's next tick reads /proc again
            return True

    def note_exited(self) -> None:
        """A source saw the target go (the host source checks every tick)."""
        if self.exited_at is None:
            self.exited_at = time.time()

    def _descendants(self, now: float) -> list[int]:
        """PIDs of the target's descendants, breadth first. Call with the lock held."""
        try:
            live = {int(n) for n in os.listdir("/proc") if n.isdigit()}
        except OSError:
            return []
        if self.pid not in live:
            return []
        full = now - self._full_scan_at >= FULL_RESCAN_S
        old = {} if full else self._ppid_of
        ppid_of: dict[int, int] = {}
        fresh: set[int] = set()  # parents read in this scan
        for pid in live:
            ppid = old.get(pid)
            if ppid is None:
                ppid = read_ppid(pid)
                if ppid is None:
                    continue
                fresh.add(pid)
            ppid_of[pid] = ppid
        self._ppid_of = ppid_of
        if full:
            self._full_scan_at = now
        verify = now - self._verify_at >= VERIFY_S
        if verify:
            self._verify_at = now
        children: dict[int, list[int]] = {}
        for pid, ppid in ppid_of.items():
            children.setdefault(ppid, []).append(pid)
        out, queue, seen = [], [self.pid], {self.pid}
        while queue:
            parent = queue.pop(0)
            for child in children.get(parent, ()):
                if child in seen:
                    continue
                if verify and child not in fresh:
                    # A cached parent is stale when the parent exited (even as a zombie
                    # not yet reaped): its children were re-parented away from the tree.
                    ppid = read_ppid(child)
                    if ppid != parent:
                        if ppid is None:
                            ppid_of.pop(child, None)
                        else:
                            ppid_of[child] = ppid
                        continue
                seen.add(child)
                out.append(child)
                queue.append(child)
        return out

    def tree(self, max_age_s: float = TREE_MAX_AGE_S) -> list[psutil.Process]:
        """The target and its descendants (cached for ``max_age_s``). The Process objects are
        kept between calls so psutil's cpu_percent deltas work."""
        now = time.monotonic()
        with self._lock:
            if now - self._tree_at < max_age_s:
                return list(self._tree)
            known = {p.pid: p for p in self._tree}
            fresh = [self.process]
            for pid in self._descendants(now):
                proc = known.get(pid)
                if proc is None:
                    try:
                        proc = psutil.Process(pid)
                    except psutil.Error:
                        continue
                fresh.append(proc)
            self._tree = fresh
            self._tree_at = now
            return list(fresh)

    def tree_pids(self, max_age_s: float = TREE_MAX_AGE_S) -> set[int]:
        return {p.pid for p in self.tree(max_age_s)}

    def describe(self) -> dict:
        return {"pid": self.pid, "name": self.name, "cmdline": self.cmdline, "user": self.username,
                "create_time": self.create_time, "python": self.is_python(),
                "ptrace_denied": self.ptrace_denied}


def dies_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` that makes a child process get ``sig`` when the thread that started it
    ends (Linux PR_SET_PDEATHSIG), so gputop's children (py-spy, a started command) do not
    outlive it even after ``kill -9``. None where that is not available. libc's prctl is looked
    up here, before the fork, so the child only makes one foreign call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sig)

    return preexec
