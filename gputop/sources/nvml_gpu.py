"""Per-GPU state of the NVML source (``_Gpu``) and the fast loop's readings of one GPU
(``GpuReadings``, mixed into ``NvmlSource``): memory, temperature, clock-event reasons, power
limit, and the whole ``gpu`` sample. Each reading falls back to the older NVML call once the
newer one says "driver too old", and gives None (the reason noted) instead of raising."""

from __future__ import annotations

import math
import time

from gputop.model import clean_float
from gputop.sources.gpm import _Gpm
from gputop.sources.nvml_errors import _is_too_old, nv
from gputop.sources.nvml_fields import CLOCK_EVENT_REASONS, ENERGY_EVERY_S, GPM_FIELDS

# The fields and clock-event reasons are in nvml_fields.py (no pynvml needed); their bits here.

def _bit(const: str, fallback: int) -> int:
    return int(getattr(nv, const, fallback)) if nv is not None else fallback


CLOCK_EVENT_BITS: tuple[tuple[int, str], ...] = tuple((_bit(c, v), name) for c, v, name, _ in CLOCK_EVENT_REASONS)


def decode_clock_events(mask: int | None) -> list[str] | None:
    """Bit mask of nvmlDeviceGetCurrentClocksEventReasons -> names, in bit order. Unknown bits
    become "unknown_0x..." so nothing the driver says is dropped."""
    if mask is None:
        return None
    mask = int(mask)
    names = []
    known = 0
    for bit, name in CLOCK_EVENT_BITS:
        known |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~known
    b = 1
    while rest:
        if rest & b:
            names.append(f"unknown_{b:#x}")
            rest &= ~b
        b <<= 1
    return names


class _Gpu:
    def __init__(self, index: int, handle) -> None:
        self.index = index
        self.key = str(index)
        self.handle = handle
        self.info: dict = {"index": index}
        self.na: dict[str, str] = {}              # field -> reason (permanent)
        self.gpm: _Gpm | None = None
        self.mem_version = 2                       # memory info v2, else v1
        self.temp_v = True                         # nvmlDeviceGetTemperatureV, else the old call
        self.events_new = True                     # ClocksEventReasons, else ClocksThrottleReasons
        self.procs_v3 = True                       # ComputeRunningProcesses v3, else v2
        self.power_limit_w: float | None = None
        self.mem_total: int | None = None
        self.pcie_pending: tuple[float | None, float | None] | None = None  # from the slow loop
        self.energy_pending: float | None = None   # J, from the slow loop (one fast sample carries it)
        self.energy_next_at = 0.0                  # monotonic time of the next energy reading
        self.proc_util_ts = 0
        self.proc_sm: tuple[dict[int, float], str | None] = ({}, None)  # the last per-process SM % read
        self.proc_sm_next_at = 0.0                 # monotonic time of the next read
        self.proc_sm_pids: frozenset[int] = frozenset()  # the tree's processes it was read for
        self.lost = False
        self.watched = False
        self.chosen_by = "all"
        self.info_dirty = False
        self.info_urgent = False                   # watched changed: publish without delay
        self.info_sent_at = -math.inf


