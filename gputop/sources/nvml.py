"""NVML source: GPU counters from the NVIDIA driver through nvidia-ml-py (module ``pynvml``).

Two threads, each at its own jittered rate:

* the **fast loop** (``interval_s``, ~10 Hz): cheap counters on every watched GPU (utilization,
  memory v2, power, clocks, temperature, clock-event reasons; a few µs each) and, on GPUs with
  GPM (Hopper and newer), the GPM metrics SM active, SM occupancy, tensor active, DRAM bandwidth,
  graphics engine active, PCIe and NVLink rates. GPM values are the difference of two GPM
  snapshots, and two snapshots closer than 100 ms give silent garbage (measured on an H200: SM
  active 0.0 and DRAM NaN), so a GPU's GPM snapshot is taken only when its previous one is at
  least ``GPM_MIN_GAP_S`` old; on the other ticks the GPM fields are None.
* the **slow loop** (``slow_interval_s``, ~1 Hz): the processes on each GPU (which GPUs the
  target uses, and their GPU memory and SM %), the power limit, and, on GPUs without GPM only,
  ``nvmlDeviceGetPcieThroughput``, which blocks ~20 ms per call and so never runs in the fast loop.

Intervals are jittered (a shifted exponential with the interval as its mean) so that samples do
not lock onto the period of a training step.

Missing values are None, never 0. Why a value is missing is in the ``na`` dict of the GPU's
``gpu_info`` sample (permanent: "not supported", "no permission", "driver too old", ...) or in
the ``health`` sample (transient errors, a lost GPU, sampling falling behind). No driver at all
gives one ``health`` sample in state "failed"; nothing here raises for a machine problem.

docs/metrics.md ("GPU (NVML)") describes every field, its unit, the NVML call and its caveats.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from typing import Any, Callable

from gputop.model import (
    HEALTH_DEGRADED, HEALTH_FAILED, HEALTH_OK, KIND_GPU, KIND_GPU_INFO, KIND_GPU_PROCS, KIND_HEALTH,
    Sample, clean_float, health_data,
)
from gputop.sources.nvml_fields import (  # noqa: F401  (re-exported: importers of the source's names)
    CLOCK_EVENT_REASONS, CLOCK_EVENT_WORDS, GPM_FIELDS, GPM_METRICS, GPM_PERCENT_FIELDS, GPU_FIELDS, METRICS, MIB,
    NVLINK_FIELDS, PCIE_FIELDS,
)

try:
    import pynvml as nv
except ImportError:  # a broken install: the source reports it instead of failing the import
    nv = None

NAME = "nvml"

# nvml.h: the gap between two nvmlGpmSampleGet calls "should be greater than 100ms due to the
# internal sample refresh rate". Closer gives SUCCESS with junk values, so this is a hard floor.
GPM_MIN_GAP_S = 0.1

# Jitter: gap = interval * (FLOOR + Exp(mean 1 - FLOOR)), capped at CAP * interval. The mean is
# the interval (the cap trims it by e^-7 * 0.5 ≈ 0.05%), the floor bounds the sampling rate (and
# so our CPU) at twice the nominal rate, and the exponential tail breaks any lock-step with a
# periodic training loop.
JITTER_FLOOR = 0.5
JITTER_CAP = 4.0

HEALTH_EVERY_S = 5.0          # a health sample at least this often, so the store never loses it
INFO_MIN_GAP_S = 1.0          # gpu_info re-emitted on change, at most this often per GPU
STOP_JOIN_S = 2.0             # stop() waits this long for the threads

NO_DRIVER_TAIL = "GPU panels are off; host and Python panels still work"


# ---------------------------------------------------------------------------------------------
# What we publish: the fields and clock-event reasons are in nvml_fields.py (no pynvml needed).

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


# ---------------------------------------------------------------------------------------------
# Pure helpers (tested without a GPU)

def jittered_gap(mean_s: float, rng: random.Random) -> float:
    """One sampling gap: mean ``mean_s``, never below JITTER_FLOOR * mean_s, never above
    JITTER_CAP * mean_s."""
    tail_mean = (1.0 - JITTER_FLOOR) * mean_s
    return min(JITTER_FLOOR * mean_s + rng.expovariate(1.0 / tail_mean), JITTER_CAP * mean_s)


class GpmGate:
    """Allows a GPM snapshot only when the previous one is at least GPM_MIN_GAP_S old."""

    def __init__(self, min_gap_s: float = GPM_MIN_GAP_S) -> None:
        self.min_gap_s = min_gap_s
        self.last: float | None = None

    def due(self, now: float) -> bool:
        return self.last is None or now - self.last >= self.min_gap_s

    def taken(self, now: float) -> None:
        self.last = now


def kbps_to_mibs(kb_per_s: float | None) -> float | None:
    """nvmlDeviceGetPcieThroughput's "KB/s" -> MiB/s. NVML does not say whether KB is 1000 or
    1024 bytes; a reading on the H200 matched GPM's MiB/s within ~1% taking KB = 1000 B."""
    if kb_per_s is None:
        return None
    return clean_float(kb_per_s * 1000.0 / MIB, 1)


