"""GPM (GPU performance monitoring, Hopper and newer) for the NVML source: the snapshot gate, the
per-GPU snapshot buffers and the readings (``GpmReadings``, mixed into ``NvmlSource``).

GPM values are the difference of two GPM snapshots, and two snapshots closer than 100 ms give
silent garbage (measured on an H200: SM active 0.0 and DRAM NaN), so ``GPM_MIN_GAP_S`` is a hard
floor. A GPU's GPM snapshot is taken only when its previous one is at least ``GPM_EVERY_S`` (0.5 s,
nvml_fields.py: the metrics call costs ~1 ms) old; on the other ticks of the ~10 Hz fast loop the
GPM fields and ``gpm_window_s`` are None, so about 1 gpu sample in 5-6 carries them, each the
mean over its ``gpm_window_s``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gputop.model import clean_float
from gputop.sources.nvml_errors import _code, _is_too_old, is_permanent, nv, nvml_reason
from gputop.sources.nvml_fields import (GPM_EVERY_S, GPM_FIELDS, GPM_METRICS, GPM_PERCENT_FIELDS, NVLINK_FIELDS,
                                       PCIE_FIELDS)

if TYPE_CHECKING:
    from gputop.sources.nvml_gpu import _Gpu

# nvml.h: the gap between two nvmlGpmSampleGet calls "should be greater than 100ms due to the
# internal sample refresh rate". Closer gives SUCCESS with junk values, so this is a hard floor.
GPM_MIN_GAP_S = 0.1


class GpmGate:
    """Allows a GPM snapshot only when the previous one is at least ``min_gap_s`` old (default
    GPM_EVERY_S; never below the GPM_MIN_GAP_S floor)."""

    def __init__(self, min_gap_s: float = GPM_EVERY_S) -> None:
        self.min_gap_s = max(GPM_MIN_GAP_S, float(min_gap_s))
        self.last: float | None = None

    def due(self, now: float, factor: float = 1.0) -> bool:
        """``factor``: how much longer the gap is now (CALM_FACTOR, 4, while the job is calm)."""
        return self.last is None or now - self.last >= self.min_gap_s * factor

    def taken(self, now: float) -> None:
        self.last = now


class _Gpm:
    """Two GPM snapshot buffers and one reusable request; values are over [previous, now]."""

    def __init__(self, handle, metrics: list[tuple[str, int]]) -> None:
        self.handle = handle
        self.metrics = list(metrics)               # (field, metric id), shrinks when one fails for good
        self.old = nv.nvmlGpmSampleAlloc()
        try:
            self.new = nv.nvmlGpmSampleAlloc()
        except Exception:
            nv.nvmlGpmSampleFree(self.old)
            raise
        self.req = nv.c_nvmlGpmMetricsGet_t()      # ~19 KB: allocate once, not per tick
        self.gate = GpmGate()
        self.t_old: float | None = None            # monotonic time of the snapshot in self.old

    def free(self) -> None:
        for buf in (self.old, self.new):
            try:
                nv.nvmlGpmSampleFree(buf)
            except Exception:
                pass


class GpmReadings:
    """The NVML source's GPM part. Needs from the source: ``_call``, ``_note_error``,
    ``_set_na`` (see nvml.py)."""

    def _setup_gpm(self, gpu: _Gpu, arch: int | None) -> None:
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport") or not hasattr(nv, "c_nvmlGpmMetricsGet_t"):
            self._set_na(gpu, GPM_FIELDS, "nvidia-ml-py too old for GPM")
            return
        try:
            support = self._call("nvmlGpmQueryDeviceSupport", nv.nvmlGpmQueryDeviceSupport, gpu.handle)
            supported = bool(support.isSupportedDevice)
        except Exception as e:
            reason = "driver too old for GPM" if _is_too_old(e) else f"GPM: {nvml_reason(e)}"
            self._gpm_unavailable(gpu, reason)
            return
        if not supported:
            hopper = getattr(nv, "NVML_DEVICE_ARCH_HOPPER", 9)
            old = arch is not None and arch < hopper
            self._gpm_unavailable(gpu, "GPM needs a Hopper or newer GPU" if old else "GPM not supported on this GPU")
            return
        metrics = []
        for field, const in GPM_METRICS:
            mid = getattr(nv, const, None)
            if mid is None:
                self._set_na(gpu, (field,), "nvidia-ml-py too old")
            else:
                metrics.append((field, int(mid)))
        if not self._has_nvlink(gpu):
            self._set_na(gpu, NVLINK_FIELDS, "no NVLink on this GPU")
            metrics = [(f, m) for f, m in metrics if f not in NVLINK_FIELDS]
        try:
            gpm = _Gpm(gpu.handle, metrics)
        except Exception as e:
            self._gpm_unavailable(gpu, f"GPM: {nvml_reason(e)}")
            return
        gpu.gpm = gpm
        self._gpm_snapshot(gpu, gpm, first=True)

    def _gpm_unavailable(self, gpu: _Gpu, reason: str) -> None:
        """Without GPM: the GPM-only fields are n/a; PCIe comes from the slow loop instead."""
        self._set_na(gpu, [f for f in GPM_FIELDS if f not in PCIE_FIELDS], reason)
        if not hasattr(nv, "nvmlDeviceGetPcieThroughput"):
            self._set_na(gpu, PCIE_FIELDS, "nvidia-ml-py too old")

    def _has_nvlink(self, gpu: _Gpu) -> bool:
        """False only when NVML says so; if it cannot tell, ask GPM and trust its per-metric return."""
        fid = getattr(nv, "NVML_FI_DEV_NVLINK_LINK_COUNT", None)
        if fid is None or not hasattr(nv, "nvmlDeviceGetFieldValues"):
            return True
        try:
            vals = self._call("nvmlDeviceGetFieldValues", nv.nvmlDeviceGetFieldValues, gpu.handle, [fid])
        except Exception:
            return True
        v = vals[0]
        if v.nvmlReturn == _code("NVML_ERROR_NOT_SUPPORTED"):  # measured on the PCIe H200
            return False
        if v.nvmlReturn != 0:
            return True
        return int(v.value.uiVal) > 0

    def _gpm_snapshot(self, gpu: _Gpu, gpm: _Gpm, first: bool = False) -> float | None:
        """Take a snapshot into gpm.new (or gpm.old at start): its monotonic time, or None when
        it failed. The time is read right before the call, so the gate measures the real gap."""
        buf = gpm.old if first else gpm.new
        now = time.monotonic()
        try:
            self._call("nvmlGpmSampleGet", nv.nvmlGpmSampleGet, gpu.handle, buf)
        except Exception as e:
            self._note_error(gpu, GPM_FIELDS, "nvmlGpmSampleGet", e)
            if is_permanent(e):
                gpm.free()
                gpu.gpm = None
                gpu.info["gpm"] = False
                self._gpm_unavailable(gpu, f"GPM: {nvml_reason(e)}")
            return None
        gpm.gate.taken(now)
        if first:
            gpm.t_old = now
        return now

    def _read_gpm(self, gpu: _Gpu) -> dict | None:
        """GPM values over [previous snapshot, now], or None when the previous one is too recent."""
        gpm = gpu.gpm
        if gpm is None or gpu.lost or not gpm.metrics:
            return None
        if gpm.t_old is None:  # no baseline yet (the first snapshot failed, or newly watched)
            self._gpm_snapshot(gpu, gpm, first=True)
            return None
        # while calm GPM's gap stretches as the fast loop's interval does (sources/calm.py: 0.5 -> 2 s)
        if not gpm.gate.due(time.monotonic(), self._interval_factor):
            return None
        now = self._gpm_snapshot(gpu, gpm)
        if now is None:
            return None
        req = gpm.req
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(gpm.metrics)
        req.sample1, req.sample2 = gpm.old, gpm.new
        for i, (_, mid) in enumerate(gpm.metrics):
            req.metrics[i].metricId = mid
        window = now - gpm.t_old
        gpm.old, gpm.new, gpm.t_old = gpm.new, gpm.old, now  # the new snapshot is the next baseline
        try:
            self._call("nvmlGpmMetricsGet", nv.nvmlGpmMetricsGet, req)
        except Exception as e:
            self._note_error(gpu, tuple(f for f, _ in gpm.metrics), "nvmlGpmMetricsGet", e)
            return None
        out: dict = {"gpm_window_s": clean_float(window, 3)}
        dropped = []
        for i, (field, _) in enumerate(gpm.metrics):
            m = req.metrics[i]
            if m.nvmlReturn != 0:
                err = nv.NVMLError(m.nvmlReturn)
                self._note_error(gpu, (field,), "nvmlGpmMetricsGet:" + field, err)
                if is_permanent(err):
                    dropped.append(field)
                out[field] = None
                continue
            out[field] = clean_float(m.value, 2 if field in GPM_PERCENT_FIELDS else 1)
        if dropped:
            gpm.metrics = [(f, mid) for f, mid in gpm.metrics if f not in dropped]
        return out
