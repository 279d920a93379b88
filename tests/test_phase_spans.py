"""A long py-spy window (the stack source's steady 5 s ones, the agent's 20 s) is judged by the
phase tracker in spans of ~PHASE_SPAN_MOMENTS moments, as the 2 s windows its shares were set
on: on the real moments of an H200 loop that checkpoints (torch.save) every few seconds."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from gputop.derive import budget_processor as bp
from gputop.derive import frame_rules as fr
from gputop.derive import phases as ph
from gputop.derive.budget_processor import BudgetProcessor, judged_process
from gputop.derive.moments import MomentBuilder
from gputop.session.replay import ReplaySession

REAL = pathlib.Path(__file__).resolve().parent / "data" / "h200" / "real"


@pytest.fixture(scope="module")
def moments():
    s = ReplaySession(str(REAL / "checkpoint_stall-pid.gtrec"), processors=[], start_playing=False, seek_window_s=0.0)
    try:
        s.play_to(s.t_end)
        pid, _ = judged_process(s.store, s.t_end)
        ms, _ = MomentBuilder().moments(s.store, pid, s.t_start, s.t_end, ["0"])
    finally:
        s.stop()
    return ms


@pytest.fixture(autouse=True)
def _no_warmup(monkeypatch):
    """These tests are about how windows are cut into spans: the warm-up that follows the
    start-up (tests/test_warmup.py) would hold the phase for its first seconds."""
    monkeypatch.setattr(ph, "WARMUP_MAX_S", 0.0)


def _seconds_by_phase(proc: BudgetProcessor) -> dict[str, float]:
    return {p: round(b.total_s, 6) for p, b in proc.session.items()}


# the start-up ends (training frames) at moment 174; the first checkpoint holds moments 246-292,
# the second starts at 379: the stretch holds one checkpoint and training around it
START, END = 180, 379


def _judged(ms, windows_of: int) -> BudgetProcessor:
    """The moments before the stretch as 40-moment windows (2 s at 20 Hz), then the stretch in
    windows of ``windows_of`` moments."""
    proc = BudgetProcessor()
    for i in range(0, START, 40):
        w = ms[i:min(i + 40, START)]
        proc._judge_moments(w, w[-1].t + w[-1].dt / 2, [])
    assert proc.tracker.phase in ph.JUDGED, "training by then"
    for i in range(START, END, windows_of):
        w = ms[i:min(i + windows_of, END)]
        proc._judge_moments(w, w[-1].t + w[-1].dt / 2, [])
    return proc


def test_a_long_window_holding_one_checkpoint_is_judged_like_2s_windows(moments, monkeypatch):
    stretch = moments[START:END]
    ckpt = sum(m.naming.hint == fr.CHECKPOINT for m in stretch)
    # one real checkpoint (~2.3 s), under 25% of the whole stretch (a ~10 s window at 20 Hz)
    assert 40 <= ckpt < ph.CHECKPOINT_SHARE * len(stretch)
    short = _judged(moments, 40)     # as 2 s windows
    long = _judged(moments, END - START)     # as one ~10 s window: judged in spans of ~50
    for proc in (short, long):
        assert ph.CHECKPOINTING in proc.session
        assert proc.tracker.phase == ph.TRAINING   # training again after it
    got, want = _seconds_by_phase(long), _seconds_by_phase(short)
    assert set(got) == set(want)
    # the same checkpoint, to within the spans' coarser edges (a 2 s window's worth)
    assert abs(got[ph.CHECKPOINTING] - want[ph.CHECKPOINTING]) <= 2.0, (got, want)
    # judged whole, as before the spans, the checkpoint vanished into training
    monkeypatch.setattr(bp, "PHASE_SPAN_MOMENTS", 10 ** 6)
    whole = _judged(moments, END - START)
    assert ph.CHECKPOINTING not in whole.session


def test_a_window_of_about_40_moments_is_one_span(moments):
    """The UI's first 2 s windows and the agent's 20 s ones (~40 moments) are judged whole."""
    proc = BudgetProcessor()
    calls = []
    proc._judge_span = lambda ms, t0, t1, steps, readings, *more: calls.append(len(ms)) or False
    proc._judge_moments(moments[:79], moments[78].t, [])
    proc._judge_moments(moments[100:180], moments[179].t, [])
    assert calls == [79, 40, 40]


def test_a_calm_window_is_judged_in_spans_of_the_same_time(moments):
    """Windows sampled at the calm rate (gputop/sources/calm.py: half the moments in the same
    time, each twice as long) are cut into spans as long as a full-rate window's: the real loop
    of three checkpoints, judged in 5 s windows, gets the same phases and seconds as at 20 Hz.
    Cut by the full rate's count (a calm 5 s window judged whole), they came out different."""
    half = [dataclasses.replace(m, dt=m.dt * 2) for m in moments[::2]]

    def judged(ms, per_s: int, span_moments: int):
        proc = BudgetProcessor()
        two_s, start = 2 * per_s, 9 * per_s          # start-up as 2 s windows, then 5 s ones
        for i in range(0, start, two_s):
            w = ms[i:min(i + two_s, start)]
            proc._judge_moments(w, w[-1].t + w[-1].dt / 2, [], span_moments)
        for i in range(start, len(ms), 5 * per_s):
            w = ms[i:i + 5 * per_s]
            proc._judge_moments(w, w[-1].t + w[-1].dt / 2, [], span_moments)
        return _seconds_by_phase(proc), proc.tracker.changes

    full = judged(moments, 20, bp.PHASE_SPAN_MOMENTS)
    assert full[0][ph.CHECKPOINTING] > 5 and len(full[1]) >= 7, full
    calm = judged(half, 10, bp.PHASE_SPAN_MOMENTS // 2)
    # (to one calm moment, 0.1 s: a phase's edge falls on a moment the calm rate did not take)
    assert calm[0] == pytest.approx(full[0], abs=0.1) and [p for _, p in calm[1]] == [p for _, p in full[1]]
    unweighted = judged(half, 10, bp.PHASE_SPAN_MOMENTS)
    assert [p for _, p in unweighted[1]] != [p for _, p in full[1]], "the bug the weight fixes"


def test_a_calm_windows_weight_is_its_calm_factor_and_nothing_else():
    from gputop.derive.thread_samples import window_weight

    assert window_weight({"calm_factor": 2}) == 2
    for bad in (None, 0, -2, 2.0, True, "2", 10 ** 6):
        assert window_weight({"calm_factor": bad}) == 1, bad
    assert window_weight({}) == 1
