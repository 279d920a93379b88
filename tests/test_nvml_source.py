"""The NVML source: the no-driver path for real, and its pure logic with real pynvml types.

This machine has no NVIDIA driver, so the no-driver tests run the real source end to end. The
tests marked ``needs_driver`` run only where libnvidia-ml.so.1 loads (the H200 machine:
``python3 -m pytest tests/test_nvml_source.py``); benchmarks/nvml_check.py measures the rest.
"""

from __future__ import annotations

import ctypes
import json
import random
import statistics
import subprocess
import sys
import threading
import time

import pynvml as nv
import pytest

from gputop.model import KIND_GPU, KIND_GPU_INFO, KIND_GPU_PROCS, KIND_HEALTH, MetricSpec
from gputop.session.session import SessionClock
from gputop.sources import nvml
from gputop.sources.nvml import (
    CLOCK_EVENT_BITS, CLOCK_EVENT_WORDS, GPM_EVERY_S, GPM_FIELDS, GPM_METRICS, GPM_MIN_GAP_S, GPU_FIELDS, METRICS,
    GpmGate, NvmlSource, decode_clock_events, init_failure_message, is_permanent, jittered_gap,
    kbps_to_mibs, nvml_reason,
)
from gputop.sources.calm import CALM_FACTOR, CALM_HELD_FACTOR, JobCalm
from gputop.sources.nvml_fields import GPM_HOLD_S
from gputop.sources.target import Target


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


HAVE_DRIVER = _driver_present()
no_driver = pytest.mark.skipif(HAVE_DRIVER,
                               reason="an NVIDIA driver is installed: the no-driver path cannot happen here")
needs_driver = pytest.mark.skipif(not HAVE_DRIVER, reason="no NVIDIA driver on this machine (run on the GPU machine)")


class Collect:
    def __init__(self) -> None:
        self.samples = []
        self.lock = threading.Lock()

    def __call__(self, sample) -> None:
        with self.lock:
            self.samples.append(sample)

    def of(self, kind: str) -> list:
        with self.lock:
            return [s for s in self.samples if s.kind == kind]

    def wait_for(self, kind: str, timeout: float = 5.0, n: int = 1) -> list:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = self.of(kind)
            if len(got) >= n:
                return got
            time.sleep(0.02)
        return self.of(kind)


def _nvml_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gputop-nvml")]


