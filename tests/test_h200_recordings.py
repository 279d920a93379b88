"""What real H200 sessions say about the probe and about ranks (recordings from benchmarks/h200.sh)."""

from __future__ import annotations

import pathlib

from gputop.report import build_report
from gputop.session.store import CallbackSubscriber
from gputop.session.replay import ReplaySession
from gputop.verdicts import default_processors

H200 = pathlib.Path(__file__).resolve().parent / "data" / "h200"


def test_probe_counts_two_syncs_per_step_at_their_lines_on_cuda():
    """benchmarks/probe_accuracy.py's "syncs" job: loss.item() and a nonzero() every step."""
    rank = build_report(str(H200 / "probe" / "probe_syncs_cuda.gtrec"))["probe"]["ranks"][0]
    assert rank["syncs_per_step"] == 2.0
    lines = [line for line, _ in rank["sync_lines"]]
    assert any(line.endswith("probe_accuracy.py:116") for line in lines)  # loss.item()
    assert any(line.endswith("probe_accuracy.py:118") for line in lines)  # torch.nonzero
    assert rank["gpu_steps_timed"] == rank["steps"]                        # CUDA events read for every step
    assert rank["memory"]["peak_allocated_bytes"] > 0
    assert rank["config"]["device_name"] == "NVIDIA H200"


def test_input_bound_probe_on_cuda_splits_the_step():
    rank = build_report(str(H200 / "probe" / "probe_input_bound_cuda.gtrec"))["probe"]["ranks"][0]
    assert rank["data_wait_share"] > 0.5
    assert 0 < rank["gpu_ms_per_step"] < rank["step_ms"]["mean"]


def test_a_data_wait_the_gpu_overlaps_is_a_note_not_input_bound():
    """benchmarks/probe_accuracy.py's "gpu_bound" job on the H200 waits 30% of each step for its
    batch, but its GPU span (3.3 ms) covers the step (3.1 ms): the GPU never waits for the data.
    The probe timed no idle, so input_bound costs nothing: a note "not on the critical path", no
    verdict (it was primary at +42% before its cost was the probe's timed idle). The input-bound
    job of the same benchmark keeps its verdict, with the probe's idle as its cost."""
    from gputop.session.whole_replay import replay_whole
    from gputop.verdicts import default_processors

    rep = build_report(str(H200 / "probe" / "probe_gpu_bound_cuda.gtrec"))
    rank = rep["probe"]["ranks"][0]
    assert rank["data_wait_share"] > 0.2 and rank["gpu_ms_per_step"] >= rank["step_ms"]["mean"]
    assert rep["primary_verdict"] is None or rep["primary_verdict"].get("id") != "input_bound", rep["primary_verdict"]
    out = replay_whole(str(H200 / "probe" / "probe_gpu_bound_cuda.gtrec"), default_processors(),
                       kinds={"verdict_primary"})
    notes = [n for s in out.samples for n in (s.get("notes") or [])]
    assert any(n["id"] == "input_bound" and "not on the critical path" in n["text"] for n in notes), notes[:3]
    other = build_report(str(H200 / "probe" / "probe_input_bound_cuda.gtrec"))
    assert other["primary_verdict"]["id"] == "input_bound"
    rk = other["probe"]["ranks"][0]
    idle = rk["data_idle_share"]   # the report's figure: min(data wait, 1 - GPU span) of the step
    assert idle == round(min(rk["data_wait_share"], 1 - rk["gpu_ms_per_step"] / rk["step_ms"]["mean"]), 2) or \
        abs(idle - min(rk["data_wait_share"], 1 - rk["gpu_ms_per_step"] / rk["step_ms"]["mean"])) < 0.01
    assert abs(other["verdicts"]["input_bound"]["evidence"]["fix_gain_pct"] / 100 - idle / (1 - idle)) < 0.35


def test_two_ranks_on_one_h200_are_found_with_their_gpu():
    rep = build_report(str(H200 / "ranks.gtrec"))
    ranks = rep["ranks"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2 and r["gpu"] == "0" and r["gpu_from"] == "nvml"
        assert r["sm_active_mean"] > 5 and r["steps_per_s"] > 1


def test_the_h200_straggler_job_names_rank_1():
    """Rank 1 sleeps 30 ms a step before its all_reduce; rank 0 waits for it."""
    session = ReplaySession(str(H200 / "ranks.gtrec"), processors=default_processors(), start_playing=False,
                            seek_window_s=0.0)
    got: list = []
    session.bus.subscribe(CallbackSubscriber(got.extend))
    session.play_to(session.t_end)
    session.stop()
    named = {s.get("evidence")["straggler"] for s in got
             if s.kind == "verdict" and s.key == "straggler_rank" and s.get("active")}
    assert named == {1}
