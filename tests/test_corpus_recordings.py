"""Today's rules re-judge the corpus recorded on the GPU machine (issue 29: benchmarks/corpus/, run
by ``bash benchmarks/h200.sh corpus``): each job as it is and fixed, replayed by
benchmarks/corpus_score.py, against the cause it was built with and the gain its fix measured
there (the job's own steps/s). Two runs make the corpus: benchmarks/results/h100-corpus-1206/
(an H100: the 8 tuning jobs not run before, and two jobs run again with both variants in one
call) first, then benchmarks/results/h200-corpus-1206/ (an H200: the other 22); each job's pair
comes from one run, one card.

Three jobs were run again for longer (``h100-corpus-1206b``), and one for 60 s
(``h100-accel-60s-1207``, first in the list). The jobs judged right at the first scoring of each
run (docs/verdicts.md, "The corpus") must stay right: a rule change that loses one fails here,
whichever job it is, even if it wins another; one that wins a job adds it to these sets in the
same commit.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "h200-corpus-1206" / "h200"
RUN_H100 = ROOT / "benchmarks" / "results" / "h100-corpus-1206" / "h200"   # (h200.sh names its folder so)
# three jobs run again for longer on an H100 (third session of 2026-12-06): their 14 s pairs were
# too short to judge after a late attach, or held 2 steps of a GIL-starved loop
RUN_LONG = ROOT / "benchmarks" / "results" / "h100-corpus-1206b" / "h200"
# accelerate_log_sleep (held out) run again for 60 s on an H100 (2026-12-07): its 14 s H200 pair
# (+28% predicted, +44% measured) was the shortest of the gain misses; 60 s: +20% against +29%
RUN_ACCEL60 = ROOT / "benchmarks" / "results" / "h100-accel-60s-1207"
RUN_H200_30 = ROOT / "benchmarks" / "results" / "h200-issue30-1206b" / "h200"   # compile_varlen on an H200
# second fixes (the manifest's second_flags), each job's three variants in one call on an H100
# (2026-12-06, fourth session): not in the score, whose fix is the label's
RUN_SECOND = ROOT / "benchmarks" / "results" / "h100-second-fix-1206c" / "h200"
# the MLP's three variants and the ResNet's two under GPUTOP_KERNEL_SAMPLE=1 (the probe's kernel trace), one H100 call
RUN_KERNELS = ROOT / "benchmarks" / "results" / "h100-kernel-sample-1206f"

# the right primary as it is (a healthy job: no cause predicting > 10%) ...
RIGHT = {"accelerate_gpu_bound", "eval_every_5s", "lightning_resnet_pin", "memory_bound_elementwise",
         "nanogpt_item_every10", "overlapped_pinned_copy", "trainer_gpt2_large_batch", "unet_diffusion_ema",
         "accelerate_tokenize_main", "recsys_cpu_embedding", "accelerate_log_sleep", "gil_metrics_thread",
         "ckpt_every_2s", "dataloader_keeps_up", "host_cpu_augment",
         "lightning_sync_metrics", "lightning_workers0", "logger_thread_light", "plain_pageable_h2d",
         "push_metrics_blocking", "rnn_lstmcell_loop", "small_ckpt_every_5s", "small_mlp_launch",
         "timm_vit_few_workers", "timm_vit_tqdm", "trainer_save_steps", "trainer_slow_dataset",
         "tv_resnet_batch1_infer", "tv_resnet_workers0"}
# ... and the fixed variant with no cause-naming primary predicting > 10%
FIXED_OK = {"accelerate_gpu_bound", "eval_every_5s", "lightning_resnet_pin", "memory_bound_elementwise",
            "nanogpt_item_every10", "overlapped_pinned_copy", "trainer_gpt2_large_batch", "unet_diffusion_ema",
            "push_metrics_blocking", "accelerate_log_sleep", "accelerate_tokenize_main", "ckpt_every_2s",
            "dataloader_keeps_up",
            "gil_metrics_thread", "host_cpu_augment", "lightning_sync_metrics", "lightning_workers0",
            "logger_thread_light", "plain_pageable_h2d", "rnn_lstmcell_loop", "small_ckpt_every_5s",
            "timm_vit_few_workers", "timm_vit_tqdm", "trainer_save_steps", "trainer_slow_dataset",
            "tv_resnet_batch1_infer", "tv_resnet_workers0"}
# issue 29's second held-out corpus (benchmarks/corpus/manifest.py: UNSEEN1207), written blind to the rules:
# four of its eight jobs ran on an H100 (16 s each, the DLRM job 14 s; the device time ran out). At the
# first look one was right (tabular_features_in_loop); two more after the warm-up waited for a first step
# with no DataLoader and the thread states' look was held to the judged stretch. nvidia_smi_in_loop is a
# miss (host_bound; no verdict since named blocking waits are drained wherever they fall)
UNSEEN_RUN = ROOT / "benchmarks" / "results" / "h100-unseen-1207" / "corpus-unseen1207"
UNSEEN_RIGHT = {"tv_mobilenet_graph", "lightning_grad_norm_items", "tabular_features_in_loop"}
ISSUE30_RIGHT = {"gpu_shared_second_job", "offload_adamw_cpu", "amp_fp16_overflow", "compile_varlen"}


def score(tmp_path: pathlib.Path, *args: str) -> list[dict]:
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "corpus_score", *args, "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[dict]:
    return score(tmp_path_factory.mktemp("corpus"), str(RUN_ACCEL60 / "corpus"), str(RUN_LONG / "corpus"),
                 str(RUN_H100 / "corpus"), str(RUN / "corpus"))


def test_every_recorded_job_is_judged_and_its_fix_measured(corpus):
    assert len(corpus) == 30, [r["job"] for r in corpus]
    for r in corpus:
        assert r["as_is"]["first_step_t"] is not None, r["job"]   # the training was seen to start
        # every pair's steps/s came from the job's own log (a progress bar's carriage returns too)
        if "fixed" in r:
            assert r["rates"]["as_is"] and r["rates"]["fixed"], r["job"]


def test_no_job_judged_right_at_the_first_scoring_is_lost(corpus):
    right = {r["job"] for r in corpus if r["right"]}
    assert RIGHT <= right, {r["job"]: r["as_is"]["primary"] for r in corpus if r["job"] in RIGHT - right}
    fixed_ok = {r["job"] for r in corpus if r.get("fixed_ok")}
    assert FIXED_OK <= fixed_ok, {r["job"]: (r["fixed"]["primary"], r["fixed"]["gain"]) for r in corpus
                                  if r["job"] in FIXED_OK - fixed_ok}
    held_out = [r for r in corpus if r["holdout"]]
    assert len(held_out) == 10 and sum(r["right"] for r in held_out) >= 8   # the first look's 8/10


def test_attached_five_seconds_into_training_the_primary_is_the_same(corpus):
    """Issue 29: attaching at any moment of start-up gives the same primary as watching from the
    start. corpus_score cuts each recording 5 s after its first training step and judges the rest:
    every job keeps its primary (the two 14 s jobs whose cut recordings once ended before a verdict
    were run again for 30 s)."""
    differ = {r["job"]: (r["as_is"]["primary"], r["late"]["primary"]) for r in corpus if not r.get("attach_same")}
    assert not differ, differ


def test_in_steady_training_the_live_primary_changes_at_most_once_a_minute(corpus):
    """Issue 29: the live primary changes only when a new verdict has held a stable stretch. The
    report counts the live primary going from one verdict to another in judged time
    (``primary_changes``; none between is no change): on every corpus recording, as it is and
    fixed, at most once per started minute (0 on all 60 at the third session of 2026-12-06)."""
    for r in corpus:
        for v in ("as_is", "fixed"):
            j = r.get(v)
            if j is None:
                continue
            assert j["primary_changes"] is not None and j["judged_s"] is not None, (r["job"], v, j)
            assert j["primary_changes"] <= 1 + int(j["judged_s"] // 60), (r["job"], v, j)


def test_a_healthy_job_is_never_given_a_cause_worth_more_than_ten_percent(corpus):
    healthy = [r for r in corpus if r["cause"] is None]
    assert len(healthy) == 12
    for r in healthy:
        assert r["right"], (r["job"], r["as_is"])
        # and its trap removed gained nothing (or cost: Lightning without pinning was 17% slower):
        # the job's own steps/s agree it was healthy
        assert -0.25 < r["measured_gain"] < 0.05, (r["job"], r["rates"])


def test_a_right_cause_predicts_a_gain_that_grows_with_the_measured_one(corpus):
    """Not the ±30% goal (docs/verdicts.md reports how often it is met): the predicted gains of the
    right verdicts rank the jobs as their measured gains do, so 'what a fix would gain' orders the
    user's options."""
    pairs = sorted((r["measured_gain"], r["as_is"]["gain"]) for r in corpus
                   if r["right"] and r["cause"] and r["as_is"]["gain"] is not None and r["measured_gain"])
    assert len(pairs) >= 10
    concordant = sum((m2 - m1) * (g2 - g1) > 0 for i, (m1, g1) in enumerate(pairs) for m2, g2 in pairs[i + 1:])
    total = len(pairs) * (len(pairs) - 1) // 2
    assert concordant / total >= 0.75, pairs


