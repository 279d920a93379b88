"""The target's cgroup: its CPU quota, CFS throttling, memory limit and use (for the host source).

Limits are re-read every ``LIMIT_REFRESH_S``; the counters (cpu.stat, memory.current) are kept
open and re-read with pread like /proc files (kernfs regenerates them the same way).
"""

from __future__ import annotations

import os
import time

from gputop.model import clean_float
from gputop.sources.procfs import File, FdBudget, Gone, field_after, parse_kv

LIMIT_REFRESH_S = 5.0        # how often the cgroup's limits (not its counters) are re-read
UNLIMITED = 1 << 60          # cgroup v1 says "no limit" with a huge number (PAGE_COUNTER_MAX)

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
        self._budget = FdBudget(limit=2)
        self._held: dict[str, File] = {}        # cpu.stat and memory.current (or v1 usage)
        self._cg_prev: tuple | None = None       # (periods, throttled, usec, t, cgroup dir)
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
                stat = parse_kv((_read_text(os.path.join(self.mem_dir, "memory.stat")) or "").encode())
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
                f = self._held[path] = File(path, self._budget, 1024)
            return f.read()
        except (Gone, OSError):
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
            cpu = parse_kv(data) if data is not None else None
        if self.mem_dir is not None:
            name = "memory.current" if self.mem_v == "v2" else "memory.usage_in_bytes"
            want.append(os.path.join(self.mem_dir, name))
            data = self._read_held(want[-1])
            mem = field_after(b"\n" + data, b"\n") if data is not None else None
        for path in [p for p in self._held if p not in want]:  # the limiting cgroup moved
            self._held.pop(path).close()
        return cpu, mem

    def sample(self, t: float) -> dict:
        """The ``system`` sample's cgroup fields now: limits, memory in use, and the CFS
        throttling rates since the previous call (None on the first, after a reset, or when
        the limiting cgroup changed)."""
        d = {"cgroup_cpu_limit": None,
             "cgroup_throttled_pct": None, "cgroup_throttled_ms_per_s": None,
             "cgroup_mem_limit": None, "cgroup_mem_used": None}
        cpu, mem = self.read()
        d["cgroup_cpu_limit"] = clean_float(self.cpu_limit, 3)
        d["cgroup_mem_limit"] = self.mem_limit
        d["cgroup_mem_used"] = mem
        if cpu is None:
            self._cg_prev = None
            return d
        periods, throttled = cpu.get(b"nr_periods"), cpu.get(b"nr_throttled")
        usec = cpu.get(b"throttled_usec")
        if usec is None and b"throttled_time" in cpu:  # v1 counts nanoseconds
            usec = cpu[b"throttled_time"] // 1000
        if periods is None or throttled is None or usec is None:
            self._cg_prev = None
            return d
        cur = (periods, throttled, usec, t, self.cpu_limit_dir)
        prev, self._cg_prev = self._cg_prev, cur
        if self.cpu_limit is None or prev is None or prev[4] != cur[4] or t <= prev[3] \
                or periods < prev[0] or usec < prev[2]:
            return d  # unlimited, first reading, another cgroup's counters, or a reset
        dp = periods - prev[0]
        if dp > 0:
            d["cgroup_throttled_pct"] = clean_float(100.0 * (throttled - prev[1]) / dp, 1)
        d["cgroup_throttled_ms_per_s"] = clean_float((usec - prev[2]) / 1000.0 / (t - prev[3]), 2)
        return d

    def close(self) -> None:
        for f in self._held.values():
            f.close()
        self._held.clear()

    def describe(self) -> dict:
        return {"version": self.version, "cpu_dir": self.cpu_dir, "cpu_limit_dir": self.cpu_limit_dir,
                "cpu_version": self.cpu_v, "memory_dir": self.mem_dir, "memory_version": self.mem_v,
                "cpu_limit": self.cpu_limit, "mem_limit": self.mem_limit, "problem": self.problem}

