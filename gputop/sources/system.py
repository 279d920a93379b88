"""The ``system`` sample of the host source: host-wide CPU, load, memory, swap, pressure stall
information, and the target's cgroup (gputop/sources/cgroups.py). The /proc files are kept open
and re-read with pread (``procfs.File``)."""

from __future__ import annotations

import os

from gputop.model import RateTracker, clean_float
from gputop.sources.cgroups import Cgroup
from gputop.sources.procfs import PAGE_SIZE, FdBudget, File, Gone, field_after


def _bps(x: float | None) -> int | None:
    return None if x is None else int(round(x))


class SystemSampler:
    """Host-wide numbers, one ``sample(t)`` per tick, on the host source's thread."""

    def __init__(self, target_pid: int, budget: FdBudget) -> None:
        self._budget = budget
        self._rates = RateTracker()
        self._cpu_prev: tuple[int, int, int, int] | None = None
        self._files: dict[str, File] = {}
        self._psi_missing: set[str] = set()          # /proc/pressure files this kernel lacks
        self.cpu_count = os.cpu_count() or 1
        self.mem_total: int | None = None
        try:
            self.cgroup: Cgroup | None = Cgroup(target_pid)
        except Exception as e:  # never let a strange cgroup layout stop the source
            self.cgroup = None
            self.cgroup_error = f"cgroup: {type(e).__name__}: {e}"
        else:
            self.cgroup_error = self.cgroup.problem

    def _file(self, path: str, size: int) -> File:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = File(path, self._budget, size)
        return f

    @staticmethod
    def mem_total_now() -> int | None:
        """For describe() before the first tick (another thread: no held files here)."""
        try:
            with open("/proc/meminfo", "rb") as f:
                kib = field_after(b"\n" + f.read(), b"\nMemTotal:")
        except OSError:
            return None
        return None if kib is None else kib * 1024

    def sample(self, t: float) -> dict:
        d: dict = {"cpu_count": self.cpu_count}
        try:
            line = self._file("/proc/stat", 1024).read().split(b"\n", 1)[0].split()
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
        except (Gone, OSError, ValueError, IndexError):
            d["cpu_pct"] = d["cpu_iowait_pct"] = d["cpu_steal_pct"] = None
        try:
            d["load1"] = round(os.getloadavg()[0], 2)
        except OSError:
            d["load1"] = None
        try:
            mem = b"\n" + self._file("/proc/meminfo", 8192).read()
        except (Gone, OSError):
            mem = b""
        kib = lambda label: None if (v := field_after(mem, label)) is None else v * 1024  # noqa: E731
        d["mem_total"] = kib(b"\nMemTotal:")
        self.mem_total = d["mem_total"] or self.mem_total
        d["mem_available"] = kib(b"\nMemAvailable:")
        d["swap_total"] = kib(b"\nSwapTotal:")
        free = kib(b"\nSwapFree:")
        d["swap_used"] = d["swap_total"] - free if d["swap_total"] is not None and free is not None else None
        try:
            vm = b"\n" + self._file("/proc/vmstat", 16384).read()
        except (Gone, OSError):
            vm = b""
        rates = self._rates
        pin, pout = field_after(vm, b"\npswpin "), field_after(vm, b"\npswpout ")
        d["swap_in_bps"] = _bps(rates.rate("swpin", None if pin is None else pin * PAGE_SIZE, t))
        d["swap_out_bps"] = _bps(rates.rate("swpout", None if pout is None else pout * PAGE_SIZE, t))
        self._pressure(t, d)
        self._cgroup(t, d)
        return d

    def _pressure(self, t: float, d: dict) -> None:
        """Pressure stall information (Linux >= 4.20): the share of wall time in which some (or
        all) runnable tasks were stalled on memory, I/O or CPU, from the cumulative ``total=``
        microsecond counters over our own interval (not the kernel's 10 s average, which lags)."""
        rates = self._rates
        for res, lines in (("mem", ("some", "full")), ("io", ("some",)), ("cpu", ("some",))):
            path = f"/proc/pressure/{'memory' if res == 'mem' else res}"
            try:
                text = self._file(path, 256).read() if path not in self._psi_missing else b""
            except (Gone, OSError):
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

    def _cgroup(self, t: float, d: dict) -> None:
        if self.cgroup is None:
            d["cgroup_cpu_limit"] = d["cgroup_throttled_pct"] = d["cgroup_throttled_ms_per_s"] = None
            d["cgroup_mem_limit"] = d["cgroup_mem_used"] = None
            return
        d.update(self.cgroup.sample(t))

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self.cgroup is not None:
            self.cgroup.close()