def test_the_idle_after_a_sync_is_the_blocking_calls_as_its_fix_measured():
    """push_metrics_blocking reads the loss (.item(): a sync), then POSTs it for 0.3 s, once a
    second. The sync empties the GPU's queue, so the GPU idles through the POST; the fix (the POST
    in a thread) gained 38% on the H100, so the POST cost 1 - 1/1.38 = 28% of the wall time.
    NVML's averaging smeared that idle over the sync before it (13% blocked, 13% "sync" before the
    re-placement after a sync, gputop.derive.moments). The window's idle time is kept."""
    from gputop.report import build_report

    rep = build_report(str(RUN_H100 / "corpus" / "push_metrics_blocking-as_is.gtrec"))
    shares = rep["budget"]["training"]["shares"]
    rates = {}
    for v in ("as_is", "fixed"):
        rows = [json.loads(line) for line in (RUN_H100 / "corpus" / "results.jsonl").read_text().splitlines()]
        rates[v] = next(r["steps_per_s"] for r in rows if r["job"] == "push_metrics_blocking" and r["variant"] == v)
    cost = 1.0 - rates["as_is"] / rates["fixed"]
    assert abs(shares["blocked"] - cost) <= 0.05, (shares, cost)
    assert shares["sync"] <= 0.05, shares
    assert abs(sum(shares.values()) - 1.0) < 1e-3


def test_the_probe_counts_each_steps_copies_their_bytes_and_whether_the_host_side_is_pinned():
    """Three jobs whose copies are known from their code, recorded on an H100 in one call
    (transfers/): plain_pageable_h2d copies one 8192 x 8192 float32 batch a step, pageable as it
    is and pinned, non_blocking, fixed; overlapped_pinned_copy a pinned 16384 x 8192 one on a
    side stream; the hand-made offload sends each bf16 gradient to the host and each fp32 master
    weight back (twice the bytes)."""
    from gputop.report import build_report

    def copies(stem):
        rep = build_report(str(RUN_H100 / "transfers" / f"{stem}.gtrec"))
        return rep, rep["probe"]["ranks"][0]["copies"]

    _rep, c = copies("plain_pageable_h2d-as_is")
    assert c["h2d"]["bytes"] == 8192 * 8192 * 4 == c["h2d"]["pageable_bytes"] and c["h2d"]["n"] == 1, c
    assert c["d2h"]["bytes"] == 0
    _rep, fixed = copies("plain_pageable_h2d-fixed")
    assert fixed["h2d"]["bytes"] == 8192 * 8192 * 4 and fixed["h2d"]["pageable_bytes"] == 0, fixed
    # a pageable copy holds the loop for the transfer; a pinned non_blocking one returns at once
    assert c["h2d"]["ms"] > 10 * fixed["h2d"]["ms"], (c, fixed)
    _rep, side = copies("overlapped_pinned_copy-as_is")
    assert side["h2d"]["bytes"] == 16384 * 8192 * 4 and side["h2d"]["pageable_bytes"] == 0, side
    rep, off = copies("offload_adamw_cpu-as_is")
    assert off["d2h"]["bytes"] > 100e6 and off["h2d"]["bytes"] == 2 * off["d2h"]["bytes"], off
    assert off["d2h"]["pageable_bytes"] == off["d2h"]["bytes"] and off["h2d"]["pageable_bytes"] == off["h2d"]["bytes"]
    # the verdict that names the offload says so, in the report's own words (one function)
    assert rep["primary_verdict"]["id"] == "optimizer_offload", rep["primary_verdict"]
    ev = rep["verdicts"]["optimizer_offload"]["evidence"]
    assert ev["d2h_mb_per_step"] == round(off["d2h"]["bytes"] / 1e6, 1) and ev["d2h_pageable_pct"] == 100.0
    from gputop.derive.steps import copies_text
    assert copies_text(off) in rep["verdicts"]["optimizer_offload"]["summary"]
    _rep, none = copies("offload_adamw_cpu-fixed")
    assert none["h2d"]["bytes"] < 1e6 and none["d2h"]["bytes"] < 1e6, none


