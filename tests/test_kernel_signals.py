"""The probe's kernel trace as the verdicts read it (probe_step.kernel_ms_per_step, opt-in:
gputop/probe/kernel_sample.py): the kernels' share of the window's mean step, and launch_bound's
idle share taken from it instead of util.gpu's. No CUDA here: the trace itself was measured on an
H100 (benchmarks/kernel_busy.py, docs/benchmarks.md "Fifth session of 2026-12-06"); the numbers
below are that call's ResNet-50 at batch 1 (3.19 ms steps, 0.83 ms of kernels a step, util.gpu
~30%)."""

from __future__ import annotations

from gputop.model import Sample
from gputop.session.store import SampleStore
from gputop.verdicts.causal import busy_for, causal_loss, fix_gain
from gputop.verdicts.signals import Signals, build_signals


def _store(kernel_ms, age_s: float = 5.0) -> SampleStore:
    store = SampleStore()
    for i in range(6):
        # a probe window's sums, as the probe sends them: 314 steps of 3.185 ms in its 1 s
        data = {"step_n": 314, "steps": 314, "window_s": 1.0, "step_s_sum": 314 * 0.003185,
                "kernel_ms_per_step": kernel_ms if i >= 3 else None,
                "kernel_sample_age_s": age_s + i if i >= 3 else None}
        store.on_samples([Sample(float(i), "probe_step", "100", data)])
    return store


def test_the_kernels_share_of_the_step_sets_launch_bounds_idle_share():
    sig = build_signals(_store(0.8345), 5.5)
    assert abs(sig.get("probe.kernel_ms_per_step") - 0.8345) < 1e-9
    assert abs(sig.get("probe.kernel_busy") - 0.8345 / 3.185) < 1e-6
    sig.set("gpu.util_gpu", 30.0)   # util.gpu's view: busy 30%, idle 70% -> +233%
    loss = causal_loss("launch_bound", 0.96, sig)
    assert abs(loss - (1 - 0.8345 / 3.185)) < 1e-6
    assert abs(fix_gain(loss) - (3.185 / 0.8345 - 1)) < 1e-6   # +282%: the graph measured +246% there
    # only launch_bound reads it: another cause keeps util.gpu's idle share as its cap
    assert abs(causal_loss("sync_stall", 0.96, sig) - 0.70) < 1e-9
    # and the busy gate (90%) too: util.gpu at 95% hides no launch-bound loop whose kernels run 26%
    sig.set("gpu.util_gpu", 95.0)
    assert abs(busy_for("launch_bound", sig) - 0.8345 / 3.185) < 1e-6 and busy_for("sync_stall", sig) == 0.95


def test_a_trace_older_than_twenty_minutes_is_not_read():
    assert build_signals(_store(0.8345, age_s=1500.0), 5.5).get("probe.kernel_busy") is None
    assert build_signals(_store(0.8345, age_s=600.0), 5.5).get("probe.kernel_busy") is not None


def test_without_a_trace_util_gpu_sets_it_and_a_bad_value_is_none():
    for value in (None, 0.0, -1.0, "x", True):
        sig = build_signals(_store(value), 5.5)
        assert sig.get("probe.kernel_busy") is None, value
    sig = Signals(now=0.0, window_s=10.0)
    sig.set("gpu.util_gpu", 30.0)
    assert abs(causal_loss("launch_bound", 0.96, sig) - 0.70) < 1e-9


def test_the_steps_view_shows_the_traced_kernels_beside_the_gpus_span():
    """A real H100 recording under GPUTOP_KERNEL_SAMPLE=1 (the RNN of LSTM cells, sixth session of
    2026-12-06): the step split's GPU figure is the span from the batch to the step's end, launch
    gaps included (~89 ms); the trace's kernels (32.2 ms) stand beside it, so a reader does not
    take the span for the GPU's work, and the settings block says when it was traced."""
    import pathlib

    from gputop.session.recording import RecordingReader
    from tests.replay_view import view_text

    rec = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h100-kernel-frameworks-1206g"
           / "h200" / "corpus" / "rnn_lstmcell_loop-as_is.gtrec")
    traced = [s for s in RecordingReader(str(rec)).all_samples()
              if s.kind == "probe_step" and s.get("kernel_ms_per_step") and s.get("steps")]
    assert traced, "the recording holds windows with a kernel trace"
    w = traced[len(traced) // 2]
    text = " ".join(view_text(str(rec), w.t + 0.01, "steps", (120, 40)).split())
    kms = w.get("kernel_ms_per_step")
    assert f"(kernels {kms:.1f} ms)" in text, text[-3000:]
    assert f"kernel trace {kms:.1f} ms of kernels a step" in text


def test_the_steps_the_trace_slowed_are_not_what_its_kernels_are_divided_by():
    """A trace slows the steps it runs over (CUPTI records each launch; its stop and reading take
    up to ~1.4 s): the window that holds it made 150 steps of 6.67 ms where the others made 314 of
    3.185 ms. The kernels' share is of the job's own step, not of one the trace stretched."""
    store = SampleStore()
    for i in range(10):
        n, step_s = (150, 1.0 / 150) if i == 5 else (314, 0.003185)
        data = {"step_n": n, "steps": n, "window_s": 1.0, "step_s_sum": n * step_s,
                "kernel_ms_per_step": 0.8345 if i >= 6 else None,
                "kernel_sample_age_s": float(i - 5) if i >= 6 else None}   # traced at t=5
        store.on_samples([Sample(float(i), "probe_step", "100", data)])
    sig = build_signals(store, 9.5)
    assert abs(sig.get("probe.kernel_busy") - 0.8345 / 3.185) < 1e-6, sig.get("probe.kernel_busy")
    # (the window's mean step, every window in, is longer: the verdicts' step time stays that)
    assert sig.get("probe.step_ms") > 3.3