@pytest.fixture
def sleeper():
    """A real Python process to be the target."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


# ---------------------------------------------------------------------------------------------
# No driver: the real source, end to end

@no_driver
@pytest.mark.parametrize("with_target", [False, True])
def test_no_driver_publishes_one_clear_failure_and_nothing_else(sleeper, with_target):
    target = Target(sleeper.pid) if with_target else None
    src = NvmlSource(SessionClock(), target=target, gpu_indices=[0] if with_target else None)
    got = Collect()
    t0 = time.monotonic()
    src.start(got)
    assert time.monotonic() - t0 < 0.5, "start() must return at once"
    health = got.wait_for(KIND_HEALTH)
    time.sleep(0.3)  # anything else it would publish has had time to show up
    assert health, "no health sample: the user would not learn why the GPU panels are empty"
    h = health[0]
    assert h.key == "nvml"
    assert h.data["state"] == "failed"
    msg = h.data["message"]
    assert "no NVIDIA driver" in msg and "libnvidia-ml.so.1" in msg
    assert "host and Python panels still work" in msg
    assert "Traceback" not in msg and "\n" not in msg
    assert not got.of(KIND_GPU) and not got.of(KIND_GPU_INFO) and not got.of(KIND_GPU_PROCS)

    t0 = time.monotonic()
    src.stop()
    assert time.monotonic() - t0 < 1.0, "stop() must return quickly"
    assert not _nvml_threads(), "the source's threads outlived stop()"
    d = src.describe()
    assert d["state"] == "failed" and d["gpus"] == []
    json.dumps(d)  # goes into the recording's metadata


@no_driver
def test_no_driver_failure_is_repeated_so_a_bounded_store_keeps_it(monkeypatch):
    # The store forgets samples older than its horizon: the failure must come back periodically.
    monkeypatch.setattr(nvml, "HEALTH_EVERY_S", 0.2)
    src = NvmlSource(SessionClock())
    got = Collect()
    src.start(got)
    health = got.wait_for(KIND_HEALTH, timeout=3.0, n=3)
    src.stop()
    assert len(health) >= 3
    assert all(h.data["state"] == "failed" for h in health)
    assert health[-1].t > health[0].t


def test_sampling_with_every_nvml_call_failing_gives_none_never_zero_or_an_exception():
    # Without nvmlInit, every pynvml call really raises NVMLError_Uninitialized: the readings of
    # a GPU must all come back None, counted as transient errors, never raised, never 0.
    src = NvmlSource(SessionClock())
    got = Collect()
    src._emit = got
    gpu = nvml._Gpu(0, nv.c_nvmlDevice_t())
    gpu.watched = True
    src._gpus = [gpu]
    data = src._gpu_sample(gpu)
    assert set(data) == set(GPU_FIELDS)
    assert all(v is None for v in data.values()), {k: v for k, v in data.items() if v is not None}
    assert gpu.na == {}, "a transient error must not be reported as 'not supported'"
    src._slow_tick()  # per-process reads fail the same way: no gpu_procs sample, no exception
    assert not got.of(KIND_GPU_PROCS)
    src._update_health(force=True)
    h = got.of(KIND_HEALTH)[-1]
    assert h.data["state"] == "degraded"
    assert "NVML not initialised" in h.data["message"] and "GPU 0" in h.data["message"]


# ---------------------------------------------------------------------------------------------
# Pure logic with real pynvml types

def test_clock_events_decode_from_pynvml_bits():
    mask = nv.nvmlClocksEventReasonSwPowerCap | nv.nvmlClocksEventReasonGpuIdle
    assert decode_clock_events(mask) == ["gpu_idle", "sw_power_cap"]
    assert decode_clock_events(nv.nvmlClocksEventReasonHwThermalSlowdown) == ["hw_thermal"]
    assert decode_clock_events(nv.nvmlClocksThrottleReasonBoardLimit) == ["board_limit"]
    assert decode_clock_events(0) == []
    assert decode_clock_events(None) is None
    # A bit this version does not know is kept, not dropped.
    assert decode_clock_events(0x4 | 0x8000) == ["sw_power_cap", "unknown_0x8000"]
    # The measured H200 case: a bf16 GEMM at the 700 W cap read 0x4.
    assert decode_clock_events(0x4) == ["sw_power_cap"]


def test_every_clock_event_bit_matches_pynvml_and_has_words():
    for bit, name in CLOCK_EVENT_BITS:
        assert bin(bit).count("1") == 1
        assert CLOCK_EVENT_WORDS[name] and "\n" not in CLOCK_EVENT_WORDS[name]
    by_name = dict((n, b) for b, n in CLOCK_EVENT_BITS)
    assert by_name["sw_power_cap"] == nv.nvmlClocksEventReasonSwPowerCap
    assert by_name["hw_slowdown"] == nv.nvmlClocksEventReasonHwSlowdown
    assert by_name["sw_thermal"] == nv.nvmlClocksEventReasonSwThermalSlowdown
    assert by_name["hw_power_brake"] == nv.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert CLOCK_EVENT_WORDS["sw_power_cap"] == "power cap (software)"
    assert CLOCK_EVENT_WORDS["hw_thermal"] == "thermal slowdown (hardware)"
    # The UI words them from the same table (no pynvml needed there).
    from gputop.ui.sourceinfo import clock_event_words
    assert clock_event_words() == CLOCK_EVENT_WORDS


@pytest.mark.parametrize("exc, reason, permanent", [
    (nv.NVMLError_NotSupported(), "not supported", True),
    (nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED), "not supported", True),
    (nv.NVMLError_NoPermission(), "no permission", True),
    (nv.NVMLError_FunctionNotFound(), "driver too old", True),
    (nv.NVMLError_ArgumentVersionMismatch(), "driver too old", True),
    (nv.NVMLLibraryMismatchError("Unversioned function called"), "driver too old", True),
    (nv.NVMLError_InvalidArgument(), "not supported by this driver", True),
    (nv.NVMLError_LibraryNotFound(), "no driver", False),
    (nv.NVMLError_DriverNotLoaded(), "no driver", False),
    (nv.NVMLError_GpuIsLost(), "GPU is lost", False),
    (nv.NVMLError_Timeout(), "timed out", False),
    (nv.NVMLError_Unknown(), "unknown NVML error", False),
    (nv.NVMLError_NotFound(), "not found", False),
    (AttributeError("module 'pynvml' has no attribute 'nvmlGpmSampleGet'"), "nvidia-ml-py too old", True),
])
def test_nvml_errors_map_to_short_reasons(exc, reason, permanent):
    assert nvml_reason(exc) == reason
    assert is_permanent(exc) is permanent


def test_errors_raised_by_the_real_library_here():
    with pytest.raises(nv.NVMLError) as info:
        nv.nvmlDeviceGetCount()  # not initialised: pynvml raises this itself
    assert nvml_reason(info.value) == "NVML not initialised"
    assert not is_permanent(info.value)
    if not HAVE_DRIVER:
        with pytest.raises(nv.NVMLError) as info:
            nv.nvmlInit()
        msg = init_failure_message(info.value)
        assert msg.startswith("no NVIDIA driver (libnvidia-ml.so.1 not found)")


def test_init_failure_messages_say_what_to_do():
    assert "kernel module" in init_failure_message(nv.NVMLError_DriverNotLoaded())
    assert "reboot" in init_failure_message(nv.NVMLError_LibRmVersionMismatch())
    assert "/dev/nvidia" in init_failure_message(nv.NVMLError_NoPermission())
    for exc in (nv.NVMLError_DriverNotLoaded(), nv.NVMLError_Unknown(), nv.NVMLError_LibraryNotFound()):
        assert init_failure_message(exc).endswith("GPU panels are off; host and Python panels still work")


def test_gpm_metric_table_uses_the_documented_ids():
    ids = {field: getattr(nv, const) for field, const in GPM_METRICS}
    assert ids == {"gr_active": 1, "sm_active": 2, "sm_occupancy": 3, "tensor_active": 5, "dram_bw": 10,
                   "pcie_tx_mibs": 20, "pcie_rx_mibs": 21, "nvlink_rx_mibs": 60, "nvlink_tx_mibs": 61}
    assert all(i < nv.NVML_GPM_METRIC_MAX for i in ids.values())
    assert len(set(ids.values())) == len(ids)
    # The request struct holds them all.
    req = nv.c_nvmlGpmMetricsGet_t()
    assert len(req.metrics) >= len(GPM_METRICS)


def test_every_published_field_has_a_metric_spec():
    specs = {(m.kind, m.field): m for m in METRICS}
    assert len(specs) == len(METRICS), "duplicate MetricSpec"
    for f in GPU_FIELDS:
        assert (KIND_GPU, f) in specs, f"no MetricSpec for gpu.{f}"
    for m in METRICS:
        assert isinstance(m, MetricSpec)
        assert m.label and m.help and "\n" not in m.help and len(m.help) <= 110, m
    for f in GPM_FIELDS:
        assert specs[(KIND_GPU, f)].unit in ("%", "MiB/s")
    assert specs[(KIND_GPU, "power_w")].unit == "W"
    assert specs[(KIND_GPU, "mem_used")].unit == "B"
    assert "kernel" in specs[(KIND_GPU, "util_gpu")].help


@pytest.mark.parametrize("mean", [0.1, 0.25, 1.0])
def test_jitter_has_the_interval_as_mean_and_stays_in_bounds(mean):
    rng = random.Random(1)
    gaps = [jittered_gap(mean, rng) for _ in range(40000)]
    assert min(gaps) >= 0.5 * mean
    assert max(gaps) <= 4.0 * mean
    assert abs(statistics.fmean(gaps) / mean - 1) < 0.02
    assert statistics.pstdev(gaps) > 0.3 * mean, "no real jitter: samples could lock onto a training step"


def test_gpm_never_sampled_closer_than_100ms_on_a_jittered_10hz_schedule():
    # The hard floor alone (the source's gate waits GPM_EVERY_S: tests/test_gpm_rate.py).
    rng = random.Random(7)
    gate = GpmGate(GPM_MIN_GAP_S)
    t, taken, ticks = 0.0, [], 0
    for _ in range(20000):
        t += jittered_gap(0.1, rng)
        ticks += 1
        if gate.due(t):
            gate.taken(t)
            taken.append(t)
    gaps = [b - a for a, b in zip(taken, taken[1:])]
    assert min(gaps) >= GPM_MIN_GAP_S
    assert GPM_MIN_GAP_S == 0.1
    # At the floor GPM would come on most ticks.
    assert 0.5 < len(taken) / ticks < 0.8


def test_while_calm_the_gpm_gate_waits_the_factor_longer():
    gate = GpmGate()
    gate.taken(10.0)
    assert gate.due(10.0 + GPM_EVERY_S) and not gate.due(10.0 + GPM_EVERY_S, CALM_FACTOR)
    assert not gate.due(10.0 + GPM_EVERY_S * (CALM_FACTOR - 1), CALM_FACTOR)
    assert gate.due(10.0 + GPM_EVERY_S * CALM_FACTOR, CALM_FACTOR)


def test_health_judges_the_loops_rate_against_its_interval_now_and_not_across_a_change():
    """Calm stretches the fast loop's interval (sources/calm.py): at factor 2, a loop at 5 Hz is on plan while
    calm, and right after the calm ends its last 5 s still hold the calm ticks, so nothing is said
    until a whole HEALTH_EVERY_S at the full rate; a loop far below its plan is reported, calm
    or not."""
    def health_after(ticks_hz: float, factor: float, changed_ago: float) -> dict:
        src = NvmlSource(SessionClock())
        got = Collect()
        src._emit = got
        now = time.monotonic()
        src._ticks.extend(now - k / ticks_hz for k in range(int(6 * ticks_hz), -1, -1))
        src._interval_factor, src._factor_changed_at = factor, now - changed_ago
        src._update_health(force=True)
        return got.of(KIND_HEALTH)[-1].data

    slow = "sampling slower than planned"
    assert slow not in health_after(5.0, 2.0, 60.0)["message"], "calm at 5 Hz: on plan"
    assert health_after(5.0, 2.0, 60.0)["calm"] is True
    assert slow not in health_after(5.0, 1.0, 1.0)["message"], "the calm just ended"
    assert slow in health_after(4.0, 1.0, 60.0)["message"]
    assert slow in health_after(2.0, 2.0, 60.0)["message"], "a calm loop far below its plan"
    assert health_after(10.0, 1.0, 60.0)["calm"] is False


def test_while_calm_the_slow_loop_waits_the_factor_longer():
    """The slow loop (the processes on each GPU, ~1 Hz) at CALM_HELD_FACTOR times its interval
    while the job is calm (less than the fast loop's CALM_FACTOR: its readers hold a value 5 s);
    at its own interval otherwise and with no calm watch (an --interval the user gave)."""
    from gputop.catalogue import KIND_PHASE
    from gputop.model import Sample

    def waits(calm) -> list[float]:
        src = NvmlSource(SessionClock(), calm=calm, slow_interval_s=1.0)
        src._gap = lambda mean_s: mean_s          # no jitter: the interval asked for
        src._slow_tick = lambda: None
        asked: list[float] = []

        def wait(timeout):
            asked.append(timeout)
            return len(asked) >= 3
        src._stop.wait = wait
        src._slow_main()
        return asked

    clock = SessionClock()
    calm = JobCalm(clock, after_s=0.0)
    assert waits(calm) == [1.0] * 3, "no phase heard: not calm"
    calm.on_samples([Sample(clock.now(), KIND_PHASE, "main", {"phase": "training", "since": 0.0})])
    assert waits(calm) == [1.0 * CALM_HELD_FACTOR] * 3
    assert waits(None) == [1.0] * 3
    # never longer than the full rate's longest gap (gpu_procs older than 5 s count as missing in
    # the rank table and the exporter): a calm jittered gap of 8 s waits 4
    from gputop.sources import nvml_slow
    from gputop.sources.nvml import JITTER_CAP
    assert nvml_slow.SLOW_MAX_GAP_X == JITTER_CAP
    src = NvmlSource(SessionClock(), calm=calm, slow_interval_s=1.0)
    src._gap = lambda mean_s: JITTER_CAP * mean_s
    src._slow_tick = lambda: None
    asked: list[float] = []
    src._stop.wait = lambda timeout: asked.append(timeout) or True
    src._slow_main()
    assert asked == [JITTER_CAP * 1.0]


def test_pcie_throughput_kb_is_taken_as_1000_bytes():
    assert kbps_to_mibs(1_048_576) == 1000.0
    assert kbps_to_mibs(0) == 0.0
    assert kbps_to_mibs(None) is None


def test_import_does_no_work():
    # Importing the module must not start threads or touch the driver.
    code = ("import threading, pynvml; import gputop.sources.nvml as m; "
            "assert not [t for t in threading.enumerate() if t.name.startswith('gputop')]; "
            "assert pynvml.nvmlLib is None; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ---------------------------------------------------------------------------------------------
# With a driver (the GPU machine)

@needs_driver
def test_with_a_driver_the_contract_fields_arrive():
    src = NvmlSource(SessionClock())
    got = Collect()
    src.start(got)
    try:
        gpu = got.wait_for(KIND_GPU, timeout=10.0, n=20)
        info = got.wait_for(KIND_GPU_INFO)
        health = got.wait_for(KIND_HEALTH)
    finally:
        src.stop()
    assert health and health[0].data["state"] in ("ok", "degraded"), health
    assert info, "no gpu_info"
    for k in ("index", "name", "uuid", "pci_bus_id", "driver", "nvml_version", "cuda_driver", "mem_total",
              "power_limit_w", "clock_sm_max_mhz", "clock_mem_max_mhz", "gpm", "watched", "na"):
        assert k in info[0].data, k
    assert len(gpu) >= 10
    for s in gpu:
        assert set(GPU_FIELDS) <= set(s.data)
        json.dumps(s.data)
    last = gpu[-1].data
    na = info[-1].data["na"]
    for f in ("util_gpu", "mem_used", "mem_total", "power_w", "clock_sm_mhz", "temp_c"):
        assert last[f] is not None or f in na, f
    if info[-1].data["gpm"]:
        with_gpm = [s for s in gpu if s.data["gpm_window_s"] is not None]
        assert with_gpm, "GPM supported but never sampled"
        assert min(s.data["gpm_window_s"] for s in with_gpm) >= GPM_EVERY_S >= GPM_MIN_GAP_S
        assert len(with_gpm) <= len(gpu) / 3, "GPM read more often than every GPM_EVERY_S"


@needs_driver
def test_with_a_driver_a_calm_job_is_sampled_at_the_calm_rate_and_the_full_one_after_a_change():
    """The fast loop at CALM_FACTOR times its interval and GPM at CALM_FACTOR times its gap
    while calm (gputop/sources/calm.py), at 10 Hz again from the tick after the calm ends."""
    clock = SessionClock()
    calm = JobCalm(clock, after_s=0.0)
    from gputop.catalogue import KIND_PHASE, KIND_VERDICT_CHANGE
    from gputop.model import Sample

    calm.on_samples([Sample(clock.now(), KIND_PHASE, "main", {"phase": "training", "since": 0.0})])
    src = NvmlSource(clock, calm=calm)
    got = Collect()
    src.start(got)
    try:
        got.wait_for(KIND_GPU, timeout=10.0, n=3)
        t0 = clock.now()
        time.sleep(6.0)
        t1 = clock.now()
        calm.after_s = 1e9
        calm.on_samples([Sample(clock.now(), KIND_VERDICT_CHANGE, "x", {"active": True})])
        time.sleep(4.0)
        t2 = clock.now()
        health = got.of(KIND_HEALTH)
    finally:
        src.stop()
    gpu = [s for s in got.of(KIND_GPU) if s.key == got.of(KIND_GPU)[0].key]
    calm_n = sum(t0 <= s.t < t1 for s in gpu) / (t1 - t0)
    full_n = sum(t1 + 0.5 <= s.t < t2 for s in gpu) / (t2 - t1 - 0.5)
    calm_hz = 10.0 / CALM_FACTOR
    assert 0.6 * calm_hz <= calm_n <= 1.4 * calm_hz and 8.0 <= full_n <= 12.0, (calm_n, full_n)
    # each calm sample stands for CALM_FACTOR of the full rate's in the report's statistics
    assert all(s.data.get("calm_factor") == CALM_FACTOR for s in gpu if t0 <= s.t < t1)
    assert all("calm_factor" not in s.data for s in gpu if t1 + 0.5 <= s.t < t2)
    gpm = [s.t for s in gpu if t0 <= s.t < t1 and s.data["gpm_window_s"] is not None]
    if gpm:
        gaps = [b - a for a, b in zip(gpm, gpm[1:])]
        assert min(gaps) >= GPM_EVERY_S * CALM_FACTOR - 0.05, gaps
        assert max(gaps) <= GPM_HOLD_S, gaps    # the views hold a value from one snapshot to the next
    assert any(h.data.get("calm") for h in health) and health[-1].data["state"] == "ok", health[-1].data


# ---------------------------------------------------------------------------------------------
# Another process on the target's GPU (the gpu_shared verdict, issue 30 item 1)

def test_another_process_is_named_by_its_user_and_name_only_in_the_host_namespace(sleeper):
    """A real process: its user and name from /proc where NVML's PIDs are ours, never where they
    are not (another container's PID may be a different process here)."""
    import getpass

    from gputop.sources.nvml_slow import NOT_VISIBLE, describe_other

    got = describe_other(sleeper.pid, True, {})
    assert got["user"] == getpass.getuser() and got["visible"] and got["name"].startswith("python"), got
    assert describe_other(sleeper.pid, False, {}) == {"user": None, "name": NOT_VISIBLE, "visible": False}
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert describe_other(gone.pid, True, {})["name"] == NOT_VISIBLE


_CUDA_LOOP = ("import torch, time\n"
              "a = torch.randn(4096, 4096, device='cuda')\n"
              "end = time.time() + 40\n"
              "while time.time() < end:\n"
              "    b = a @ a\n"
              "    torch.cuda.synchronize()\n")


@needs_driver
def test_with_a_driver_another_job_on_the_targets_gpu_is_named_with_its_share():
    """Two CUDA jobs on GPU 0, one the target: gpu_procs.others names the other by PID, user and
    name with its SM %, and the target's own processes are never among the others."""
    pytest.importorskip("torch")
    target = subprocess.Popen([sys.executable, "-c", _CUDA_LOOP])
    other = subprocess.Popen([sys.executable, "-c", _CUDA_LOOP])
    src = NvmlSource(SessionClock(), target=Target(target.pid), gpu_indices=[0])
    got = Collect()
    src.start(got)
    try:
        deadline = time.monotonic() + 30
        seen = None
        while time.monotonic() < deadline:
            for s in got.of(KIND_GPU_PROCS):
                o = (s.data.get("others") or {}).get(str(other.pid))
                if o and o.get("sm_pct") and str(target.pid) in s.data["procs"]:
                    seen = s.data
            if seen:
                break
            time.sleep(0.5)
    finally:
        src.stop()
        for p in (target, other):
            p.kill()
            p.wait()
    assert seen, [s.data for s in got.of(KIND_GPU_PROCS)][-3:]
    o = seen["others"][str(other.pid)]
    assert o["visible"] and o["name"].startswith("python") and o["user"] and o["sm_pct"] > 5, o
    assert str(target.pid) not in seen["others"]