@pytest.mark.parametrize("job", ["accelerate_tokenize_main", "timm_vit_few_workers", "tv_resnet_workers0"])
def test_the_budgets_data_wait_agrees_with_the_probes_split(job):
    """The probe times each step's data wait and GPU span; the budget's data share of training
    (py-spy's samples joined with the GPU's counters at step resolution) must agree within
    corpus_split's 5 points. The first two were 6 points apart on 2026-12-06 (a handful of samples
    a window in the wait, and the counters' smeared idle, capped the budget); the third is the
    most input-bound job of the corpus."""
    from benchmarks.corpus_split import AGREE_PTS, split

    row = split(RUN / "corpus" / f"{job}-as_is.gtrec")
    assert row is not None and row["probe_data"] > 0.2, row
    assert abs(row["probe_data"] - row["budget_data"]) * 100 <= AGREE_PTS, row


def test_a_start_up_the_tables_do_not_know_is_start_up_once_the_first_step_comes():
    """tv_jpeg_decode_few_workers (unseen corpus, H100) encodes 2000 JPEGs in its main thread
    before training (frames the tables do not know: "running", judged like training), then sits
    17.5 s in its first step. Once training starts with that step pending, the "running" stretch
    is start-up: the report's training budget is the loop's (data 87%, where the probe timed 86%
    of step time waiting for batches; with the JPEG encoding in it, 62%), and its start-up reaches
    the first training frames."""
    from benchmarks.corpus_split import AGREE_PTS, split
    from gputop.report import build_report

    rec = ROOT / "benchmarks" / "results" / "h100-unseen-1207b" / "corpus-unseen1207"
    rec = rec / "tv_jpeg_decode_few_workers-as_is.gtrec"
    row = split(rec)
    assert row is not None and row["probe_data"] > 0.8, row
    assert abs(row["probe_data"] - row["budget_data"]) * 100 <= AGREE_PTS, row
    rep = build_report(str(rec))
    assert rep["startup_s"] > 25.0, rep["startup"]
    assert "make_jpegs" not in " ".join(f[0] for f in rep["budget"]["training"]["frames"].get("cpu", [])), \
        rep["budget"]["training"]["frames"]


def test_issue30s_causes_are_named_on_the_jobs_that_reproduce_them(tmp_path):
    rows = {r["job"]: r for r in score(tmp_path, "--set", "issue30", str(RUN_H100 / "corpus-issue30"),
                                       str(RUN / "corpus-issue30"))}
    for name in ISSUE30_RIGHT:
        assert rows[name]["right"], (name, rows[name]["as_is"])
        assert rows[name]["fixed_ok"], (name, rows[name]["fixed"])


def test_fixes_worth_tens_of_times_the_steps_are_predicted_within_thirty_percent(corpus, tmp_path):
    """A lost share was once capped at 0.95, so no prediction said more than 20x: the recommender
    whose tables sat on the CPU was told 18.9x and its fix measured 32x. And a recompile's cost
    was dynamo's own clock of it over a 10 s window (82% of the time on the H100's compile_varlen:
    5.4x), where padding to one length measured 124x: now the recompiling steps' excess over a
    typical step, over the rule's 60 s horizon (derive/steps.py, ``recompile_cost_share``)."""
    rows = {r["job"]: r for r in corpus}
    r = rows["recsys_cpu_embedding"]
    assert r["measured_gain"] > 20 and abs(r["as_is"]["gain"] - r["measured_gain"]) <= 0.3 * r["measured_gain"], r
    # compile_varlen on the H100 (0.60 -> 74.8 steps/s) and on the H200 (0.75 -> 75.1, third session)
    for run in (RUN_H100, RUN_H200_30):
        r = {r["job"]: r for r in score(tmp_path, "--set", "issue30", str(run / "corpus-issue30"))}["compile_varlen"]
        assert r["as_is"]["primary"] == "recompilation" and r["fixed"]["primary"] == "gpu_bound", r
        assert r["measured_gain"] > 90 and abs(r["as_is"]["gain"] - r["measured_gain"]) <= 0.3 * r["measured_gain"], r


def test_a_second_fix_that_removes_just_the_launches_gains_what_launch_bound_predicted(tmp_path):
    """The label's fixes of two launch_bound jobs change more than the launches: cuDNN's LSTM
    also cuts the GPU's work (+508% measured, +125% predicted), and make_graphed_callables on
    the MLP leaves the loss and the optimizer eager (+154% measured, +411% predicted; its fixed
    job still launch_bound, +165%). A second fix that captures forward, loss and backward in one
    CUDA graph removes the launches and keeps the kernels: what the prediction is about."""
    rows = {r["job"]: r for r in score(tmp_path, str(RUN_SECOND / "corpus"))}
    lines = (RUN_SECOND / "corpus" / "results.jsonl").read_text().splitlines()
    rates = {(r["job"], r["variant"]): r["steps_per_s"] for r in map(json.loads, lines)}
    from benchmarks.corpus_score import judge

    for job in ("small_mlp_launch", "rnn_lstmcell_loop"):
        measured = rates[job, "second"] / rates[job, "as_is"] - 1.0
        predicted = rows[job]["as_is"]["gain"]
        assert rows[job]["as_is"]["primary"] == "launch_bound", rows[job]["as_is"]
        assert abs(predicted - measured) <= 0.3 * measured, (job, predicted, measured)
        second = judge(RUN_SECOND / "corpus" / f"{job}-second.gtrec")
        assert not (second["primary"] and second["primary"] != "gpu_bound" and (second["gain"] or 0) > 0.10), second
    # on the MLP with the label's fix, what gputop said was left (+165%) is what the second fix gained
    fixed = rows["small_mlp_launch"]["fixed"]
    measured = rates["small_mlp_launch", "second"] / rates["small_mlp_launch", "fixed"] - 1.0
    assert fixed["primary"] == "launch_bound" and abs(fixed["gain"] - measured) <= 0.3 * measured, (fixed, measured)
    # the score marks what the second fix says: the MLP's label fix left the cause (a right call on
    # its fixed job, +162% > 10%), the LSTM's did not (gputop named nothing there); and the pairs it
    # measures: the MLP's two (as it is, label-fixed), the LSTM's one, each within 30%
    assert rows["small_mlp_launch"]["partial_fix"] and not rows["rnn_lstmcell_loop"]["partial_fix"]
    assert [p[2] for p in rows["small_mlp_launch"]["second_pairs"]] == [True, True]
    assert [p[2] for p in rows["rnn_lstmcell_loop"]["second_pairs"]] == [True]


