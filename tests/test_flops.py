"""FLOPs per step from the probe (a real CPU torch job), the dense-peak table, MFU and energy
(the efficiency derivation, on a real H200 recording)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from gputop import gpu_peaks
from gputop.derive import efficiency as ef
from gputop.derive.steps import pool_steps
from gputop.model import Sample
from gputop.probe.flops import COMPILED_WHY
from gputop.session.launch import launch_with_probe
from gputop.session.recording import RecordingReader
from gputop.sources.probe_messages import flops_data
from tests.test_probe import env_with_dir, start_client, wait_for

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "tests" / "data" / "h200" / "gpu_bound.gtrec"
GPT_BF16 = ROOT / "tests" / "data" / "h200" / "issue15" / "mfu_gpt_bf16.gtrec"   # a GPT under bf16 autocast

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def flops_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flops")
    out, hold = tmp / "out.json", tmp / "hold"
    job = launch_with_probe([sys.executable, str(ROOT / "tests" / "workloads" / "flops_train.py"), "--steps", "20",
                             "--out", str(out), "--hold-file", str(hold)], env=env_with_dir(tmp / "sock"))
    src, col = start_client(job.pid)
    try:
        own = json.loads(wait_for(lambda: out.exists() and out.read_text(), 100, "the job to train", job=job))
        wait_for(lambda: any(s.get("step_total") == own["compile_done"]["steps"] for s in col.of("probe_step")),
                 20, "the last window")
        hold.touch()
        assert job.wait(timeout=30) == 0
        yield own, col.of("probe_step")
    finally:
        src.stop()
        if job.poll() is None:
            job.kill()
            job.wait()


def _phase(windows, lo: int, hi: int) -> list[Sample]:
    """Windows whose counted step lies in (lo, hi]."""
    return [w for w in windows if w.get("flops_per_step") is not None and lo < w.get("flops_step") <= hi]


def test_mlp_flops_per_step_are_the_exact_matmul_sum(flops_run):
    own, windows = flops_run
    mlp = _phase(windows, 0, own["mlp_done"]["steps"])
    assert mlp, "no count during the MLP phase"
    w = mlp[0]
    assert w.get("flops_per_step") == own["mlp_flops"]      # 2*M*N*K of fwd + both backward matmuls
    assert w.get("flops_step") == 3 and w.get("flops_dtype") == "fp32"
    assert w.get("flops_by_dtype") == {"fp32": own["mlp_flops"]}
    # The one counted step's cost is measured and shipped.
    assert w.get("flops_count_ms") > 0
    # Every step forked a DataLoader worker, the counted one too: no worker kept the counter.
    assert own["worker_saw_a_mode"] is False


def test_copies_come_with_the_count_and_a_cpu_job_copies_nothing(flops_run):
    """The counted step's copies between host and GPU ride with the FLOP count (their bytes on a
    GPU: tests/test_corpus_recordings.py, an H100 recording). On this CPU job the counted step
    copied nothing each way: 0, not unknown; where there is no count (torch.compile), null."""
    own, windows = flops_run
    w = _phase(windows, 0, own["mlp_done"]["steps"])[0]
    for way in ("h2d", "d2h"):
        assert w.get(f"copy_{way}_bytes") == 0 and w.get(f"copy_{way}_n") == 0, w.data
        assert w.get(f"copy_{way}_pageable_bytes") == 0
    compiled = [s for s in windows if s.get("flops_off") == COMPILED_WHY]
    assert compiled and all(s.get("copy_h2d_bytes") is None and s.get("copy_d2h_ms") is None for s in compiled)


def test_copy_fields_from_a_misbehaving_probe_are_numbers_or_nothing():
    base = {"h2d_bytes": 100, "h2d_pageable_bytes": 40, "h2d_ms": 2.5, "h2d_n": 1,
            "d2h_bytes": 10, "d2h_pageable_bytes": 10, "d2h_ms": 1.0, "d2h_n": 2}
    good = flops_data({"flops": 10, "copies": base})
    assert (good["copy_h2d_bytes"], good["copy_h2d_pageable_bytes"], good["copy_h2d_ms"], good["copy_d2h_n"]) == \
        (100, 40, 2.5, 2)
    for field, bad in (("h2d_ms", float("nan")), ("h2d_n", True), ("h2d_pageable_bytes", "x"), ("h2d_ms", -1)):
        d = flops_data({"flops": 10, "copies": {**base, field: bad}})
        assert d[f"copy_{field}"] == 0 and d["copy_h2d_bytes"] == 100, (field, d)
    # pageable bytes never above the bytes copied
    assert flops_data({"flops": 10, "copies": {**base, "h2d_pageable_bytes": 1e30}})["copy_h2d_pageable_bytes"] == 100
    # bytes that are not a count: that way counted nothing
    d = flops_data({"flops": 10, "copies": {**base, "d2h_bytes": -5}})
    assert d["copy_d2h_bytes"] == 0 and d["copy_d2h_pageable_bytes"] == 0 and d["copy_h2d_bytes"] == 100
    # no count, no copies: null, not 0
    assert flops_data({"flops": None, "off": "no count yet", "copies": base})["copy_h2d_bytes"] is None


def test_the_counter_adds_each_copy_by_direction_and_host_memory():
    """gputop/probe/flops.py's copy accounting on tensors that say where they live (a CUDA tensor
    cannot exist on this machine: the H100 recordings check the real ones, test_corpus_recordings):
    host->device and device->host by the two sides' devices, pageable by the host side, a copy
    that stays on one device not counted, and the adds safe from two threads."""
    import threading

    from gputop.probe.flops import _count_copy

    class T:
        def __init__(self, dev, n, pinned=False):
            self.device, self._n, self._pinned = type("D", (), {"type": dev})(), n, pinned

        def numel(self):
            return self._n

        def element_size(self):
            return 4

        def is_pinned(self):
            return self._pinned

    mode = type("M", (), {})()
    mode.gputop_copies, mode.gputop_copies_lock = {}, threading.Lock()
    _count_copy(mode, None, T("cuda", 10), (T("cpu", 10),), 0.0, 0.002)           # .to("cuda"), pageable
    _count_copy(mode, None, T("cuda", 5), (T("cpu", 5, pinned=True),), 0.0, 0.0)  # pinned
    _count_copy(mode, 1, None, (T("cpu", 3), T("cuda", 3)), 0.0, 0.001)          # host.copy_(device)
    _count_copy(mode, None, T("cpu", 7), (T("cpu", 7),), 0.0, 0.001)              # a dtype cast on the host
    _count_copy(mode, 1, None, (T("cuda", 7),), 0.0, 0.001)                       # malformed: no source
    c = mode.gputop_copies
    assert c["h2d_bytes"] == 60 and c["h2d_pageable_bytes"] == 40 and c["h2d_n"] == 2
    assert abs(c["h2d_ms"] - 2.0) < 1e-9
    assert c["d2h_bytes"] == 12 and c["d2h_pageable_bytes"] == 12 and c["d2h_n"] == 1

    def add():
        for _ in range(2000):
            _count_copy(mode, None, T("cuda", 1), (T("cpu", 1),), 0.0, 0.0)
    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mode.gputop_copies["h2d_n"] == 2 + 8000


def test_a_new_batch_shape_is_counted_again_and_bf16_autocast_is_the_dtype(flops_run):
    own, windows = flops_run
    gpt = _phase(windows, own["mlp_done"]["steps"], own["gpt_done"]["steps"])
    assert gpt, "the transformer's new batch shape was not counted again"
    f = gpt[-1].get("flops_per_step")
    # 6 x matmul params x tokens (+ attention, which CPU SDPA has no formula for): within 5%
    assert abs(f - own["gpt_flops"]) / own["gpt_flops"] < 0.05, (f, own["gpt_flops"])
    assert abs(f - own["gpt_6nt"]) / own["gpt_6nt"] < 0.05
    assert gpt[-1].get("flops_dtype") == "bf16"


def test_torch_compile_gives_na_with_the_reason(flops_run):
    own, windows = flops_run
    # Every step of every phase was a step (one lead optimizer), so the phase after compile ran.
    assert own["gpt_done"]["steps"] - own["mlp_done"]["steps"] == 20
    assert own["compile_done"]["steps"] - own["gpt_done"]["steps"] == 20
    # Withdrawn as soon as torch.compile is called, before any further step or new shape.
    assert own["off_right_after_compile"] == COMPILED_WHY
    last = windows[-1]
    assert last.get("flops_per_step") is None and last.get("flops_off") == COMPILED_WHY
    assert last.get("flops_dtype") is None and last.get("flops_by_dtype") is None


def test_achieved_flops_are_flops_per_step_times_steps_per_s_and_mfu_on_cpu_says_why(flops_run):
    own, windows = flops_run
    gpt = [w for w in _phase(windows, own["mlp_done"]["steps"], own["gpt_done"]["steps"]) if w.get("steps")]
    res = ef.efficiency({"probe_step": {"1": gpt}})
    r = res["ranks"][0]
    sps = pool_steps(w.data for w in gpt).steps_per_training_s
    assert r["achieved_tflops"] == pytest.approx(r["flops_per_step"] * sps / 1e12)
    assert res["mfu"] is None and "GPU model not known" in res["mfu_off"]


def test_without_the_probe_mfu_and_energy_per_step_say_why():
    samples = [s for s in RecordingReader(str(H200)).all_samples() if not s.kind.startswith("probe_")]
    res = ef.efficiency(ef.group(sorted(samples, key=lambda s: s.t)))
    assert res["mfu"] is None and "no probe" in res["mfu_off"]
    assert res["joules_per_step"] is None and "no probe steps" in res["energy_off"]
    assert res["gpus"][0]["joules"] > 0   # energy itself needs no probe


def test_an_older_probe_without_a_count_says_so():
    d = flops_data(None)
    assert d["flops_per_step"] is None and "older" in d["flops_off"]
    d = flops_data({"flops": -5, "by_dtype": {"bf16": "x", "fp32": 3}, "off": "x" * 1000})
    assert d["flops_per_step"] is None and len(d["flops_off"]) <= 400
    d = flops_data({"flops": 10, "by_dtype": {"bf16": 7, "fp32": 3, "bad": -1}, "dtype": "bf16"})
    assert d["flops_by_dtype"] == {"bf16": 7, "fp32": 3} and d["flops_off"] is None


@pytest.mark.parametrize("name,model", [
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"), ("NVIDIA A100 80GB PCIe", "A100"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"), ("NVIDIA L4", "L4"), ("NVIDIA A10", "A10"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GH200 480GB", "GH200"), ("Tesla T4", "T4"), ("NVIDIA A10G", None), ("NVIDIA B200", None),
])
def test_device_names_match_their_model(name, model):
    assert gpu_peaks.model_of(name) == model


def test_peaks_are_dense_and_sourced():
    # The datasheets' tensor numbers are with sparsity: the table has half of them.
    assert gpu_peaks.dense_peak("NVIDIA H100 80GB HBM3", "bf16")[0] == 989.4
    assert gpu_peaks.dense_peak("NVIDIA H200", "bf16")[0] == 989.5
    assert gpu_peaks.dense_peak("NVIDIA A100-SXM4-40GB", "tf32")[0] == 156.0
    assert gpu_peaks.dense_peak("NVIDIA L40S", "fp8")[0] == 733.0
    for model, (peaks, source) in gpu_peaks.PEAKS.items():
        assert "http" in source, model
        assert set(peaks) <= set(gpu_peaks.DTYPES)
        # dense tensor peaks: bf16 at most 16x fp32 on every part listed (a sparse one would be 32x)
        if "bf16" in peaks:
            assert peaks["bf16"] <= 16 * peaks["fp32"], model
    v, why = gpu_peaks.dense_peak("NVIDIA B200", "bf16")
    assert v is None and "not in gputop's table" in why
    v, why = gpu_peaks.dense_peak("NVIDIA A100-SXM4-80GB", "fp8")
    assert v is None and "no published fp8" in why
    assert gpu_peaks.dense_peak(None, "bf16")[0] is None


def test_mixed_dtypes_get_the_flop_weighted_peak():
    peak, _ = ef.effective_peak("NVIDIA H200", {"bf16": 900, "fp32": 100})
    # time at peak: 900/989.5 + 100/67 (in TFLOP units)
    assert peak / 1e12 == pytest.approx(1000 / (900 / 989.5 + 100 / 67.0))
    assert ef.mfu(0.5 * peak, peak) == 0.5


def _h200():
    return sorted(RecordingReader(str(H200)).all_samples(), key=lambda s: s.t)


def test_energy_on_the_h200_recording_is_power_x_time_labelled():
    samples = _h200()
    gpu = [s for s in samples if s.kind == "gpu" and s.key == "0"]
    assert all(s.data.get("energy_j") is None for s in gpu), "the recording has no energy counter"
    res = ef.efficiency(ef.group(samples), grid_g_per_kwh=400.0)
    g = res["gpus"][0]
    assert g["method"] == ef.METHOD_POWER and res["energy_method"] == "power x time"
    # Independently: mean power x span (the samples are ~evenly spaced at 10 Hz).
    watts = [s.data["power_w"] for s in gpu if s.data.get("power_w") is not None]
    span = gpu[-1].t - gpu[0].t
    assert g["joules"] == pytest.approx(sum(watts) / len(watts) * span, rel=0.02)
    assert 600 < g["watts"] < 710          # the GEMM at the 700 W cap
    sps = res["ranks"][0]["steps_per_s"]        # steps per training second (the span MFU uses)
    assert res["joules_per_step"] == pytest.approx(g["watts"] / sps)
    assert res["kwh"] == pytest.approx(g["joules"] / 3.6e6)
    assert res["co2e_g"] == pytest.approx(res["kwh"] * 400.0)
    assert res["tensor_active_pct"] > 50    # GPM cross-check present beside MFU


def test_the_energy_counter_wins_over_power_when_present():
    # The recording's own power, integrated into a counter at 1 Hz the way the slow loop reads it.
    gpu = [s for s in _h200() if s.kind == "gpu" and s.key == "0"]
    total, last_t, out = 1e6, gpu[0].t, []
    prev = gpu[0]
    for s in gpu:
        total += (s.t - prev.t) * ((prev.data.get("power_w") or 0) + (s.data.get("power_w") or 0)) / 2
        prev = s
        reading = total if s.t - last_t >= 1.0 else None
        if reading is not None:
            last_t = s.t
        out.append(Sample(s.t, s.kind, s.key, {**s.data, "energy_j": reading}))
    e = ef.gpu_energy(out)
    assert e.method == ef.METHOD_COUNTER
    assert e.watts == pytest.approx(ef.gpu_energy(gpu).watts, rel=0.02)


def _store_with_flops(flops: int | None):
    """The real H200 recording in a store; its probe windows given a FLOP count (the recording
    predates the count) when ``flops`` is set."""
    from gputop.session.store import SampleStore
    store = SampleStore(horizon_s=600)
    out = []
    for s in _h200():
        if s.kind == "probe_step" and flops is not None:
            s = Sample(s.t, s.kind, s.key, {**s.data, "flops_per_step": flops, "flops_dtype": "bf16",
                                            "flops_by_dtype": {"bf16": flops}, "flops_off": None})
        out.append(s)
    store.on_samples(out)
    return store, out


def test_prometheus_serves_mfu_flops_and_energy_per_step():
    from prometheus_client.core import CounterMetricFamily  # noqa: F401  (the exporter's dependency)

    from gputop.export.prometheus import collect_families
    flops = 6 * 201_433_098 * 4096    # what a 201M-parameter model at 4096 tokens/step would count
    store, samples = _store_with_flops(flops)
    now = max(s.t for s in samples)
    fams = {f.name: f for f in collect_families(store, now, {"host": "h"})}
    res = ef.live(store, now)
    r = res["ranks"][0]
    got = {s.labels["dtype"]: s.value for s in fams["gputop_mfu_ratio"].samples}
    assert got == {"bf16": pytest.approx(r["mfu"])}
    assert r["mfu"] == pytest.approx(flops * r["steps_per_s"] / 989.5e12)
    ach = fams["gputop_achieved_flops_per_second"].samples[0].value
    assert ach == pytest.approx(flops * r["steps_per_s"])
    jps = fams["gputop_gpu_energy_per_step_joules"].samples[0]
    assert jps.labels["method"] == "power x time" and jps.value == pytest.approx(res["joules_per_step"])
    # Without a count: no MFU series at all (None is never served as 0), energy still there.
    store, samples = _store_with_flops(None)
    fams = {f.name: f for f in collect_families(store, now, {"host": "h"})}
    assert "gputop_mfu_ratio" not in fams and "gputop_gpu_energy_per_step_joules" in fams


def test_report_section_and_grid_intensity_from_the_command_line(tmp_path):
    import subprocess
    out = subprocess.run([sys.executable, "-m", "gputop", "report", str(H200), "--json", "--grid-intensity", "400"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    sec = json.loads(out.stdout)["efficiency"]
    assert sec["energy_method"] == "power x time" and sec["co2e_g"] == pytest.approx(sec["kwh"] * 400)
    assert sec["mfu"] is None and "no FLOP count" in sec["mfu_off"]
    bad = subprocess.run([sys.executable, "-m", "gputop", "report", str(H200), "--grid-intensity", "-3"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def _report_efficiency(path) -> dict:
    import subprocess
    out = subprocess.run([sys.executable, "-m", "gputop", "report", str(path), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    # The FLOP fields are read back, not dropped as "not a number" (they were: dtype "?", no MFU).
    assert not any(k.startswith("probe_step.flops") for k in rep["session"].get("bad_values") or {})
    return rep["efficiency"]


def test_h200_gpt_bf16_recording_gives_mfu_and_counter_energy_per_step():
    sec = _report_efficiency(GPT_BF16)
    r = sec["ranks"][0]
    assert r["dtype"] == "bf16" and r["flops_by_dtype"] == {"bf16": r["flops_per_step"]} and r["dtype_note"] is None
    # The run measured 322.7 TFLOP/s; against the H200's dense bf16 peak that is ~33%, as the
    # benchmark's own GPM tensor-active count (32.9%) says.
    peak = gpu_peaks.dense_peak("NVIDIA H200", "bf16")[0]
    assert r["peak_tflops"] == pytest.approx(peak)
    assert sec["achieved_tflops"] == pytest.approx(322.7, rel=0.01)
    assert sec["mfu"] == pytest.approx(sec["achieved_tflops"] / peak)
    assert 0.25 < sec["mfu"] < 0.40
    # Energy: the NVML counter; J/step against energy / steps over the training span (the probe
    # windows that timed steps), from raw samples. (The benchmark's independent 10 Hz power x time
    # over the job's own training span gave 19.91 J/step.)
    assert sec["energy_method"] == ef.METHOD_COUNTER
    samples = sorted(RecordingReader(str(GPT_BF16)).all_samples(), key=lambda s: s.t)
    wins = [s for s in samples if s.kind == "probe_step" and (s.data.get("steps") or 0) > 0]
    readings = [s for s in samples if s.kind == "gpu" and s.key == "0" and s.data.get("energy_j") is not None
                and wins[0].t <= s.t <= wins[-1].t]
    joules = readings[-1].data["energy_j"] - readings[0].data["energy_j"]
    steps = sum(w.data.get("steps") or 0 for w in wins[1:])
    assert sec["joules_per_step"] == pytest.approx(joules / steps, rel=0.05)


def test_an_unknown_flops_dtype_falls_back_to_the_recorded_settings():
    samples = sorted(RecordingReader(str(GPT_BF16)).all_samples(), key=lambda s: s.t)
    good = ef.efficiency(ef.group(samples))
    # What a probe that found no tensor in an op's arguments sent: every FLOP under "?".
    unknown = [Sample(s.t, s.kind, s.key, {**s.data, "flops_dtype": "?",
                                           "flops_by_dtype": {"?": s.data["flops_per_step"]}})
               if s.kind == "probe_step" and s.data.get("flops_per_step") else s for s in samples]
    res = ef.efficiency(ef.group(unknown))
    r = res["ranks"][0]
    assert r["dtype"] == "bf16" and r["dtype_note"] == ef.FROM_SETTINGS
    assert res["mfu"] == pytest.approx(good["mfu"]) and res["mfu"] is not None
    assert ef.FROM_SETTINGS in ef.mfu_words(res) and ef.FROM_SETTINGS in "\n".join(ef.report_lines(res))
    assert ef.settings_dtype({"amp_autocast": [], "optimizer": {"param_dtypes": ["float32"]},
                              "tf32_matmul": True}) == "tf32"
    assert ef.settings_dtype({"amp_autocast": ["cpu:bfloat16", "cuda:float16"]}) == "fp16"
    assert ef.settings_dtype({}) is None


def test_the_probe_finds_the_dtype_anywhere_in_an_op_and_else_takes_the_settings():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from gputop.probe.flops import _dtype_counter, _dtype_tensor
    x, w = torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.float16)
    assert _dtype_tensor(None, ([x],), {}) is x                       # nested in a list
    assert _dtype_tensor(None, (torch.zeros(2, dtype=torch.long),), {"mat2": w}) is w   # by keyword
    assert _dtype_tensor(torch.ones(1), (3, "a"), {}).dtype == torch.float32           # the output
    assert _dtype_tensor(None, (), {}) is None
    # A counter call that hands over no tensor at all (a kernel counted by name, as torch's
    # triton path does): the FLOPs go to the settings' dtype, never to "?".
    mode = _dtype_counter(FlopCounterMode)(display=False, custom_mapping={torch.ops.aten.mm: lambda *a, **k: 100})
    mode.gputop_tf32, mode.gputop_by_dtype, mode.gputop_settings_dtype = (False, False), {}, "bf16"
    mode._count_flops(torch.ops.aten.mm, None, (), {})
    assert mode.gputop_by_dtype == {"bf16": 100}


def test_a_count_left_under_another_dispatch_mode_is_popped_when_it_is_on_top_again():
    """A job that pushes its own TorchDispatchMode inside the counted step and pops it later:
    the counter cannot leave at that step's end (it would pop the job's mode), but it must not
    stay pushed either, or every later op of the job would run through Python."""
    import types

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    from gputop.probe.flops import START_AT, FlopCounter

    class JobsMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    p = types.SimpleNamespace(monitoring=True, torch_hooks=None)
    fc = FlopCounter(p, torch)

    def step_end(n):   # what the probe's step end does (core.py)
        if fc.wants_boundary(p.monitoring):
            fc.at_boundary(n, float(n))

    step_end(START_AT)                            # the counted step begins: our mode is pushed
    assert _get_current_dispatch_mode() is not None
    torch.ones(4, 4) @ torch.ones(4, 4)
    jobs = JobsMode()
    jobs.__enter__()                              # the job pushes its own inside the step
    step_end(START_AT + 1)                        # step end: ours is under the job's
    assert fc.flops is None and "another TorchDispatchMode" in fc.off
    assert _get_current_dispatch_mode() is jobs   # the job's mode untouched
    jobs.__exit__(None, None, None)
    step_end(START_AT + 2)                        # ours is on top again: popped now
    assert _get_current_dispatch_mode() is None
    step_end(START_AT + 3)                        # and no new count starts by itself
    assert _get_current_dispatch_mode() is None


def test_live_energy_per_step_keeps_the_counter_every_second_of_training():
    """The counter is read every 5 s: the live views (UI, Prometheus) must not flip to power x
    time whenever their 10 s window holds only one reading (they did: the method label and the
    J/step jumped from one second to the next)."""
    from gputop.session.store import SampleStore
    from gputop.sources.nvml_fields import ENERGY_EVERY_S
    # The recording read the counter every second (the source then did): keep one reading per
    # ENERGY_EVERY_S, as the source reads it now.
    samples, last = [], -1e9
    for s in sorted(RecordingReader(str(GPT_BF16)).all_samples(), key=lambda s: s.t):
        if s.kind == "gpu" and s.data.get("energy_j") is not None:
            if s.t - last < ENERGY_EVERY_S:
                s = Sample(s.t, s.kind, s.key, {**s.data, "energy_j": None})
            else:
                last = s.t
        samples.append(s)
    wins = [s for s in samples if s.kind == "probe_step" and (s.data.get("steps") or 0) > 0]
    store = SampleStore(horizon_s=600)
    t0 = wins[0].t + 2 * ENERGY_EVERY_S + 1   # two readings into training
    methods, jps = set(), []
    fed = 0
    t = t0
    while t < wins[-1].t:
        upto = fed
        while upto < len(samples) and samples[upto].t <= t:   # as a live session has them at t
            upto += 1
        store.on_samples(samples[fed:upto])
        fed = upto
        res = ef.live(store, t)
        methods.add(res["energy_method"])
        jps.append(res["joules_per_step"])
        t += 0.5
    assert len(jps) >= 10
    assert methods == {ef.METHOD_COUNTER}
    assert all(j is not None and j > 0 for j in jps)
    # the live figure is the same quantity as the report's, over a shorter span
    assert statistics.median(jps) == pytest.approx(_report_efficiency(GPT_BF16)["joules_per_step"], rel=0.15)