class GpuReadings:
    """The fast loop's readings. Needs from the source: ``_call``, ``_read``, ``_note_error``,
    ``_set_na``, ``_lock`` and (GPM) ``_read_gpm`` (see nvml.py, gpm.py)."""

    def _read_memory(self, gpu: _Gpu) -> tuple[int | None, int | None, int | None] | None:
        """(total, used, reserved) in bytes; v2 separates reserved from used, v1 counts it as used."""
        if "mem_used" in gpu.na or gpu.lost:
            return None
        if gpu.mem_version == 2 and hasattr(nv, "nvmlMemory_v2"):
            try:
                m = self._call("nvmlDeviceGetMemoryInfo_v2", nv.nvmlDeviceGetMemoryInfo, gpu.handle,
                               version=nv.nvmlMemory_v2)
                return int(m.total), int(m.used), int(m.reserved)
            except Exception as e:
                if not _is_too_old(e):
                    self._note_error(gpu, ("mem_used", "mem_reserved"), "nvmlDeviceGetMemoryInfo_v2", e)
                    return None
        gpu.mem_version = 1
        if "mem_reserved" not in gpu.na:
            self._set_na(gpu, ("mem_reserved",), "driver too old (mem_used includes reserved)")
        m = self._read(gpu, ("mem_used",), "nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo)
        return (int(m.total), int(m.used), None) if m is not None else None

    def _read_temp(self, gpu: _Gpu) -> int | None:
        if "temp_c" in gpu.na or gpu.lost:
            return None
        sensor = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        if gpu.temp_v and hasattr(nv, "nvmlDeviceGetTemperatureV"):
            try:
                return int(self._call("nvmlDeviceGetTemperatureV", nv.nvmlDeviceGetTemperatureV, gpu.handle, sensor))
            except Exception as e:
                if not _is_too_old(e):
                    self._note_error(gpu, ("temp_c",), "nvmlDeviceGetTemperatureV", e)
                    return None
        gpu.temp_v = False
        v = self._read(gpu, ("temp_c",), "nvmlDeviceGetTemperature", nv.nvmlDeviceGetTemperature, sensor)
        return None if v is None else int(v)

    def _read_events(self, gpu: _Gpu) -> int | None:
        if "clock_events" in gpu.na or gpu.lost:
            return None
        fields = ("clock_events", "clock_events_mask")
        if gpu.events_new and hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):
            try:
                return int(self._call("nvmlDeviceGetCurrentClocksEventReasons",
                                      nv.nvmlDeviceGetCurrentClocksEventReasons, gpu.handle))
            except Exception as e:
                if not _is_too_old(e):
                    self._note_error(gpu, fields, "nvmlDeviceGetCurrentClocksEventReasons", e)
                    return None
        gpu.events_new = False
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if fn is None:
            self._set_na(gpu, fields, "nvidia-ml-py too old")
            return None
        v = self._read(gpu, fields, "nvmlDeviceGetCurrentClocksThrottleReasons", fn)
        return None if v is None else int(v)

    def _read_power_limit(self, gpu: _Gpu) -> None:
        v = self._read(gpu, ("power_limit_w",), "nvmlDeviceGetEnforcedPowerLimit", nv.nvmlDeviceGetEnforcedPowerLimit)
        w = clean_float(v / 1000.0, 1) if v is not None else None
        if w != gpu.power_limit_w:
            gpu.power_limit_w = w
            gpu.info["power_limit_w"] = w
            gpu.info_dirty = True

    def _read_energy(self, gpu: _Gpu) -> None:
        """The total energy counter (mJ since the driver loaded, Volta and newer). It costs ~3 ms
        (p90 ~7 ms) per call, so the slow loop reads it, every ENERGY_EVERY_S only (at 1 Hz it
        was 0.3% of a core on the H200; a counter loses nothing between readings); the next
        fast sample carries it."""
        if "energy_j" in gpu.na or gpu.lost:
            return
        now = time.monotonic()
        if now < gpu.energy_next_at:
            return
        gpu.energy_next_at = now + ENERGY_EVERY_S
        fn = getattr(nv, "nvmlDeviceGetTotalEnergyConsumption", None)
        if fn is None:
            self._set_na(gpu, ("energy_j",), "nvidia-ml-py too old (no nvmlDeviceGetTotalEnergyConsumption)")
            return
        v = self._read(gpu, ("energy_j",), "nvmlDeviceGetTotalEnergyConsumption", fn)
        if v is not None:
            with self._lock:
                gpu.energy_pending = int(v) / 1000.0

    def _gpu_sample(self, gpu: _Gpu) -> dict:
        util = self._read(gpu, ("util_gpu", "util_mem"), "nvmlDeviceGetUtilizationRates",
                          nv.nvmlDeviceGetUtilizationRates)
        mem = self._read_memory(gpu)
        power = self._read(gpu, ("power_w",), "nvmlDeviceGetPowerUsage", nv.nvmlDeviceGetPowerUsage)
        clk_sm = self._read(gpu, ("clock_sm_mhz",), "nvmlDeviceGetClockInfo", nv.nvmlDeviceGetClockInfo,
                            getattr(nv, "NVML_CLOCK_SM", 1))
        clk_mem = self._read(gpu, ("clock_mem_mhz",), "nvmlDeviceGetClockInfo", nv.nvmlDeviceGetClockInfo,
                             getattr(nv, "NVML_CLOCK_MEM", 2))
        temp = self._read_temp(gpu)
        mask = self._read_events(gpu)
        gpm = self._read_gpm(gpu)
        data = {
            "util_gpu": int(util.gpu) if util is not None else None,
            "util_mem": int(util.memory) if util is not None else None,
            "mem_used": mem[1] if mem else None,
            "mem_total": mem[0] if mem else gpu.mem_total,
            "mem_reserved": mem[2] if mem else None,
            "power_w": clean_float(power / 1000.0, 1) if power is not None else None,
            "power_limit_w": gpu.power_limit_w,
            "clock_sm_mhz": clk_sm,
            "clock_mem_mhz": clk_mem,
            "temp_c": temp,
            "clock_events": decode_clock_events(mask),
            "clock_events_mask": mask,
        }
        for f in GPM_FIELDS:
            data[f] = gpm.get(f) if gpm else None
        data["gpm_window_s"] = gpm.get("gpm_window_s") if gpm else None
        data["energy_j"] = None
        if gpu.energy_pending is not None:
            with self._lock:
                data["energy_j"], gpu.energy_pending = gpu.energy_pending, None
        if gpu.gpm is None and gpu.pcie_pending is not None:
            # Without GPM, PCIe rates come from the slow loop: each reading goes into exactly
            # one fast sample, so statistics count it once.
            with self._lock:
                pending, gpu.pcie_pending = gpu.pcie_pending, None
            if pending is not None:
                data["pcie_tx_mibs"], data["pcie_rx_mibs"] = pending
        return data
