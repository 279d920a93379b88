"""NVML source: GPU counters from the NVIDIA driver through nvidia-ml-py (module ``pynvml``).

Two threads, each at its own jittered rate:

* the **fast loop** (``interval_s``, ~10 Hz): cheap counters on every watched GPU (utilization,
  memory v2, power, clocks, temperature, clock-event reasons; a few µs each) and, on GPUs with
  GPM (Hopper and newer), the GPM metrics SM active, SM occupancy, tensor active, DRAM bandwidth,
  graphics engine active, PCIe and NVLink rates. GPM values are the difference of two GPM
  snapshots, and two snapshots closer than 100 ms give silent garbage (measured on an H200: SM
  active 0.0 and DRAM NaN), and the metrics call costs ~1 ms, so a GPU's GPM snapshot is taken
  only when its previous one is at least ``GPM_EVERY_S`` (0.5 s; never under the 100 ms
  ``GPM_MIN_GAP_S``) old; on the other ticks the GPM fields are None (gpm.py).
* the **slow loop** (``slow_interval_s``, ~1 Hz): the processes on each GPU (which GPUs the
  target uses, and their GPU memory and SM %), the power limit, and, on GPUs without GPM only,
  ``nvmlDeviceGetPcieThroughput``, which blocks ~20 ms per call and so never runs in the fast loop.

Intervals are jittered (a shifted exponential with the interval as its mean) so that samples do
not lock onto the period of a training step.

Missing values are None, never 0. Why a value is missing is in the ``na`` dict of the GPU's
``gpu_info`` sample (permanent: "not supported", "no permission", "driver too old", ...) or in
the ``health`` sample (transient errors, a lost GPU, sampling falling behind). No driver at all
gives one ``health`` sample in state "failed"; nothing here raises for a machine problem.

Where each part lives: this module (start-up, the fast loop, health, the Source protocol);
nvml_gpu.py (per-GPU state, the fast loop's readings); gpm.py (GPM); nvml_slow.py (the slow
loop); nvml_errors.py (NVML's errors in words); nvml_fields.py (the fields, without pynvml).

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
    HEALTH_DEGRADED, HEALTH_FAILED, HEALTH_OK, KIND_GPU, KIND_GPU_INFO, KIND_HEALTH, Sample, health_data,
)
from gputop.sources.base import HEALTH_EVERY_S, Heartbeat, ThreadedSource, jittered
from gputop.sources.calm import CALM_FACTOR
# Re-exported: importers of the source's names (tests, benchmarks, the UI's help) find them here.
from gputop.sources.gpm import GPM_MIN_GAP_S, GpmGate, GpmReadings, _Gpm  # noqa: F401
from gputop.sources.nvml_errors import (  # noqa: F401
    NO_DRIVER_TAIL, _code, _err_code, init_failure_message, is_permanent, nv, nvml_reason,
)
from gputop.sources.nvml_fields import (  # noqa: F401
    CLOCK_EVENT_REASONS, CLOCK_EVENT_WORDS, GPM_EVERY_S, GPM_FIELDS, GPM_METRICS, GPM_PERCENT_FIELDS, GPU_FIELDS,
    METRICS, MIB, NVLINK_FIELDS, PCIE_FIELDS,
)
from gputop.sources.nvml_gpu import CLOCK_EVENT_BITS, GpuReadings, _Gpu, decode_clock_events  # noqa: F401
from gputop.sources.nvml_slow import SlowLoop, kbps_to_mibs  # noqa: F401

NAME = "nvml"

# Jitter: gap = interval * (FLOOR + Exp(mean 1 - FLOOR)), capped at CAP * interval (base.jittered).
# The mean is the interval (the cap trims it by e^-7 * 0.5 ≈ 0.05%), the floor bounds the sampling
# rate (and so our CPU) at twice the nominal rate, and the exponential tail breaks any lock-step
# with a periodic training loop.
JITTER_FLOOR = 0.5
JITTER_CAP = 4.0

INFO_MIN_GAP_S = 1.0          # gpu_info re-emitted on change, at most this often per GPU
STOP_JOIN_S = 2.0             # stop() waits this long for the threads


def jittered_gap(mean_s: float, rng: random.Random) -> float:
    """One sampling gap: mean ``mean_s``, never below JITTER_FLOOR * mean_s, never above
    JITTER_CAP * mean_s."""
    return jittered(mean_s, rng, floor=JITTER_FLOOR, cap=JITTER_CAP)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _cuda_version(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


# ---------------------------------------------------------------------------------------------
# The source: start-up, plumbing, the fast loop and health here; the GPU readings, GPM and the
# slow loop are mixins (nvml_gpu.py, gpm.py, nvml_slow.py) that call this plumbing.

class NvmlSource(GpuReadings, GpmReadings, SlowLoop, ThreadedSource):
    """GPU counters through NVML. See the module docstring; the Source protocol is in model.py.
    ThreadedSource's thread is the fast loop's; it starts the slow loop's own thread."""

    name = NAME
    thread_name = "gputop-nvml-fast"

    def __init__(self, clock, target=None, gpu_indices: list[int] | None = None,
                 interval_s: float = 0.1, slow_interval_s: float = 1.0, time_calls: bool = False,
                 calm=None) -> None:
        self.clock = clock
        # While the job is calm (gputop/sources/calm.py: a JobCalm, or None for always the set
        # interval), the fast loop and GPM sample CALM_FACTOR times less often: every GPU sample
        # costs its NVML calls here (this thread: 0.67% of a core at 10 Hz on the H200, 0.33-0.37%
        # at 5 Hz; benchmarks/cpu_profile.py) and then its store insert, recording and processing.
        self.calm = calm
        self._interval_factor = 1.0
        self._factor_changed_at = -math.inf   # monotonic: the last change of the factor
        self.target = target
        self.gpu_indices = sorted(set(gpu_indices)) if gpu_indices else None
        self.interval_s = max(0.02, float(interval_s))
        self.slow_interval_s = max(0.2, float(slow_interval_s))
        self._init_thread()                        # _stop, _thread (the fast loop), _emit
        self._emit: Callable[[Sample], None] | None = None
        self._lock = threading.Lock()
        self._slow: threading.Thread | None = None
        self._rng = random.Random()
        self._gpus: list[_Gpu] = []
        self._system: dict = {}
        self._state = "starting"
        self._health: tuple[str, str] | None = None
        self._heartbeat = Heartbeat(HEALTH_EVERY_S, at=-math.inf)
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
    def stop(self) -> None:
        self._stop.set()
        for th in (self._thread, self._slow):
            if th is not None and th is not threading.current_thread():  # a subscriber may stop us
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
                          "gpm_min_gap_s": GPM_MIN_GAP_S, "gpm_every_s": GPM_EVERY_S,
                          "calm_interval_factor": CALM_FACTOR if self.calm is not None else None},
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
    def _publish(self, kind: str, key: str, data: dict, t: float | None = None) -> None:
        if self._emit is None:
            return
        try:
            self._emit(Sample(self.clock.now() if t is None else t, kind, key, data))
        except Exception as e:  # a subscriber's bug must not stop the GPU sampling
            with self._lock:
                k = (key, f"publishing {kind}", f"{type(e).__name__}: {e}"[:120])
                self._transient[k] = self._transient.get(k, 0) + 1

    def _gap(self, mean_s: float) -> float:
        return jittered_gap(mean_s, self._rng)

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
    def _main(self) -> None:
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
                self._publish(KIND_HEALTH, NAME, health_data(HEALTH_FAILED, message, None))
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

    # -- fast loop ----------------------------------------------------------------------------
    def _fast_loop(self) -> None:
        next_at = time.monotonic()
        while True:
            wait = next_at - time.monotonic()
            if self._nap(max(0.0, wait)):
                return
            start = time.monotonic()
            t = self.clock.now()
            factor = float(CALM_FACTOR) if self.calm is not None and self.calm.calm() else 1.0
            if factor != self._interval_factor:
                self._interval_factor, self._factor_changed_at = factor, start
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
                if self._interval_factor > 1.0:
                    # one sample for CALM_FACTOR of the full rate's: the report's statistics weight
                    # it so (derive/record_stats.py), so a mean over hours stays a mean over time
                    data["calm_factor"] = CALM_FACTOR
                self._publish(KIND_GPU, gpu.key, data, t)
            self._ticks.append(start)
            for gpu in self._gpus:
                if gpu.info_dirty:
                    self._emit_info(gpu, force=gpu.info_urgent)
            self._update_health()
            # No catch-up bursts after a stall: the next gap starts from now at the latest.
            next_at = max(next_at, start) + self._gap(self.interval_s * self._interval_factor)
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
        self._publish(KIND_GPU_INFO, gpu.key, data)

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
        nominal = 1.0 / (self.interval_s * self._interval_factor)
        # the rate is measured over the last HEALTH_EVERY_S: not across a change of the interval
        if rate is not None and rate < 0.5 * nominal and now - self._factor_changed_at >= HEALTH_EVERY_S:
            problems.append(f"sampling slower than planned ({rate:g} of {nominal:g} Hz): the machine is busy")
        state = HEALTH_DEGRADED if problems else HEALTH_OK
        message = "; ".join(problems) if problems else self._ok_message(watched)
        calm = self._interval_factor > 1.0
        if not self._heartbeat.due((state, message, calm), now, force):
            return
        with self._lock:
            self._state, self._health = state, (state, message)
            self._heartbeat.mark((state, message, calm), now)
        self._publish(KIND_HEALTH, NAME, health_data(state, message, rate, calm=calm))

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
            msg += (f"; GPM n/a on GPU {', '.join(str(g.index) for g in no_gpm)} ({reason}): "
                    "no SM active/occupancy/tensor/DRAM")
        return msg


def _bindings_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("nvidia-ml-py")
    except Exception:
        return None
