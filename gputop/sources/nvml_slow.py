"""The NVML source's slow loop (``slow_interval_s``, ~1 Hz; ``SlowLoop``, mixed into
``NvmlSource``): the processes on each GPU (which GPUs the target uses, their GPU memory and,
every ``PROC_SM_EVERY_S``, SM %), the power limit, and, on GPUs without GPM only, ``nvmlDeviceGetPcieThroughput``, which
blocks ~20 ms per call and so never runs in the fast loop."""

from __future__ import annotations

import math
import time

from gputop.model import KIND_GPU_PROCS, clean_float
from gputop.sources.calm import CALM_HELD_FACTOR
from gputop.sources.nvml_errors import _code, _err_code, _is_too_old, nv, nvml_reason
from gputop.sources.nvml_fields import MIB, PCIE_FIELDS, PROC_SM_EVERY_S
from gputop.sources.nvml_gpu import _Gpu

SLOW_MAX_GAP_X = 4.0   # the slow loop's longest gap, in intervals (nvml.JITTER_CAP: the full rate's)
OTHERS_MAX = 8         # other processes on a GPU named in gpu_procs.others (the most memory first)
NOT_VISIBLE = "another process (not visible here)"   # an NVML PID this PID namespace cannot see
OTHER_NAME_TTL_S = 30.0   # a name read this long ago is read again (a PID is reused by another process)


def describe_other(pid: int, same_namespace: bool, cache: dict) -> dict:
    """{"user", "name", "visible"} of a process on the GPU that is not the target's. NVML's PIDs
    are the host's (sources/pid_namespace.py): only in the host's PID namespace is /proc/PID that
    process; elsewhere it is "another process (not visible here)" (another container's, or a
    different process that happens to have the number here: a wrong name is worse than none)."""
    if not same_namespace:
        return {"user": None, "name": NOT_VISIBLE, "visible": False}
    now = time.monotonic()
    hit = cache.get(pid)
    got = hit[1] if hit is not None and now - hit[0] < OTHER_NAME_TTL_S else None
    if got is None:
        import psutil   # (the host source's dependency; read once per process)
        try:
            proc = psutil.Process(pid)
            name = proc.name()
            try:
                user = proc.username()
            except (psutil.AccessDenied, KeyError):   # KeyError: a UID with no passwd entry
                user = None
            got = {"user": user, "name": name, "visible": True}
        except psutil.NoSuchProcess:
            got = {"user": None, "name": NOT_VISIBLE, "visible": False}
        except (psutil.AccessDenied, OSError):
            got = {"user": None, "name": None, "visible": True}
        if len(cache) >= 256:
            cache.clear()
        cache[pid] = (now, got)
    return got


def kbps_to_mibs(kb_per_s: float | None) -> float | None:
    """nvmlDeviceGetPcieThroughput's "KB/s" -> MiB/s. NVML does not say whether KB is 1000 or
    1024 bytes; a reading on the H200 matched GPM's MiB/s within ~1% taking KB = 1000 B."""
    if kb_per_s is None:
        return None
    return clean_float(kb_per_s * 1000.0 / MIB, 1)