def test_a_kernel_trace_sets_the_launch_gain_at_the_floor_a_cuda_graph_reaches():
    """With GPUTOP_KERNEL_SAMPLE=1 the probe traced the MLP's kernels once (0.95 ms a step, the same
    GPU work in all three variants), and launch_bound's idle share became the kernels' rather than
    util.gpu's: +654% predicted (+671% before the steps the trace slowed were left out of the step it
    divides) where the one-graph fix measured +620% in the same call (util.gpu's
    share gave +411% against +566% before). The ResNet's inference loop takes no optimizer step,
    so the probe of then saw no step and traced nothing: its gain stays util.gpu's (since the
    seventh session the model's calls are its steps: the test below)."""
    from gputop.report import build_report

    lines = (RUN_KERNELS / "corpus" / "results.jsonl").read_text().splitlines()
    rates = {(r["job"], r["variant"]): r["steps_per_s"] for r in map(json.loads, lines)}
    reps = {v: build_report(str(RUN_KERNELS / "corpus" / f"small_mlp_launch-{v}.gtrec")) for v in ("as_is", "fixed")}
    for rep in reps.values():
        ev = rep["verdicts"]["launch_bound"]["evidence"]
        assert 0.9 < ev["kernel_ms_per_step"] < 1.0 and ev["kernel_busy_pct"] < ev["util_gpu_pct"], ev
    measured = rates["small_mlp_launch", "second"] / rates["small_mlp_launch", "as_is"] - 1.0
    predicted = reps["as_is"]["primary_verdict"]["gain_pct"] / 100.0
    assert reps["as_is"]["primary_verdict"]["id"] == "launch_bound" and abs(predicted - measured) <= 0.3 * measured
    resnet = build_report(str(RUN_KERNELS / "corpus" / "tv_resnet_batch1_infer-as_is.gtrec"))
    assert resnet["primary_verdict"]["id"] == "launch_bound"
    assert resnet["verdicts"]["launch_bound"]["evidence"].get("kernel_ms_per_step") is None


def test_an_inference_loop_is_stepped_by_its_models_calls_and_its_graph_gain_taken_from_the_kernels():
    """The ResNet-50 batch-1 inference loop (no optimizer) under GPUTOP_KERNEL_SAMPLE=1 on an H100,
    seventh session of 2026-12-06 (``h100-forward-steps-1206k``, both variants in one call): the
    probe's steps are the model's calls (5760 at 287.6/s, where the job counted 287.5 images/s),
    so the trace ran (0.86 ms of kernels in a 3.5 ms step) and ``launch_bound``'s gain comes from
    the kernels: +228% against +275% measured by the CUDA-graph fix. Without the trace the same
    call's run predicted +155% (util.gpu) against +258%."""
    from gputop.report import build_report

    run = ROOT / "benchmarks" / "results" / "h100-forward-steps-1206k" / "traced" / "corpus"
    rates = {r["variant"]: r["steps_per_s"] for r in map(json.loads, (run / "results.jsonl").read_text().splitlines())}
    rep = build_report(str(run / "tv_resnet_batch1_infer-as_is.gtrec"))
    (rank,) = rep["probe"]["ranks"]
    assert rank["step_source"] == "forward" and abs(rank["steps_per_s"] / rates["as_is"] - 1.0) < 0.01, rank
    ev = rep["verdicts"]["launch_bound"]["evidence"]
    assert rep["primary_verdict"]["id"] == "launch_bound" and 0.8 < ev["kernel_ms_per_step"] < 0.9, ev
    measured = rates["fixed"] / rates["as_is"] - 1.0
    predicted = rep["primary_verdict"]["gain_pct"] / 100.0
    assert abs(predicted - measured) <= 0.3 * measured, (predicted, measured)


def test_copies_cost_no_more_than_the_host_time_the_probe_counted_for_them():
    """The recommender with its tables on the GPU still copies 9.4 MB of pinned indices a step
    (1.7 GiB/s at 180 steps/s): h2d_copy_bound. It once claimed the GPU's whole idle share (+58%);
    staging the batches on the GPU gained +17%, and the idle left was the sparse backward's. The
    copies held the thread 1.4 of 5.5 ms a step (the probe's count): their cost is at most that."""
    from gputop.report import build_report

    rep = build_report(str(RUN_SECOND / "corpus" / "recsys_cpu_embedding-fixed.gtrec"))
    ev = rep["verdicts"]["h2d_copy_bound"]["evidence"]
    share = ev["h2d_ms_per_step"] / rep["probe"]["ranks"][0]["step_ms"]["mean"]
    assert rep["primary_verdict"]["id"] == "h2d_copy_bound"
    assert abs(rep["primary_verdict"]["gain_pct"] / 100.0 - share / (1.0 - share)) < 0.08, (ev, share)
    assert rep["primary_verdict"]["gain_pct"] < 40, rep["primary_verdict"]
    second = build_report(str(RUN_SECOND / "corpus" / "recsys_cpu_embedding-second.gtrec"))
    assert "h2d_copy_bound" not in second["verdicts"], second["verdicts"].keys()


def test_an_offloads_gain_counts_the_copies_its_fix_removes(tmp_path):
    """The hand-made offload on the H200: util.gpu read 9.4% busy where GPM's compute engine read
    3.0% (util.gpu counts the copy engines), so the host side alone (88% of the time) predicted
    +685% where keeping AdamW on the GPU measured +2584%. The fix removes the copies and the
    offload's own waits too: their shares are in the cost now."""
    rows = {r["job"]: r for r in score(tmp_path, "--set", "issue30", str(RUN / "corpus-issue30"))}
    r = rows["offload_adamw_cpu"]
    assert r["as_is"]["primary"] == "optimizer_offload" and r["measured_gain"] > 20, r
    assert abs(r["as_is"]["gain"] - r["measured_gain"]) <= 0.3 * r["measured_gain"], r
    from gputop.report import build_report

    ev = build_report(str(RUN / "corpus-issue30" / "offload_adamw_cpu-as_is.gtrec"))["verdicts"]["optimizer_offload"]
    assert 3.0 < ev["evidence"]["copy_only_pct"] < 10.0, ev["evidence"]
    # and the recommender whose SGD holds its CPU tables (optimizer_offload too), on the H100 of the
    # second fixes: +3220% predicted against +2916% measured (+2523% before)
    r = {r["job"]: r for r in score(tmp_path, str(RUN_SECOND / "corpus"))}["recsys_cpu_embedding"]
    assert r["as_is"]["primary"] == "optimizer_offload", r["as_is"]
    assert abs(r["as_is"]["gain"] - r["measured_gain"]) <= 0.3 * r["measured_gain"], r


