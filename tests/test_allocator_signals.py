"""The CUDA allocator's retries as the verdicts read them (probe_memory.alloc_retries, a counter;
issue 30 item 4): a rate over the window, per second and per step, and nothing from a counter
that went back (a restarted process, a hostile file). No CUDA here: what a thrashing job does is
measured on the H200 (benchmarks/corpus/alloc_thrash_varlen.py)."""

from __future__ import annotations

from gputop.model import Sample
from gputop.session.store import SampleStore
from gputop.verdicts.rules import allocator_thrash
from gputop.verdicts.signals import ALLOC_FREES_PER_STEP, build_signals


def _store(retries: list, mallocs: list | None = None) -> SampleStore:
    store = SampleStore()
    for i, r in enumerate(retries):
        t = float(i)
        mem = {"alloc_retries": r, "allocated": 1 << 30, "reserved": 2 << 30}
        if mallocs is not None:   # (cudaMalloc and cudaFree calls so far: a retry frees the cache, 3 segments)
            mem.update(device_allocs=mallocs[i], device_frees=mallocs[i] - 3 if mallocs[i] is not None else None)
        store.on_samples([
            # (a probe window's sums, as the probe sends them: 4 steps in its 1 s)
            Sample(t, "probe_step", "100", {"step_n": 4, "steps": 4, "window_s": 1.0, "step_s_sum": 1.0}),
            Sample(t, "probe_memory", "100", mem)])
    return store


def test_retries_become_a_rate_per_second_and_per_step():
    sig = build_signals(_store([0, 10, 20, 30, 40, 50]), 5.5)
    assert abs(sig.get("probe.alloc_retries_per_s") - 10.0) < 1e-9
    assert abs(sig.get("probe.steps_per_s") - 4.0) < 1e-9
    assert abs(sig.get("probe.alloc_retries_per_step") - 2.5) < 1e-9
    f = allocator_thrash(sig)
    assert f is not None and "10.0 cudaMalloc retries a second (2.50 a step)" in f.summary


def test_a_counter_that_goes_back_or_is_not_a_count_gives_no_rate():
    assert build_signals(_store([50, 40, 30]), 2.5).get("probe.alloc_retries_per_s") is None
    assert build_signals(_store(["x", 1.5, None]), 2.5).get("probe.alloc_retries_per_s") is None
    assert allocator_thrash(build_signals(_store([5]), 0.5)) is None


def test_cuda_malloc_and_free_calls_become_rates_per_step_in_the_evidence():
    """The allocator's cudaMalloc/cudaFree calls (memory_stats' num_device_alloc, num_device_free on
    torch 2.13; its segment counters before): a steady job makes none once its cache is built, a
    thrashing one some every step. 12 mallocs a second at 4 steps a second: 3 a step."""
    sig = build_signals(_store([0, 10, 20, 30, 40, 50], [100, 112, 124, 136, 148, 160]), 5.5)
    assert abs(sig.get("probe.cuda_mallocs_per_step") - 3.0) < 1e-9
    assert abs(sig.get("probe.cuda_frees_per_step") - 3.0) < 1e-9
    ev = allocator_thrash(sig).evidence
    assert ev["cuda_mallocs_per_step"] == 3.0 and ev["cuda_frees_per_step"] == 3.0
    # a probe that sent no counts (recordings before 2026-12-07), or a count that went back: no rate, the
    # retries' still there
    for mallocs in ([None] * 6, [160, 148, 136, 124, 112, 100]):
        sig = build_signals(_store([0, 10, 20, 30, 40, 50], mallocs), 5.5)
        assert sig.get("probe.cuda_mallocs_per_step") is None and sig.get("probe.alloc_retries_per_step") == 2.5


