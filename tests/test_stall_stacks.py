"""The stall detector without the probe: the steps are the backward passes and optimizer steps
py-spy sees on the main thread (frame_rules' training hint). A real CPU job sleeps in a function
for a while: the detector says stalled (reason: no step), the snapshot names the line, and it
stops saying so once the stacks show steps again; then the
same recording, judged again with the step test out of reach, is stalled by the idle test (the
main thread off the CPU, no GPU) during the sleep and not while it trains.
"""

from __future__ import annotations

import pytest

from gputop.catalogue import KIND_STACKS, KIND_STALL, KIND_STALL_SNAPSHOT
from gputop.derive.budget_processor import BudgetProcessor
from gputop.derive.stall import StallDetector, describe_snapshot
from gputop.derive.threads import ThreadStateProcessor
from gputop.session.whole_replay import replay_whole
from stall_helpers import marker_line, of_kind, scene, stall_job

STACK_MIN_S = 4.0   # py-spy windows (2 s) arrive after they end: the floor leaves room for that
# From stacks a "step" is the gap between runs of training samples, which py-spy's ~20 Hz cannot
# resolve for this job's ~5 ms steps (the estimate wanders 0.15-0.6 s on a loaded machine): a
# smaller factor than the default 20 keeps the threshold at the floor, so the test stays short
STACK_FACTOR = 5.0


STALL_JOBS = {"stacks": {"args": ["--scenes", "sleep", "--stall-s", "10", "--train-s", "7", "--step-ms", "0"],
                         "probe": False, "min_s": STACK_MIN_S, "factor": STACK_FACTOR},
              # a hung input pipeline: the main thread waits in next() on a DataLoader whose two
              # workers sleep in __getitem__; the idle test alone (the step test out of reach)
              "loader": {"args": ["--scenes", "loader", "--stall-s", "10", "--train-s", "6", "--step-ms", "0"],
                         "probe": False, "min_s": 1000.0, "idle_s": 3.0}}


@pytest.fixture(scope="module")
def job(request, tmp_path_factory):
    return stall_job(request, tmp_path_factory, "stacks")   # started beside the other stall jobs


def test_stack_steps_name_the_stop_stalled_and_clear(job):
    start, end = scene(job, "sleep")
    states = of_kind(job["samples"], KIND_STALL, "job")
    training = [s for s in states if start - 4.0 <= s.t <= start]
    assert training and not any(s.get("stalled") for s in training)
    # steps from the stacks, seen before the stop (on a loaded machine py-spy's first window can
    # land late in the 7 s of training, so the first seconds may not have one yet)
    assert training[-1].get("last_step_t") is not None, training[-1]
    assert training[-1].get("last_step_t") >= start - 7.5, training[-1]   # a step of this training
    on = [s for s in states if s.get("stalled") and start <= s.t <= end]
    assert on and on[0].get("reason") == "no_step", on[:1]
    # judged on the stacks' clock (derive/stall.py): seen when the first window that ends past
    # the threshold lands, up to a window (2 s), py-spy's start and a tick (1 s) after it
    assert on[0].get("threshold_s") >= STACK_MIN_S and on[0].t - start <= on[0].get("threshold_s") + 5.0, (on[0], start)
    # ... and never before the stacks themselves have gone a threshold without a step: each
    # "no step" is backed by a window that ended that long after the last step (on the clock
    # of now, a stop would be called while the window that shows the next step is on its way)
    windows = sorted(s.t for s in of_kind(job["samples"], KIND_STACKS) if s.get("main"))
    for s in (s for s in states if s.get("stalled") and s.get("reason") == "no_step"):
        seen = max(t for t in windows if t <= s.t)
        assert seen - s.get("last_step_t") >= s.get("threshold_s") - 0.02, (s.t, seen, s.data)
    # steps seen again: py-spy's windows (2 s) arrive after they end, so a few seconds late
    after = [s for s in states if end + 6.0 <= s.t <= end + 8.0]
    assert after and not any(s.get("stalled") for s in after)
    (shot,) = [s for s in of_kind(job["samples"], KIND_STALL_SNAPSHOT) if start <= s.t <= end]
    (r,) = describe_snapshot(shot.data)["ranks"]
    assert r["where"] == f"stuck_in_sleep (stall_train.py:{marker_line('STALL-SLEEP')})"


def test_the_idle_test_alone_finds_the_same_stop(job):
    start, end = scene(job, "sleep")
    got = replay_whole(str(job["recording"]), [ThreadStateProcessor(), BudgetProcessor(),
                                               StallDetector(min_s=1000.0, idle_s=3.0)], [KIND_STALL])
    states = got.of_kind(KIND_STALL)
    idle = [s for s in states if s.get("stalled")]
    assert idle and all(s.get("reason") == "idle" for s in idle)
    # (thread states are judged over py-spy's 2 s windows, which arrive after they end)
    assert all(start <= s.t <= end + 6.0 for s in idle), ([s.t for s in idle], start, end)
    assert idle[0].t - start <= 3.0 + 2.0 + 3.0   # idle_s, a thread-state window, slack


def test_a_hung_dataloader_whose_workers_sleep_is_idle_stalled_at_next(request, tmp_path_factory):
    """A wait for the DataLoader is progress while its workers are busy on the CPU (the agent's
    few samples can all land in it: derive/stall.py; tests/test_stall_idle.py replays such a job),
    and a stop when they are idle: the main thread waits in next() for a batch its sleeping
    workers never make, and the idle test names it, during the hang only."""
    job = stall_job(request, tmp_path_factory, "loader")
    start, end = scene(job, "loader")
    states = of_kind(job["samples"], KIND_STALL, "job")
    on = [s for s in states if s.get("stalled")]
    assert on and all(s.get("reason") == "idle" for s in on), on[:2]
    assert all(start <= s.t <= end + 6.0 for s in on), ([s.t for s in on], start, end)
    assert on[0].t - start <= 3.0 + 2.0 + 4.0, (on[0].t, start)   # idle_s, a py-spy window, slack
    (shot,) = [s for s in of_kind(job["samples"], KIND_STALL_SNAPSHOT) if start <= s.t <= end + 6.0]
    (r,) = describe_snapshot(shot.data)["ranks"]
    assert f"stall_train.py:{marker_line('STALL-NEXT')}" in (r["where"] or ""), r