def test_allocator_thrash_is_named_where_retries_cost_steps_and_not_once_they_are_gone():
    """benchmarks/results/h200-alloc-1206b: a 96-layer job at 0.3% headroom on an H200 made 16
    allocator retries and 9 OOMs in 40 steps of 20 s, against 50 steps with expandable_segments:
    allocator_thrash is its primary, with the retries in its evidence; the fixed job has none."""
    from gputop.report import build_report

    alloc = ROOT / "benchmarks" / "results" / "h200-alloc-1206b" / "corpus-issue30"
    rep = build_report(str(alloc / "alloc_thrash_varlen-as_is.gtrec"))
    assert rep["primary_verdict"]["id"] == "allocator_thrash", rep["primary_verdict"]
    assert rep["verdicts"]["allocator_thrash"]["evidence"]["alloc_retries_per_s"] > 0, rep["verdicts"]
    assert 10 < rep["primary_verdict"]["gain_pct"] < 60, rep["primary_verdict"]   # 40 vs 50 steps: +25%
    fixed = build_report(str(alloc / "alloc_thrash_varlen-fixed.gtrec"))
    assert "allocator_thrash" not in fixed["verdicts"], fixed["verdicts"].keys()


# torch.cuda.empty_cache() every step on an H100 (fourth session of 2026-12-07): run2 holds the
# nanoGPT pair the cost was set from, the Trainer whose fix gained +6% and the ResNet-50 that missed as
# the first unseen check; run3 the Lightning and timm jobs written after the cost was revised
RUN_EMPTY_CACHE = ROOT / "benchmarks" / "results" / "h100-empty-cache-1207"


def test_a_cache_rebuilt_every_step_by_empty_cache_is_allocator_thrash_with_its_measured_gain(tmp_path):
    """The allocator's churn without a retry: each empty_cache() gives every cached segment back
    and the next step cudaMallocs them again (46-109 calls a step). Its fix (removing the call)
    gained +35% to +88%; allocator_thrash is primary as it is, attached early or late, within 30% of
    that, and gone once fixed. A Trainer calling it mid-step with its activations live freed 1.5
    segments a step and its fix gained +6%: no cause is named there."""
    rows = {r["job"]: r for r in score(tmp_path, "--set", "issue30", str(RUN_EMPTY_CACHE / "run3" / "corpus-issue30"),
                                       str(RUN_EMPTY_CACHE / "run2" / "corpus-issue30"))}
    for name in ("nanogpt_empty_cache", "tv_resnet_empty_cache", "lightning_empty_cache_callback",
                 "timm_vit_empty_cache"):
        r = rows[name]
        assert r["measured_gain"] > 0.3, r
        assert r["as_is"]["primary"] == "allocator_thrash" and r["late"]["primary"] == "allocator_thrash", r
        assert abs(r["as_is"]["gain"] - r["measured_gain"]) <= 0.3 * r["measured_gain"], r
        assert r["fixed"]["primary"] in (None, "gpu_bound"), r
    trainer = rows["trainer_empty_cache_steps"]
    assert trainer["measured_gain"] < 0.10 and trainer["as_is"]["primary"] is None, trainer
    # the ResNet's host-side idle (forward and backward slowed by a cudaMalloc under each op) is in the
    # allocator's cost: host_bound, with its advice to move CPU work out of the loop, gives way
    from gputop.report import build_report
    rep = build_report(str(RUN_EMPTY_CACHE / "run2" / "corpus-issue30" / "tv_resnet_empty_cache-as_is.gtrec"))
    thrash = rep["verdicts"]["allocator_thrash"]
    assert "host_bound" not in rep["verdicts"] and "empty_cache() at <module> (tv_resnet_empty_cache.py:59)" in \
        thrash["summary"] and "tv_resnet_empty_cache.py:59" in thrash["advice"], thrash
    # the ViT's cudaMallocs kept its launching thread busy with the SMs 32% active: launch_bound's look, the
    # allocator's cause (its fixed job has no verdict at all)
    rep = build_report(str(RUN_EMPTY_CACHE / "run3" / "corpus-issue30" / "timm_vit_empty_cache-as_is.gtrec"))
    assert set(rep["verdicts"]) == {"allocator_thrash"}, rep["verdicts"].keys()


def test_with_the_allocators_calls_counted_healthy_jobs_and_retries_at_the_edge_are_no_thrash():
    """run4 (the same H100 session, the probe's counts forwarded): four healthy corpus jobs made no
    cudaFree or cudaMalloc in training, and the allocator job at its 5% margin made 7 retries, 138
    cudaFrees and 61 cudaMallocs in 35 steps (under 10 a step each) while its fix gained +0.1%:
    gputop names no allocator_thrash on any of them, and the pair's memory warning stays a warning."""
    from gputop.report import build_report

    run = RUN_EMPTY_CACHE / "run4"
    for name in ("dataloader_keeps_up", "lightning_resnet_pin", "trainer_gpt2_large_batch", "unet_diffusion_ema"):
        rep = build_report(str(run / "healthy" / f"{name}-as_is.gtrec"))
        assert rep["primary_verdict"]["id"] == "gpu_bound" and "allocator_thrash" not in rep["verdicts"], name
    rates = {json.loads(line)["variant"]: json.loads(line)["steps_per_s"]
             for line in (run / "alloc" / "results.jsonl").read_text().splitlines()}
    assert abs(rates["fixed"] / rates["as_is"] - 1) < 0.10, rates
    rep = build_report(str(run / "alloc" / "alloc_thrash_varlen-as_is.gtrec"))
    assert "allocator_thrash" not in rep["verdicts"], rep["verdicts"].keys()
    assert "gpu_memory_pressure" in rep["verdicts"], rep["verdicts"].keys()


def test_a_loop_that_catches_an_oom_at_every_batch_is_stalled_and_says_so():
    """benchmarks/results/h100-alloc-steady-1206c: the allocator job kept at its pressure
    (ALLOC_ON_OOM=skip) made 11 steps, then every batch failed: 301 OOMs in 49 s, the GPU 95% busy,
    no step. (The job drew the failed batch's length again after each OOM, so once the longest
    failed every try did: a livelock of the script's, found on 2026-12-07, that a loop retrying its
    batch on OOM has too.) gputop says stalled, at the step's line, and why: the OOMs the loop
    caught (the probe's counter; before, the advice was about collectives, locks and sleeps). The
    fixed job (expandable_segments) steps on, gpu_bound."""
    from gputop.report import build_report

    run = ROOT / "benchmarks" / "results" / "h100-alloc-steady-1206c" / "corpus-issue30"
    rep = build_report(str(run / "alloc_thrash_varlen-as_is.gtrec"))
    assert rep["primary_verdict"]["id"] == "stalled", rep["primary_verdict"]
    v = rep["verdicts"]["stalled"]
    assert v["evidence"]["ooms_in_window"] > 20, v["evidence"]
    assert "out-of-memory errors raised and caught" in v["summary"] and "batch size" in v["advice"], v
    assert "alloc_thrash_varlen.py:67" in v["summary"]
    fixed = build_report(str(run / "alloc_thrash_varlen-fixed.gtrec"))
    assert fixed["primary_verdict"]["id"] == "gpu_bound", fixed["primary_verdict"]
    assert "stalled" not in fixed["verdicts"], fixed["verdicts"].keys()