def _err_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None) if nv is not None and isinstance(exc, nv.NVMLError) else None


def _code(name: str) -> int | None:
    return getattr(nv, name, None) if nv is not None else None


def _is_too_old(exc: BaseException) -> bool:
    """The driver (or the bindings) lack this call or this struct version."""
    if isinstance(exc, AttributeError):
        return True
    if nv is not None and isinstance(exc, nv.NVMLLibraryMismatchError):
        return True
    return _err_code(exc) in (_code("NVML_ERROR_FUNCTION_NOT_FOUND"), _code("NVML_ERROR_ARGUMENT_VERSION_MISMATCH"))


def nvml_reason(exc: BaseException) -> str:
    """A short phrase for why a value is missing (for gpu_info.na and health messages)."""
    if isinstance(exc, AttributeError):
        return "nvidia-ml-py too old"
    if _is_too_old(exc):
        return "driver too old"
    code = _err_code(exc)
    if code is None:
        return f"{type(exc).__name__}: {exc}"[:120]
    phrases = {
        "NVML_ERROR_NOT_SUPPORTED": "not supported",
        "NVML_ERROR_NO_PERMISSION": "no permission",
        "NVML_ERROR_LIBRARY_NOT_FOUND": "no driver",
        "NVML_ERROR_DRIVER_NOT_LOADED": "no driver",
        "NVML_ERROR_GPU_IS_LOST": "GPU is lost",
        "NVML_ERROR_NOT_FOUND": "not found",
        "NVML_ERROR_INVALID_ARGUMENT": "not supported by this driver",
        "NVML_ERROR_TIMEOUT": "timed out",
        "NVML_ERROR_UNINITIALIZED": "NVML not initialised",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver/library version mismatch",
        "NVML_ERROR_NO_DATA": "no data",
        "NVML_ERROR_NOT_READY": "not ready",
        "NVML_ERROR_INSUFFICIENT_POWER": "insufficient external power",
        "NVML_ERROR_RESET_REQUIRED": "GPU needs a reset",
        "NVML_ERROR_DEPRECATED": "removed from this driver",
        "NVML_ERROR_UNKNOWN": "unknown NVML error",
    }
    for name, phrase in phrases.items():
        if code == _code(name):
            return phrase
    return f"NVML error {code}"


def is_permanent(exc: BaseException) -> bool:
    """Will asking again give a different answer? Permanent failures stop being asked for and
    go into gpu_info.na; others are counted as transient errors in the health sample."""
    if _is_too_old(exc):
        return True
    return _err_code(exc) in (_code("NVML_ERROR_NOT_SUPPORTED"), _code("NVML_ERROR_NO_PERMISSION"),
                              _code("NVML_ERROR_INVALID_ARGUMENT"), _code("NVML_ERROR_DEPRECATED"))


