"""The target: the process gputop watches, and its tree of descendants.

Shared by the sources: the host source samples every process of the tree, the NVML source
picks the GPUs the tree uses, the stack source samples the main process and its children.
"""

from __future__ import annotations

import os
import threading
import time

import psutil


class TargetError(Exception):
    """The target cannot be watched. The message is one line for the user."""


class Target:
    def __init__(self, pid: int):
        if pid <= 0:
            raise TargetError(f"--pid must be a positive process id, not {pid}")
        try:
            self.process = psutil.Process(pid)
            with self.process.oneshot():
                self.create_time = self.process.create_time()
                self.name = self.process.name()
                status = self.process.status()
        except psutil.NoSuchProcess:
            raise TargetError(f"no process with PID {pid}: check the number (ps aux | grep python)") from None
        except psutil.AccessDenied:
            raise TargetError(f"no permission to read process {pid}: run gputop as its owner or as root") from None
        if status == psutil.STATUS_ZOMBIE:
            raise TargetError(f"process {pid} has already exited (zombie): nothing to watch")
        self.pid = pid
        self.cmdline = self._read_cmdline()
        self.username = self._safe(self.process.username, "?")
        self._lock = threading.Lock()
        self._tree: list[psutil.Process] = [self.process]
        self._tree_at = 0.0
        self.exited_at: float | None = None  # wall time we noticed it was gone

    @staticmethod
    def _safe(fn, default):
        try:
            return fn()
        except (psutil.Error, OSError):
            return default

    def _read_cmdline(self) -> list[str]:
        try:
            return self.process.cmdline()
        except psutil.AccessDenied:
            raise TargetError(f"no permission to read process {self.pid}: run gputop as its owner or as root") from None
        except psutil.NoSuchProcess:
            raise TargetError(f"process {self.pid} exited while gputop was starting") from None

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else self.name

    def is_python(self) -> bool:
        exe = os.path.basename(self._safe(self.process.exe, "") or "")
        first = os.path.basename(self.cmdline[0]) if self.cmdline else ""
        return any(n.startswith("python") or n.startswith("pypy") for n in (exe, first, self.name))

    def alive(self) -> bool:
        try:
            return self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def tree(self, max_age_s: float = 0.5) -> list[psutil.Process]:
        """The target and its descendants (cached for ``max_age_s``). The Process objects are
        kept between calls so psutil's cpu_percent deltas work."""
        now = time.monotonic()
        with self._lock:
            if now - self._tree_at < max_age_s:
                return list(self._tree)
            known = {p.pid: p for p in self._tree}
            fresh = [self.process]
            try:
                for child in self.process.children(recursive=True):
                    fresh.append(known.get(child.pid, child))
            except psutil.Error:
                pass
            self._tree = fresh
            self._tree_at = now
            return list(fresh)

    def tree_pids(self) -> set[int]:
        return {p.pid for p in self.tree()}

    def describe(self) -> dict:
        return {"pid": self.pid, "name": self.name, "cmdline": self.cmdline, "user": self.username,
                "create_time": self.create_time, "python": self.is_python()}