def test_allocator_retries_on_a_busy_gpu_are_a_warning_with_their_counts_not_a_cause():
    """benchmarks/results/h100-alloc-skip-1207 (an H100, 2026-12-07): the allocator job with a
    failed batch dropped (ALLOC_ON_OOM=skip, the script's livelock fixed) at 5% and 10% margins
    made 0.6 and 0.2 cudaMalloc retries a second and caught OOMs, its GPU 99% busy; its fix
    (expandable_segments) gained +3.6% and +0.4% under gputop (+2.5% and +0.4% bare). gputop names
    no allocator_thrash and no other cause on either variant (the fixes measured under 10%), and its
    memory warning now carries the retries and OOMs the probe counted, and the share of the steps
    tried that an OOM threw away; the fixed jobs have no warning left."""
    from gputop.report import build_report

    run = ROOT / "benchmarks" / "results" / "h100-alloc-skip-1207"
    for margin in ("m0.05", "m0.1"):
        folder = run / f"pair-b32-{margin}" / "corpus-issue30"
        rates = {json.loads(line)["variant"]: json.loads(line)["steps_per_s"]
                 for line in (folder / "results.jsonl").read_text().splitlines()}
        assert rates["fixed"] / rates["as_is"] - 1 < 0.10, rates   # the ground truth: no cause worth 10%
        rep = build_report(str(folder / "alloc_thrash_varlen-as_is.gtrec"))
        assert rep["primary_verdict"]["id"] == "gpu_bound", rep["primary_verdict"]
        assert set(rep["verdicts"]) == {"gpu_bound", "gpu_memory_pressure"}, rep["verdicts"].keys()
        mem = rep["verdicts"]["gpu_memory_pressure"]
        assert mem["evidence"]["alloc_retries_per_s"] > 0 and mem["evidence"]["ooms_in_window"] > 0, mem
        assert "cudaMalloc retries a second" in mem["summary"], mem
        # the steps thrown away: 6 and 2 OOMs beside 55 and 56 steps (the job's own count), 10% and
        # 3% of the steps tried over the run; the evidence is the mean over the warning's windows
        log = (folder / "alloc_thrash_varlen-as_is.log").read_text().splitlines()
        tried = {line.split()[0]: int(line.split()[1]) for line in log if line.startswith(("ooms", "done"))}
        truth = 100 * tried["ooms"] / (tried["ooms"] + tried["done"])
        assert abs(mem["evidence"]["oom_steps_pct"] - truth) < 5, (mem["evidence"], truth)
        fixed = build_report(str(folder / "alloc_thrash_varlen-fixed.gtrec"))
        assert set(fixed["verdicts"]) == {"gpu_bound"}, fixed["verdicts"].keys()
    # where memory is nearly full and the probe counted no retry, the evidence says 0 and the
    # summary says nothing of retries (the batch-8 job's fix: 97% used, launch-bound)
    fixed8 = build_report(str(run / "pair-b8-m0.02" / "corpus-issue30" / "alloc_thrash_varlen-fixed.gtrec"))
    mem = fixed8["verdicts"]["gpu_memory_pressure"]
    assert mem["evidence"]["alloc_retries_per_s"] == 0 and mem["evidence"]["ooms_in_window"] == 0, mem
    assert mem["evidence"]["oom_steps_pct"] == 0, mem
    assert "retries" not in mem["summary"] and "out-of-memory" not in mem["summary"], mem