def init_failure_message(exc: BaseException) -> str:
    """One line for the user when NVML cannot start at all."""
    code = _err_code(exc)
    if code == _code("NVML_ERROR_LIBRARY_NOT_FOUND"):
        return f"no NVIDIA driver (libnvidia-ml.so.1 not found): {NO_DRIVER_TAIL}"
    if code == _code("NVML_ERROR_DRIVER_NOT_LOADED"):
        return f"NVIDIA driver not loaded (is the nvidia kernel module in?): {NO_DRIVER_TAIL}"
    if code == _code("NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        return ("NVIDIA driver and libnvidia-ml versions differ (driver upgraded without a reboot?): "
                f"{NO_DRIVER_TAIL}")
    if code == _code("NVML_ERROR_NO_PERMISSION"):
        return f"no permission to use the NVIDIA driver (/dev/nvidia*): {NO_DRIVER_TAIL}"
    return f"NVML could not start ({nvml_reason(exc)}): {NO_DRIVER_TAIL}"


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _cuda_version(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


# ---------------------------------------------------------------------------------------------
# Per-GPU state

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
        self.proc_util_ts = 0
        self.lost = False
        self.watched = False
        self.chosen_by = "all"
        self.info_dirty = False
        self.info_urgent = False                   # watched changed: publish without delay
        self.info_sent_at = -math.inf


# ---------------------------------------------------------------------------------------------
# The source

class NvmlSource:
    """GPU counters through NVML. See the module docstring; the Source protocol is in model.py."""

    name = NAME

    def __init__(self, clock, target=None, gpu_indices: list[int] | None = None,
                 interval_s: float = 0.1, slow_interval_s: float = 1.0, time_calls: bool = False) -> None:
        self.clock = clock
        self.target = target
        self.gpu_indices = sorted(set(gpu_indices)) if gpu_indices else None
        self.interval_s = max(0.02, float(interval_s))
        self.slow_interval_s = max(0.2, float(slow_interval_s))
        self._emit_fn: Callable[[Sample], None] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._fast: threading.Thread | None = None
        self._slow: threading.Thread | None = None
        self._rng = random.Random()
        self._gpus: list[_Gpu] = []
        self._system: dict = {}
        self._state = "starting"
        self._health: tuple[str, str] | None = None
        self._health_sent_at = -math.inf
        self._health_checked_at = -math.inf
        self._recent_errors: deque[tuple[float, dict]] = deque()
        self._fixed_notes: list[str] = []          # bad --gpu indices and the like
        self._transient: dict[tuple[str, str, str], int] = {}
        self._ticks: deque[float] = deque(maxlen=1024)
        self._auto = target is not None and self.gpu_indices is None
        self._target_seen = False
        # Per-call timings for benchmarks/nvml_check.py: name -> deque of (wall ns, thread CPU ns).
        self._timings: dict[str, deque] | None = {} if time_calls else None

    # -- Source protocol --------------------------------------------------------------------
    def start(self, emit) -> None:
        if self._fast is not None:
            return
        self._emit_fn = emit
        self._fast = threading.Thread(target=self._fast_main, name="gputop-nvml-fast", daemon=True)
        self._fast.start()

    def stop(self) -> None:
        self._stop.set()
        for th in (self._fast, self._slow):
            if th is not None and th is not threading.current_thread():
                th.join(timeout=STOP_JOIN_S)

    def describe(self) -> dict:
        bindings = _bindings_version()
        with self._lock:
            gpus = [{"index": g.index, "name": g.info.get("name"), "uuid": g.info.get("uuid"),
                     "pci_bus_id": g.info.get("pci_bus_id"), "mem_total": g.info.get("mem_total"),
                     "gpm": g.info.get("gpm"), "watched": g.watched, "na": dict(g.na)} for g in self._gpus]
            out = {
                "state": self._state,
                "message": self._health[1] if self._health else "",
                "driver": self._system.get("driver"),
                "nvml_version": self._system.get("nvml_version"),
                "cuda_driver": self._system.get("cuda_driver"),
                "nvidia_ml_py": bindings,
                "gpus": gpus,
                "gpu_indices": self.gpu_indices,
                "rates": {"gpu_hz": round(1.0 / self.interval_s, 3),
                          "gpu_procs_hz": round(1.0 / self.slow_interval_s, 3),
                          "jitter": f"shifted exponential, mean = interval, within "
                                    f"[{JITTER_FLOOR}, {JITTER_CAP}] x interval",
                          "gpm_min_gap_s": GPM_MIN_GAP_S},
            }
        return out

    def call_timings(self) -> dict[str, dict]:
        """Median wall and thread-CPU microseconds per NVML call (only with time_calls=True)."""
        out = {}
        for name, dq in list((self._timings or {}).items()):
            vals = list(dq)
            if not vals:
                continue
            walls = sorted(w for w, _ in vals)
            cpus = sorted(c for _, c in vals)
            out[name] = {"n": len(vals), "median_us": round(walls[len(walls) // 2] / 1000, 1),
                         "max_us": round(walls[-1] / 1000, 1), "cpu_median_us": round(cpus[len(cpus) // 2] / 1000, 1)}
        return out

    # -- plumbing ---------------------------------------------------------------------------
    def _emit(self, kind: str, key: str, data: dict, t: float | None = None) -> None:
        if self._emit_fn is None:
            return
        try:
            self._emit_fn(Sample(self.clock.now() if t is None else t, kind, key, data))
        except Exception as e:  # a subscriber's bug must not stop the GPU sampling
            with self._lock:
                k = (key, f"publishing {kind}", f"{type(e).__name__}: {e}"[:120])
                self._transient[k] = self._transient.get(k, 0) + 1

    def _call(self, name: str, fn, *args, **kwargs):
        if self._timings is None:
            return fn(*args, **kwargs)
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            dq = self._timings.get(name)
            if dq is None:
                dq = self._timings.setdefault(name, deque(maxlen=4096))
            dq.append((w1 - w0, c1 - c0))

    def _note_error(self, gpu: _Gpu, fields: tuple[str, ...], call: str, exc: BaseException) -> None:
        """Record why ``fields`` are None: permanently (gpu_info.na) or as a transient error."""
        reason = nvml_reason(exc)
        if _err_code(exc) == _code("NVML_ERROR_GPU_IS_LOST"):
            self._lose(gpu)
        elif fields and is_permanent(exc):
            self._set_na(gpu, fields, reason)
        else:
            with self._lock:
                k = (gpu.key, call, reason)
                self._transient[k] = self._transient.get(k, 0) + 1

    def _set_na(self, gpu: _Gpu, fields, reason: str) -> None:
        changed = False
        for f in fields:
            if gpu.na.get(f) != reason:
                gpu.na[f] = reason
                changed = True
        if changed:
            gpu.info_dirty = True

    def _lose(self, gpu: _Gpu) -> None:
        if gpu.lost:
            return
        gpu.lost = True
        self._set_na(gpu, [f for f in GPU_FIELDS if f != "mem_total"] + ["proc_mem", "proc_sm_pct"],
                     "GPU is lost")

    def _read(self, gpu: _Gpu, fields: tuple[str, ...], name: str, fn, *args, **kwargs):
        """One NVML reading for ``fields``; None (and the reason noted) when it fails."""
        if fields[0] in gpu.na or gpu.lost:
            return None
        try:
            return self._call(name, fn, gpu.handle, *args, **kwargs)
        except Exception as e:  # NVMLError, NVMLLibraryMismatchError, ctypes trouble: never raise
            self._note_error(gpu, fields, name, e)
            return None

    # -- start-up ---------------------------------------------------------------------------
    def _fast_main(self) -> None:
        inited = False
        try:
            if nv is None:
                self._fail("nvidia-ml-py is not installed (pip install nvidia-ml-py): " + NO_DRIVER_TAIL)
                return
            try:
                nv.nvmlInit()
                inited = True
            except Exception as e:
                self._fail(init_failure_message(e))
                return
            if not self._setup():
                return
            self._slow = threading.Thread(target=self._slow_main, name="gputop-nvml-slow", daemon=True)
            self._slow.start()
            self._fast_loop()
        except Exception as e:  # a bug of ours: say so, do not take gputop down
            self._fail(f"NVML source stopped: {type(e).__name__}: {e}")
        finally:
            self._cleanup(inited)

    def _fail(self, message: str) -> None:
        """Publish a failed health sample and repeat it every HEALTH_EVERY_S until stop(), so a
        store with a bounded window (and a replay) still shows why the GPU panels are empty."""
        with self._lock:
            self._state = HEALTH_FAILED
            self._health = (HEALTH_FAILED, message)
        while True:
            try:
                self._emit(KIND_HEALTH, NAME, health_data(HEALTH_FAILED, message, None))
            except Exception:
                pass
            if self._stop.wait(HEALTH_EVERY_S):
                return

    def _cleanup(self, inited: bool) -> None:
        slow = self._slow
        if slow is not None:
            slow.join(timeout=STOP_JOIN_S)
            if slow.is_alive():
                return  # it is inside an NVML call: shutting NVML down now could crash us
        for gpu in self._gpus:
            if gpu.gpm is not None:
                gpu.gpm.free()
                gpu.gpm = None
        if inited:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass

    def _system_facts(self) -> None:
        def get(fn_name: str):
            fn = getattr(nv, fn_name, None)
            if fn is None:
                return None
            try:
                return self._call(fn_name, fn)
            except Exception:
                return None

        cuda = get("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = get("nvmlSystemGetCudaDriverVersion")
        driver, nvml_version = get("nvmlSystemGetDriverVersion"), get("nvmlSystemGetNVMLVersion")
        with self._lock:
            self._system = {"driver": _text(driver) if driver is not None else None,
                            "nvml_version": _text(nvml_version) if nvml_version is not None else None,
                            "cuda_driver": _cuda_version(cuda)}

    def _setup(self) -> bool:
        self._system_facts()
        try:
            count = self._call("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
        except Exception as e:
            self._fail(f"NVML cannot count the GPUs ({nvml_reason(e)}): {NO_DRIVER_TAIL}")
            return False
        if count == 0:
            self._fail(f"the NVIDIA driver sees no GPU (in a container started without --gpus?): {NO_DRIVER_TAIL}")
            return False
        gpus = []
        for i in range(count):
            try:
                handle = self._call("nvmlDeviceGetHandleByIndex", nv.nvmlDeviceGetHandleByIndex, i)
            except Exception as e:
                self._fixed_notes.append(f"GPU {i} cannot be opened ({nvml_reason(e)})")
                continue
            gpu = _Gpu(i, handle)
            self._gpu_facts(gpu)
            gpus.append(gpu)
        if not gpus:
            self._fail(f"no GPU could be opened ({'; '.join(self._fixed_notes)}): {NO_DRIVER_TAIL}")
            return False
        with self._lock:
            self._gpus = gpus  # from here on _cleanup frees their GPM buffers
        known = {g.index for g in gpus}
        if self.gpu_indices is not None:
            bad = [i for i in self.gpu_indices if i not in known]
            if bad:
                have = ", ".join(str(g.index) for g in gpus)
                note = f"no GPU {', '.join(map(str, bad))} (NVML sees {len(gpus)}: {have})"
                if len(bad) == len(self.gpu_indices):
                    self._fail(f"{note}: pick --gpu from nvidia-smi's indices; GPU panels are off")
                    return False
                self._fixed_notes.append(note + ", ignored")
        with self._lock:
            for g in gpus:
                if self.gpu_indices is not None:
                    g.watched, g.chosen_by = g.index in self.gpu_indices, "user"
                else:
                    g.watched, g.chosen_by = True, "all"
        for g in gpus:
            self._emit_info(g, force=True)
        self._state = HEALTH_OK
        self._update_health(force=True)
        return True

    def _gpu_facts(self, gpu: _Gpu) -> None:
        """Static facts, and which readings this GPU cannot give (gpu_info.na)."""
        h = gpu.handle
        info = gpu.info

        def get(name: str, *args, fields: tuple[str, ...] = ()):
            fn = getattr(nv, name, None)
            if fn is None:
                if fields:
                    self._set_na(gpu, fields, "nvidia-ml-py too old")
                return None
            try:
                return self._call(name, fn, h, *args)
            except Exception as e:
                if fields:
                    self._note_error(gpu, fields, name, e)
                return None

        name = get("nvmlDeviceGetName")
        uuid = get("nvmlDeviceGetUUID")
        pci = get("nvmlDeviceGetPciInfo")
        info.update({
            "name": _text(name) if name is not None else None,
            "uuid": _text(uuid) if uuid is not None else None,
            "pci_bus_id": _text(pci.busId) if pci is not None else None,
            "driver": self._system.get("driver"),
            "nvml_version": self._system.get("nvml_version"),
            "cuda_driver": self._system.get("cuda_driver"),
        })
        mem = self._read_memory(gpu)
        gpu.mem_total = mem[0] if mem else None
        info["mem_total"] = gpu.mem_total
        self._read_power_limit(gpu)
        info["clock_sm_max_mhz"] = get("nvmlDeviceGetMaxClockInfo", getattr(nv, "NVML_CLOCK_SM", 1),
                                       fields=("clock_sm_max_mhz",))
        info["clock_mem_max_mhz"] = get("nvmlDeviceGetMaxClockInfo", getattr(nv, "NVML_CLOCK_MEM", 2),
                                        fields=("clock_mem_max_mhz",))
        arch = get("nvmlDeviceGetArchitecture")
        info["architecture"] = arch
        mig = get("nvmlDeviceGetMigMode")
        info["mig"] = bool(mig[0]) if mig else False
        self._setup_gpm(gpu, arch)
        info["gpm"] = gpu.gpm is not None

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

    # -- readings ---------------------------------------------------------------------------
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
        if not gpm.gate.due(time.monotonic()):
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

    def _gpu_sample(self, gpu: _Gpu) -> dict:
        util = self._read(gpu, ("util_gpu", "util_mem"), "nvmlDeviceGetUtilizationRates", nv.nvmlDeviceGetUtilizationRates)
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
        if gpu.gpm is None and gpu.pcie_pending is not None:
            # Without GPM, PCIe rates come from the slow loop: each reading goes into exactly
            # one fast sample, so statistics count it once.
            with self._lock:
                pending, gpu.pcie_pending = gpu.pcie_pending, None
            if pending is not None:
                data["pcie_tx_mibs"], data["pcie_rx_mibs"] = pending
        return data

    # -- fast loop ----------------------------------------------------------------------------
    def _fast_loop(self) -> None:
        next_at = time.monotonic()
        while True:
            wait = next_at - time.monotonic()
            if self._stop.wait(max(0.0, wait)):
                return
            start = time.monotonic()
            t = self.clock.now()
            for gpu in self._watched():
                if gpu.lost:
                    continue
                try:
                    data = self._gpu_sample(gpu)
                except Exception as e:  # a bug of ours: count it and keep sampling
                    self._note_error(gpu, (), "gpu sample", e)
                    continue
                if gpu.lost:  # found out during this sample
                    continue
                self._emit(KIND_GPU, gpu.key, data, t)
            self._ticks.append(start)
            for gpu in self._gpus:
                if gpu.info_dirty:
                    self._emit_info(gpu, force=gpu.info_urgent)
            self._update_health()
            # No catch-up bursts after a stall: the next gap starts from now at the latest.
            next_at = max(next_at, start) + jittered_gap(self.interval_s, self._rng)
            if next_at < time.monotonic():
                next_at = time.monotonic()

    def _watched(self) -> list[_Gpu]:
        with self._lock:
            return [g for g in self._gpus if g.watched]

    def _emit_info(self, gpu: _Gpu, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - gpu.info_sent_at < INFO_MIN_GAP_S:
            return
        with self._lock:
            data = dict(gpu.info)
            data.update({"watched": gpu.watched, "chosen_by": gpu.chosen_by, "na": dict(gpu.na)})
            gpu.info_dirty = gpu.info_urgent = False
            gpu.info_sent_at = now
        for k in ("index", "name", "uuid", "pci_bus_id", "driver", "nvml_version", "cuda_driver", "mem_total",
                  "power_limit_w", "clock_sm_max_mhz", "clock_mem_max_mhz", "gpm"):
            data.setdefault(k, None)
        self._emit(KIND_GPU_INFO, gpu.key, data)

    def _update_health(self, force: bool = False) -> None:
        """Re-evaluate about once a second; publish on change and at least every HEALTH_EVERY_S."""
        now = time.monotonic()
        if not force and now - self._health_checked_at < 1.0:
            return
        self._health_checked_at = now
        with self._lock:
            fresh, self._transient = self._transient, {}
            watched = [g for g in self._gpus if g.watched]
            lost = [g.index for g in self._gpus if g.lost]
        if fresh:
            self._recent_errors.append((now, fresh))
        while self._recent_errors and self._recent_errors[0][0] < now - HEALTH_EVERY_S:
            self._recent_errors.popleft()
        errors: dict[tuple[str, str, str], int] = {}
        for _, batch in self._recent_errors:
            for k, n in batch.items():
                errors[k] = errors.get(k, 0) + n

        ticks = [t for t in self._ticks if t >= now - HEALTH_EVERY_S]
        span = min(HEALTH_EVERY_S, now - self._ticks[0]) if self._ticks else 0.0
        rate = round(len(ticks) / span, 2) if span >= 1.0 else None

        problems = list(self._fixed_notes)
        if lost:
            problems.append(f"GPU {', '.join(map(str, lost))} is lost (fell off the bus?): no more samples from it")
        if errors:
            worst = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
            problems.append("NVML errors in the last 5 s: "
                            + "; ".join(f"GPU {gpu} {call}: {reason} x{n}" for (gpu, call, reason), n in worst))
        nominal = 1.0 / self.interval_s
        if rate is not None and rate < 0.5 * nominal:
            problems.append(f"sampling slower than planned ({rate:g} of {nominal:g} Hz): the machine is busy")
        state = HEALTH_DEGRADED if problems else HEALTH_OK
        message = "; ".join(problems) if problems else self._ok_message(watched)
        if not force and (state, message) == self._health and now - self._health_sent_at < HEALTH_EVERY_S:
            return
        with self._lock:
            self._state, self._health = state, (state, message)
            self._health_sent_at = now
        self._emit(KIND_HEALTH, NAME, health_data(state, message, rate))

    def _ok_message(self, watched: list[_Gpu]) -> str:
        if self.gpu_indices is not None:
            why = "chosen with --gpu"
        elif self.target is None:
            why = "all GPUs"
        elif self._target_seen:
            why = "the target's processes run there"
        else:
            why = "all GPUs until the target uses one"
        msg = f"watching GPU {', '.join(str(g.index) for g in watched)} of {len(self._gpus)} ({why})"
        no_gpm = [g for g in watched if g.gpm is None]
        if no_gpm:
            reason = no_gpm[0].na.get("sm_active", "unavailable")
            msg += f"; GPM n/a on GPU {', '.join(str(g.index) for g in no_gpm)} ({reason}): no SM active/occupancy/tensor/DRAM"
        return msg

    # -- slow loop ----------------------------------------------------------------------------
    def _slow_main(self) -> None:
        while True:  # the first tick at once: the GPU choice and gpu_procs should not wait
            try:
                self._slow_tick()
            except Exception as e:  # a bug of ours: report it, keep going
                with self._lock:
                    k = ("-", "slow loop", f"{type(e).__name__}: {e}"[:120])
                    self._transient[k] = self._transient.get(k, 0) + 1
            if self._stop.wait(jittered_gap(self.slow_interval_s, self._rng)):
                return

    def _tree_pids(self) -> set[int] | None:
        if self.target is None:
            return None
        try:
            return {p.pid for p in self.target.tree(max_age_s=1.0)}
        except Exception:
            return {self.target.pid}

    def _running_procs(self, gpu: _Gpu) -> list | None:
        """Compute processes on the GPU: v3, falling back to v2 on older drivers."""
        if "proc_mem" in gpu.na or gpu.lost:
            return None
        if gpu.procs_v3:
            try:
                return self._call("nvmlDeviceGetComputeRunningProcesses", nv.nvmlDeviceGetComputeRunningProcesses, gpu.handle)
            except Exception as e:
                if not _is_too_old(e) or not hasattr(nv, "nvmlDeviceGetComputeRunningProcesses_v2"):
                    self._note_error(gpu, ("proc_mem",), "nvmlDeviceGetComputeRunningProcesses", e)
                    return None
            gpu.procs_v3 = False
        return self._read(gpu, ("proc_mem",), "nvmlDeviceGetComputeRunningProcesses_v2",
                          nv.nvmlDeviceGetComputeRunningProcesses_v2)

    def _proc_sm(self, gpu: _Gpu) -> tuple[dict[int, float], str | None]:
        """Per-process SM % since the last read (time-based, like util_gpu), and why it is empty."""
        if "proc_sm_pct" in gpu.na:
            return {}, gpu.na["proc_sm_pct"]
        since = gpu.proc_util_ts or int((time.time() - self.slow_interval_s) * 1e6)
        try:
            samples = self._call("nvmlDeviceGetProcessUtilization", nv.nvmlDeviceGetProcessUtilization, gpu.handle, since)
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
            procs = self._running_procs(gpu)
            if procs is None:
                continue  # no sample rather than an empty list: gpu_info.na or health says why
            mine: dict[int, int | None] = {}
            other_pids: set[int] = set()
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
                    other_mem = other_mem + used if (other_mem is not None and used is not None) else None
            other_count = len(other_pids)
            if self._auto and tree is not None and mine and gpu.chosen_by != "target":
                newly.append(gpu)
            if not gpu.watched and gpu not in newly:
                continue
            self._read_power_limit(gpu)
            sm, sm_na = self._proc_sm(gpu) if mine else ({}, None)
            data = {"procs": {str(pid): {"mem": mem, "sm_pct": sm.get(pid)} for pid, mem in sorted(mine.items())},
                    "other_count": other_count, "other_mem": other_mem,
                    "sm_na": sm_na}
            self._emit(KIND_GPU_PROCS, gpu.key, data)
            if gpu.gpm is None and "pcie_tx_mibs" not in gpu.na:
                self._read_pcie(gpu)
        if newly:
            self._choose(newly)

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


def _bindings_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("nvidia-ml-py")
    except Exception:
        return None
