"""The stall detector's idle test never calls a job that steps stalled: real H200 recordings
judged with the idle test made short (3 s, so that it would fire on any stretch of waiting
samples) — a GIL-bound and an input-bound loop, whose main threads wait in stretch after
stretch of py-spy samples while the probe counts their steps, are never idle-stalled; the
recording with real stops (a sleep and a lock) still is, during the stops."""

from __future__ import annotations

import os

from gputop.catalogue import KIND_STALL
from gputop.derive.budget_processor import BudgetProcessor
from gputop.derive.stall import STEP_SLACK_S, StallDetector
from gputop.derive.threads import ThreadStateProcessor
from gputop.session.whole_replay import replay_whole

DATA = os.path.join(os.path.dirname(__file__), "data", "h200")


class _StacksOnly(StallDetector):
    """The detector as the agent runs it on a job without the probe: steps only from the stacks
    (the recording's probe windows left unread)."""

    def _probe_steps(self, store, pid, now):
        return False


def _idle(name: str, detector=StallDetector) -> list:
    got = replay_whole(os.path.join(DATA, name), [ThreadStateProcessor(), BudgetProcessor(),
                                                  detector(min_s=1000.0, idle_s=3.0)], [KIND_STALL])
    states = got.of_kind(KIND_STALL)
    assert states and any(s.get("last_step_t") is not None for s in states), "a file with steps"
    return [s for s in states if s.get("stalled") and s.get("reason") == "idle"]


def test_a_job_that_steps_is_not_idle_stalled():
    for name in ("gil_contention.gtrec", "input_bound.gtrec"):
        assert _idle(name) == [], name


def test_a_loop_waiting_for_busy_dataloader_workers_is_not_idle_stalled_without_the_probe():
    """Without the probe (the agent), steps come from the samples that land in a backward pass:
    in the input-bound loop most land in the DataLoader wait, and 3 s of them (30 s at the
    agent's 2 a second) was once called a stop; its two workers were 97% busy all along."""
    assert _idle("input_bound.gtrec", _StacksOnly) == []
    # the stops are still stops without the probe
    assert len(_idle("issue15/stall_sleep_lock.gtrec", _StacksOnly)) >= 10


def test_real_stops_are_still_idle_stalled():
    idle = _idle("issue15/stall_sleep_lock.gtrec")
    assert len(idle) >= 10
    # each during a stop: no step after the stretch began (beyond a probe window's lag)
    assert all(s.get("last_step_t") <= s.get("idle_since") + STEP_SLACK_S for s in idle)


def _no_step(name: str, detector=StallDetector, min_s: float = 1.5) -> list:
    got = replay_whole(os.path.join(DATA, name), [ThreadStateProcessor(), BudgetProcessor(),
                                                  detector(min_s=min_s, factor=1.0, idle_s=1000.0)], [KIND_STALL])
    return [s for s in got.of_kind(KIND_STALL) if s.get("stalled") and s.get("reason") == "no_step"]


def test_the_step_test_from_stacks_makes_the_same_allowance_for_busy_dataloader_workers():
    """Steps from the stacks are the samples in a backward pass: in the input-bound loop most
    land in the DataLoader wait, so the gaps between them outgrow a short threshold (the full
    suite's agent test once called that job stalled, no_step, beside a loaded box). While the
    loop waits for data and the workers are busy, the step test does not fire; a stop that is no
    data wait (a sleep, a lock) still does."""
    assert _no_step("input_bound.gtrec", _StacksOnly) == []
    assert len(_no_step("issue15/stall_sleep_lock.gtrec", _StacksOnly)) >= 10


def test_the_allowance_for_busy_workers_has_an_end(monkeypatch):
    """A worker spinning forever in __getitem__ is busy too: the allowance lasts LOADING_MAX_S (5
    min) at most, then the no-step test fires. The same replay with the limit at 3 s: the input-bound
    loop's longer gaps between backward samples are then called stalled."""
    import gputop.derive.stall as stall

    monkeypatch.setattr(stall, "LOADING_MAX_S", 3.0)
    assert len(_no_step("input_bound.gtrec", _StacksOnly)) >= 3