def test_a_damaged_recording_costs_its_job_only_and_a_missing_folder_one_line(tmp_path):
    src = RUN / "corpus"
    for stem in ("tv_resnet_workers0-as_is", "tv_resnet_workers0-fixed"):
        for ext in (".gtrec", ".log"):
            (tmp_path / f"{stem}{ext}").write_bytes((src / f"{stem}{ext}").read_bytes())
    (tmp_path / "host_cpu_augment-as_is.gtrec").write_bytes(b"not a recording")
    rows = score(tmp_path, str(tmp_path))
    assert [r["job"] for r in rows] == ["tv_resnet_workers0"] and rows[0]["right"], rows
    for tool in ("corpus_score", "corpus_split"):
        r = subprocess.run([sys.executable, "-m", "benchmarks", tool, str(tmp_path / "nowhere")],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such folder" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    # a set that does not exist, alone or beside one that does: one line naming it and the sets there are
    r = subprocess.run([sys.executable, "-m", "benchmarks", "corpus_score", "--set", "corpus,nope", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such set: nope" in r.stderr, r.stderr
    assert "unseen1207" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("argv", [
    ["benchmarks/corpus/small_mlp_launch.py", "--seconds", "1", "--fixed", "--graph-step"],   # two fixes at once
    ["benchmarks/corpus/rnn_lstmcell_loop.py", "--seconds", "1", "--fixed", "--graph-step"],
    ["benchmarks/corpus/recsys_cpu_embedding.py", "--seconds", "1", "--gpu-batches"],   # the second fix alone
    ["-m", "benchmarks", "kernel_busy", "--", "benchmarks/corpus/no_such_job.py"],
    ["-m", "benchmarks", "corpus_run", "OUT", "--jobs", "small_mlp_launch", "--variants", "as_is,seconds"],
    ["-m", "benchmarks", "corpus_run", "OUT", "--set", "unseen1207c", "--jobs", "small_mlp_launch"],   # another set's
])
def test_corpus_tools_refuse_a_bad_command_line_in_one_line(argv, tmp_path):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out" / "results.jsonl").exists()   # nothing was run


@pytest.mark.parametrize("env", [{"ALLOC_SIZE": "1,2"}, {"ALLOC_HEADROOM": "lots"}, {"ALLOC_ON_OOM": "retry"}])
def test_the_allocator_jobs_exploring_knobs_refuse_bad_values_in_one_line(env):
    import os

    job = ROOT / "benchmarks" / "corpus" / "alloc_thrash_varlen.py"
    r = subprocess.run([sys.executable, str(job), "--seconds", "1"], env={**os.environ, **env},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert next(iter(env)) in r.stderr


def test_the_allocator_exploration_refuses_a_form_it_does_not_have_in_one_line():
    """A mistyped form must not fall through to the bare form's eight GPU runs (device time)."""
    r = subprocess.run(["bash", "benchmarks/alloc_explore.sh", "margin"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "margins OUT" in r.stderr, r.stderr
    assert r.stdout == "", r.stdout   # nothing was run


def test_a_label_fix_is_partial_only_where_gputop_named_the_cause_the_second_fix_removes():
    """The score counts a label's fix as partial (gputop's cause on its fixed job right) where a
    second fix gained >= 10% over it -- but only if the cause gputop named there is the one the
    second fix removes (the manifest's ``second_cause``): an io_stall named on the MLP's fixed job
    would not be made right by a CUDA graph's gain. Nor is a pair measured for a wrong call."""
    import dataclasses

    from benchmarks.corpus_score import second_fixes

    import manifest

    job = next(j for j in manifest.JOBS if j.name == "small_mlp_launch")
    assert job.second_cause == "launch_bound"
    results = {(job.name, v): {"steps_per_s": r} for v, r in (("as_is", 143.2), ("fixed", 364.3), ("second", 953.7))}

    def row(fixed_primary: str, as_is_right: bool = True) -> dict:
        return {"right": as_is_right, "as_is": {"primary": "launch_bound", "gain": 4.11},
                "fixed": {"primary": fixed_primary, "gain": 1.65}}

    rows = {job.name: row("launch_bound")}
    second_fixes([job], [], results, rows)
    assert rows[job.name]["partial_fix"] and [p[2] for p in rows[job.name]["second_pairs"]] == [True, True]
    rows = {job.name: row("io_stall")}
    second_fixes([job], [], results, rows)
    assert not rows[job.name]["partial_fix"] and len(rows[job.name]["second_pairs"]) == 1
    rows = {job.name: row("launch_bound", as_is_right=False)}
    second_fixes([dataclasses.replace(job, second_cause="io_stall")], [], results, rows)
    assert not rows[job.name]["partial_fix"] and rows[job.name]["second_pairs"] == []
    # a second fix that removes more than the cause named as it is (the recommender's: the offload
    # and the copies) measures no pair for that call
    rows = {job.name: row("h2d_copy_bound")}
    rows[job.name]["as_is"]["primary"] = "optimizer_offload"
    second_fixes([dataclasses.replace(job, cause="host_bound", second_cause="h2d_copy_bound")], [], results, rows)
    assert rows[job.name]["partial_fix"] and len(rows[job.name]["second_pairs"]) == 1


def test_the_unseen_corpus_jobs_judged_right_stay_right_with_their_gains(tmp_path):
    """The jobs of the unseen corpus judged right keep their primary, a fixed job that names no
    cause, and a predicted gain within +-30%/5 pt of their fix's (+350% vs +435%, +41% vs +35%,
    +89% vs +106% on 2026-12-07)."""
    rows = {r["job"]: r for r in score(tmp_path, "--set", "unseen1207", str(UNSEEN_RUN))}
    assert set(rows) >= UNSEEN_RIGHT | {"nvidia_smi_in_loop"}, set(rows)
    for name in UNSEEN_RIGHT:
        assert rows[name]["right"], (name, rows[name]["as_is"])
        assert rows[name]["fixed_ok"], (name, rows[name]["fixed"])
        assert rows[name]["gain_ok"], (name, rows[name]["as_is"].get("gain"), rows[name]["measured_gain"])


def test_a_blocking_call_py_spy_saw_without_the_sync_before_it_gets_its_idle():
    """nvidia_smi_in_loop (unseen corpus, H100): the loop runs nvidia-smi right after loss.item()
    every 5 steps, and its fix gained 17%. py-spy caught the main thread in the call in 29 of its
    257 samples of training (11.3%), never in the .item() before it; the budget gives the call's
    wait that much of the GPU's idle (it gave 3.4% when only waits after a sampled sync were
    drained, and the rest of that idle went to the backward passes as CPU code: host_bound, with
    launch advice). No verdict names the CPU code any more."""
    import json
    import subprocess
    import sys
    rec = UNSEEN_RUN / "nvidia_smi_in_loop-as_is.gtrec"
    r = subprocess.run([sys.executable, "-m", "gputop", "report", "--json", str(rec)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    shares = d["budget"]["training"]["shares"]
    assert 0.09 <= shares["blocked"] <= 0.13, shares
    top = d["budget"]["training"]["frames"]["blocked"][0][0]
    assert top.startswith("gpu_stats_smi"), top
    assert abs(sum(shares.values()) - 1.0) < 0.01
    assert (d["primary_verdict"] or {}).get("id") in (None, "loop_blocked"), d["primary_verdict"]


UNSEEN_RUN_B = ROOT / "benchmarks" / "results" / "h100-unseen-1207b" / "corpus-unseen1207"


def test_the_unseen_corpus_second_half_is_judged_right_attached_early_or_late(tmp_path):
    """The unseen corpus's other four jobs (H100, 30 s a variant, eighth session of 2026-12-07):
    three were right at the first look (io_stall, gil_contention, input_bound), the JPEG job once
    its 17.5 s first step warms up. Each names its label attached from the start or 5 s into
    training; the gains of the checkpoint and Trainer jobs are within 30% of their fixes'
    (+272% vs +366%, +508% vs +428%). (The metrics-thread job's is not: +213% vs +413%.)"""
    rows = {r["job"]: r for r in score(tmp_path, "--set", "unseen1207", str(UNSEEN_RUN_B))}
    right = {"accelerate_save_state_often": "io_stall", "tv_jpeg_decode_few_workers": "input_bound",
             "nanogpt_python_metrics_thread": "gil_contention", "trainer_vit_transforms_workers0": "input_bound"}
    for name, cause in right.items():
        r = rows[name]
        assert r["right"] and r["as_is"]["primary"] == cause, (name, r["as_is"])
        assert r["late"]["primary"] == cause, (name, r["late"])
    for name in ("accelerate_save_state_often", "trainer_vit_transforms_workers0"):
        assert rows[name]["gain_ok"], (name, rows[name]["as_is"].get("gain"), rows[name]["measured_gain"])


UNSEEN_RUN_C = ROOT / "benchmarks" / "results" / "h100-unseen-1207c"


def test_the_third_unseen_set_and_the_second_fixes_of_three_fixed_unseen_jobs(tmp_path):
    """The third held-out set (four jobs written blind to the rules, H100, 30 s a variant, ninth
    session of 2026-12-07): the 3D UNet's pageable float32 volumes are h2d_copy_bound (+65% vs
    +63% measured), the Lightning audio job with 2 workers input_bound (+258% vs +257%), the
    healthy Trainer job gpu_bound with and without its habits (0% measured), attached early or
    late; no fixed job names a cause worth 10%. The debug-dump job (io_stall by its label) was
    named sync_stall at the first look; it is io_stall since sync_stall's cost counts only the
    host code that relaunches after a sync, and its gain (+164% against +174%) the steps' excess
    over the median step since the tenth session (the test below).

    Second fixes, written after the host_bound calls on three fixed unseen jobs were read: each
    gained at least 10% over the label's fix (foreach norms +18%, torch.compile +85% and +21%), so
    those calls count as right about a cause the label's fix left."""
    rows = {r["job"]: r for r in score(
        tmp_path, "--set", "unseen1207,unseen1207c", str(UNSEEN_RUN_C / "corpus-unseen1207c"), str(UNSEEN_RUN_B),
        str(UNSEEN_RUN), str(UNSEEN_RUN_C / "corpus-unseen1207"))}
    right = {"unet3d_pageable_volumes": "h2d_copy_bound", "lightning_audio_stft_workers2": "input_bound"}
    dump = rows["timm_debug_dump_every_step"]
    assert dump["right"] and dump["as_is"]["primary"] == "io_stall", dump["as_is"]
    assert dump["gain_ok"], (dump["as_is"].get("gain"), dump["measured_gain"])
    assert dump["late"]["primary"] == "io_stall", dump["late"]
    for name, cause in right.items():
        r = rows[name]
        assert r["right"] and r["as_is"]["primary"] == cause, (name, r["as_is"])
        assert r["late"]["primary"] == cause, (name, r["late"])
        assert r["gain_ok"], (name, r["as_is"].get("gain"), r["measured_gain"])
    healthy = rows["trainer_gpt2_habits_healthy"]
    assert healthy["right"] and healthy["as_is"]["primary"] == "gpu_bound", healthy["as_is"]
    assert abs(healthy["measured_gain"]) < 0.05, healthy["measured_gain"]
    for name in ("timm_debug_dump_every_step", *right, "trainer_gpt2_habits_healthy"):
        assert rows[name]["fixed_ok"], (name, rows[name]["fixed"])
    for name in ("lightning_grad_norm_items", "accelerate_save_state_often", "trainer_vit_transforms_workers0"):
        r = rows[name]
        assert r["fixed"]["primary"] == "host_bound", (name, r["fixed"])
        assert r["partial_fix"], (name, r["rates"])


def test_a_cost_on_some_steps_only_is_the_steps_excess_over_the_median_step():
    """io_stall's cost is the larger of the budget's file-I/O share and the steps' time over the
    median step (verdicts/causal.py SLOW_STEPS). The debug dump writes every 5th step; its budget
    holds 24% in file I/O, while the copies before the writes and the relaunch after them leave the
    GPU idle too: its steps' mean is 2.8x their median, and its fix measured +174%. A Trainer's
    checkpoints every N steps keep their budget figure, the larger there (within 30% of +96%)."""
    from gputop.derive.steps import EXCESS_MIN_STEPS, StepPool
    from gputop.report import build_report

    rep = build_report(str(UNSEEN_RUN_C / "corpus-unseen1207c" / "timm_debug_dump_every_step-as_is.gtrec"))
    p, rank = rep["primary_verdict"], rep["probe"]["ranks"][0]
    sm = rank["step_ms"]
    assert rank["slow_step_excess"] == pytest.approx(1 - sm["p50"] / sm["mean"], abs=1e-3)
    # the excess (64%) is over the GPU's idle share (62%): the idle share sets the gain, and says so
    assert p["id"] == "io_stall" and p["gain_from"] == "idle", p
    idle = 1 - rep["budget"]["training"]["shares"]["gpu_busy"]
    assert rank["slow_step_excess"] > idle > rep["budget"]["training"]["shares"]["io"]
    # never above the GPU's idle share: 1 / (1 - idle) - 1
    assert p["gain_pct"] == pytest.approx(100 * idle / (1 - idle), abs=0.5)
    assert abs(p["gain_pct"] - 174) <= 0.3 * 174, p["gain_pct"]
    assert p["gain_pct"] == rep["verdicts"]["io_stall"]["evidence"]["fix_gain_pct"]
    assert p["gain_steps_ms"] == {"mean": sm["mean"], "p50": sm["p50"]}
    words = f"the GPU's idle share, under the steps' time over the median step: mean step {sm['mean']:.0f} ms"
    assert words in subprocess.run(
        [sys.executable, "-m", "gputop", "report", str(UNSEEN_RUN_C / "corpus-unseen1207c"
                                                       / "timm_debug_dump_every_step-as_is.gtrec")],
        capture_output=True, text=True, cwd=ROOT).stdout
    rep = build_report(str(RUN / "corpus" / "trainer_save_steps-as_is.gtrec"))
    p, rank = rep["primary_verdict"], rep["probe"]["ranks"][0]
    assert p["id"] == "io_stall" and p["gain_from"] == "budget", p
    assert rank["slow_step_excess"] < rep["budget"]["training"]["shares"]["io"]
    assert abs(p["gain_pct"] - 96) <= 0.3 * 96, p["gain_pct"]
    assert StepPool(timed_steps=EXCESS_MIN_STEPS - 1, step_s_sum=1.0, step_hist={100: 9}).slow_step_excess is None


def test_only_the_host_code_after_a_sync_is_the_syncs_cost():
    """sync_stall's cost is the GPU idle while the loop waits on a sync or relaunches after it:
    the budget's ``cpu_after_sync`` counts the host code that follows a sync with only Python
    code between (the samples' order). In the debug dump (.cpu() of its tensors, then 260 MB
    written with fsync every 5 steps) the backward passes between dumps follow the file writes,
    not a sync: 5% of the time of its 21% host code. In a Lightning GPT whose hook .item()s 196
    grad norms a step nearly all host code follows a sync: the marking keeps a sync's relaunch
    (the whole cpu share was counted before, so only the dump's bound can tell the change)."""
    import json
    import subprocess
    import sys
    runs = {UNSEEN_RUN_C / "corpus-unseen1207c" / "timm_debug_dump_every_step-as_is.gtrec": (0.0, 0.3),
            UNSEEN_RUN_B / "lightning_grad_norm_items-as_is.gtrec": (0.8, 1.0)}
    for rec, (lo, hi) in runs.items():
        r = subprocess.run([sys.executable, "-m", "gputop", "report", "--json", str(rec)], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        b = json.loads(r.stdout)["budget"]["training"]
        cpu, after = b["shares"]["cpu"], b["cpu_after_sync"]
        assert cpu > 0.15 and lo <= after / cpu <= hi, (rec.name, cpu, after)