class SlowLoop:
    """Needs from the source: ``_call``, ``_read``, ``_note_error``, ``_read_power_limit``,
    ``_publish``, ``_gap``, ``_lock``, ``_stop``, ``_gpus``, ``calm`` and its choice state (see nvml.py)."""

    def _slow_main(self) -> None:
        while True:  # the first tick at once: the GPU choice and gpu_procs should not wait
            try:
                self._slow_tick()
            except Exception as e:  # a bug of ours: report it, keep going
                with self._lock:
                    k = ("-", "slow loop", f"{type(e).__name__}: {e}"[:120])
                    self._transient[k] = self._transient.get(k, 0) + 1
            # while the job is calm (sources/calm.py), at CALM_HELD_FACTOR times its interval:
            # the processes' GPU memory every ~2 s (the energy counter and the
            # processes' SM % keep their own 5 s cadence)
            calm = self.calm is not None and self.calm.calm()
            # (the jittered gap capped at what the full rate's can be, 4 intervals: gpu_procs
            # older than 5 s count as missing in the rank table and the exporter)
            gap = min(self._gap(self.slow_interval_s * (CALM_HELD_FACTOR if calm else 1)),
                      SLOW_MAX_GAP_X * self.slow_interval_s)
            if self._stop.wait(gap):
                return

    def _tree_pids(self) -> set[int] | None:
        if self.target is None:
            return None
        try:
            return {p.pid for p in self.target.tree()}
        except Exception:
            return {self.target.pid}

    def _running_procs(self, gpu: _Gpu) -> list | None:
        """Compute processes on the GPU: v3, falling back to v2 on older drivers."""
        if "proc_mem" in gpu.na or gpu.lost:
            return None
        if gpu.procs_v3:
            try:
                return self._call("nvmlDeviceGetComputeRunningProcesses", nv.nvmlDeviceGetComputeRunningProcesses,
                                  gpu.handle)
            except Exception as e:
                if not _is_too_old(e) or not hasattr(nv, "nvmlDeviceGetComputeRunningProcesses_v2"):
                    self._note_error(gpu, ("proc_mem",), "nvmlDeviceGetComputeRunningProcesses", e)
                    return None
            gpu.procs_v3 = False
        return self._read(gpu, ("proc_mem",), "nvmlDeviceGetComputeRunningProcesses_v2",
                          nv.nvmlDeviceGetComputeRunningProcesses_v2)

    def _proc_sm(self, gpu: _Gpu, pids: frozenset[int]) -> tuple[dict[int, float], str | None]:
        """Per-process SM % (time-based, like util_gpu) over the samples since the last read,
        and why it is empty; read every PROC_SM_EVERY_S, the last reading in between, and at
        once when a process of the tree appears on the GPU (``pids``)."""
        now = time.monotonic()
        if now < gpu.proc_sm_next_at and pids <= gpu.proc_sm_pids:
            return gpu.proc_sm
        gpu.proc_sm_next_at = now + PROC_SM_EVERY_S
        gpu.proc_sm_pids = pids
        gpu.proc_sm = self._read_proc_sm(gpu)
        return gpu.proc_sm

    def _read_proc_sm(self, gpu: _Gpu) -> tuple[dict[int, float], str | None]:
        if "proc_sm_pct" in gpu.na:
            return {}, gpu.na["proc_sm_pct"]
        since = gpu.proc_util_ts or int((time.time() - PROC_SM_EVERY_S) * 1e6)
        try:
            samples = self._call("nvmlDeviceGetProcessUtilization", nv.nvmlDeviceGetProcessUtilization,
                                 gpu.handle, since)
        except Exception as e:
            if _err_code(e) == _code("NVML_ERROR_NOT_FOUND"):
                return {}, "no samples since the last read (no kernels ran?)"
            self._note_error(gpu, ("proc_sm_pct",), "nvmlDeviceGetProcessUtilization", e)
            return {}, nvml_reason(e)
        acc: dict[int, list[float]] = {}
        for s in samples:
            gpu.proc_util_ts = max(gpu.proc_util_ts, int(s.timeStamp))
            acc.setdefault(int(s.pid), []).append(float(s.smUtil))
        return {pid: clean_float(sum(v) / len(v), 1) for pid, v in acc.items()}, None

    def _slow_tick(self) -> None:
        tree = self._tree_pids()
        with self._lock:
            gpus = list(self._gpus)
        newly = []
        for gpu in gpus:
            if self._stop.is_set():
                return
            if gpu.lost or not (gpu.watched or self._auto):
                continue
            if gpu.watched:
                self._read_energy(gpu)
            procs = self._running_procs(gpu)
            if procs is None:
                continue  # no sample rather than an empty list: gpu_info.na or health says why
            mine: dict[int, int | None] = {}
            other_pids: set[int] = set()
            others: dict[int, int | None] = {}
            other_mem: int | None = 0
            for p in procs:
                pid = int(p.pid)
                used = getattr(p, "usedGpuMemory", None)  # None on Windows WDDM
                if tree is None or pid in tree:
                    # A process can be listed once per MIG instance: add up what is known.
                    if pid not in mine or mine[pid] is None:
                        mine[pid] = used
                    elif used is not None:
                        mine[pid] += used
                else:
                    other_pids.add(pid)
                    others[pid] = (others.get(pid) or 0) + used if used is not None else others.get(pid)
                    other_mem = other_mem + used if (other_mem is not None and used is not None) else None
            other_count = len(other_pids)
            if self._auto and tree is not None and mine and gpu.chosen_by != "target":
                newly.append(gpu)
            if not gpu.watched and gpu not in newly:
                continue
            self._read_power_limit(gpu)
            sm, sm_na = self._proc_sm(gpu, frozenset(mine)) if mine else ({}, None)
            data = {"procs": {str(pid): {"mem": mem, "sm_pct": sm.get(pid)} for pid, mem in sorted(mine.items())},
                    "other_count": other_count, "other_mem": other_mem,
                    "sm_na": sm_na}
            if others and mine:
                # the processes sharing the target's GPU, for the gpu_shared verdict: their SM %
                # comes from the same nvmlDeviceGetProcessUtilization read as the target's
                data["others"] = self._others(others, sm)
            self._publish(KIND_GPU_PROCS, gpu.key, data)
            if gpu.gpm is None and "pcie_tx_mibs" not in gpu.na:
                self._read_pcie(gpu)
        if newly:
            self._choose(newly)

    def _others(self, others: dict[int, int | None], sm: dict[int, float]) -> dict:
        """{pid: {"mem", "sm_pct", "user", "name", "visible"}} of up to OTHERS_MAX other processes on a
        GPU, the most GPU memory first."""
        same = getattr(self, "_same_pid_ns", None)
        if same is None:
            from gputop.sources.pid_namespace import in_host_namespace
            same = self._same_pid_ns = in_host_namespace()
        cache = self.__dict__.setdefault("_other_names", {})
        top = sorted(others.items(), key=lambda kv: -(kv[1] or 0))[:OTHERS_MAX]
        return {str(pid): {"mem": mem, "sm_pct": sm.get(pid), **describe_other(pid, same, cache)} for pid, mem in top}

    def _choose(self, using: list[_Gpu]) -> None:
        """The target runs on ``using``: watch those (and keep any chosen before)."""
        with self._lock:
            first = not self._target_seen
            self._target_seen = True
            for g in using:
                if not g.watched and g.gpm is not None:
                    g.gpm.t_old = None  # its GPM baseline is stale: the fast loop takes a new one
                g.chosen_by = "target"
                g.watched = True
                g.info_dirty = g.info_urgent = True
            if first:
                for g in self._gpus:
                    if g.chosen_by != "target" and g.watched:
                        g.watched = False
                        g.info_dirty = g.info_urgent = True
            self._health_checked_at = -math.inf  # say which GPUs are watched now

    def _read_pcie(self, gpu: _Gpu) -> None:
        """nvmlDeviceGetPcieThroughput blocks ~20 ms per call (it counts bytes over 20 ms): only
        here, at ~1 Hz, and only on GPUs without GPM."""
        tx = self._read(gpu, PCIE_FIELDS, "nvmlDeviceGetPcieThroughput", nv.nvmlDeviceGetPcieThroughput,
                        nv.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._read(gpu, PCIE_FIELDS, "nvmlDeviceGetPcieThroughput", nv.nvmlDeviceGetPcieThroughput,
                        nv.NVML_PCIE_UTIL_RX_BYTES)
        if tx is None and rx is None:
            return
        with self._lock:
            gpu.pcie_pending = (kbps_to_mibs(tx), kbps_to_mibs(rx))