def test_a_cache_rebuilt_every_step_without_a_retry_is_thrash_that_names_empty_cache():
    """torch.cuda.empty_cache() in the loop: no retry, but the allocator gives its segments back
    and cudaMallocs them again every step (10 a step here). With the GPU idle 22% of the time in
    host code and syncs, that is allocator_thrash, and its advice is to remove the call; the same
    idle with a cache built once (no calls after warm-up) is not the allocator's."""
    assert ALLOC_FREES_PER_STEP <= 10.0, "the calls below are 10 a step"

    def judged(mallocs, retries=(0, 0, 0, 0, 0, 0)):
        sig = build_signals(_store(list(retries), mallocs), 5.5)
        sig.set("budget.cpu", 0.18)
        sig.set("budget.sync", 0.04)
        return allocator_thrash(sig)

    f = judged([100, 140, 180, 220, 260, 300])
    assert f.level >= 1.0 and abs(f.lost_share - 0.22) < 1e-9, (f.level, f.lost_share)
    assert "10 cudaFree and 10 cudaMalloc calls a step" in f.summary and "empty_cache()" in f.summary, f.summary
    assert "Remove it from the step" in f.advice and "expandable_segments" in f.advice
    assert f.evidence["cuda_frees_per_step"] == 10.0 and f.evidence["alloc_retries_per_s"] == 0.0
    # a steady cache: the same idle is not the allocator's
    assert judged([300] * 6).level == 0.0
    # a few segments a step (a Trainer calling empty_cache() mid-step, its activations live, freed 1.5
    # and gained +6% by the fix): not a cache rebuilt
    assert judged([300, 306, 312, 318, 324, 330]).level == 0.0
    # retries behind the churn: the retries' words and advice
    f = judged([100, 140, 180, 220, 260, 300], retries=(0, 4, 8, 12, 16, 20))
    assert f.level >= 1.0 and "4.0 cudaMalloc retries a second" in f.summary, f.summary
    assert "Remove it from the step" not in f.advice
    # a stray retry (one in the window, far under the retries' rate) does not explain 10 frees a step
    f = judged([100, 140, 180, 220, 260, 300], retries=(0, 0, 0, 1, 1, 1))
    assert "empty_cache()" in f.summary and "Remove it from the step" in f.advice, f.summary


def test_the_drivers_work_util_gpu_counts_busy_is_part_of_the_allocators_cost():
    """util.gpu counts the driver's cudaFree/cudaMalloc work on the GPU as busy while GPM's engine
    activity does not (H100, nanoGPT with empty_cache() every step: util.gpu 88%, GR active 69%; its
    fix +35%). That gap, with PCIe quiet, is gpu.driver_only; within the two means' noise it is 0,
    and with PCIe busy it is the copies' (None). The rule adds it to the host-side idle, and the
    causal layer judges the cause against the busy share less it (not gated as 'GPU busy')."""
    from gputop.verdicts.causal import busy_for, causal_loss
    from gputop.verdicts.signals import _driver_only

    sig = build_signals(_store([0] * 6, [100, 300, 500, 700, 900, 1100]), 5.5)
    for k, v in (("gpu.util_gpu", 88.0), ("gpu.gr_active", 69.0), ("gpu.pcie_rx_mibs", 47.0),
                 ("gpu.pcie_tx_mibs", 8.0)):
        sig.set(k, v)
    assert abs(_driver_only(sig) - 0.19) < 1e-9
    sig.set("gpu.driver_only", _driver_only(sig))
    sig.set("budget.gpu_busy", 0.975)
    sig.set("budget.cpu", 0.024)
    sig.set("budget.sync", 0.0)
    f = allocator_thrash(sig)
    assert abs(f.lost_share - 0.214) < 1e-9 and f.level >= 1.0, (f.lost_share, f.level)
    assert "GR active 69%" in f.summary and f.evidence["driver_only_pct"] == 19.0, f.summary
    # judged against the GPU's busy share less the driver's work: 78.5%, under the busy gate, and the
    # loss is not capped at the 2.5% util.gpu left idle
    assert abs(busy_for("allocator_thrash", sig) - 0.785) < 1e-9 and abs(busy_for("host_bound", sig) - 0.975) < 1e-9
    assert abs(causal_loss("allocator_thrash", f.lost_share, sig) - 0.214) < 1e-9
    # the gap counts only where the probe counted the rebuild: old recordings (no counts) and retry jobs
    # with gaps of 6-8 points whose fixes gained -1% and +7% keep the host side alone
    bare = build_signals(_store([0] * 6), 5.5)
    for k, v in (("gpu.util_gpu", 88.0), ("gpu.gr_active", 69.0)):
        bare.set(k, v)
    assert _driver_only(bare) is None
    # the means' noise, and a copying job (its gap is the copy engines')
    sig.set("gpu.gr_active", 85.0)
    assert _driver_only(sig) == 0.0
    sig.set("gpu.gr_active", 69.0)
    sig.set("gpu.pcie_rx_mibs", 5000.0)
    assert _driver_only(sig) is None
