"""py-spy's windows lengthen after the warm-up (gputop/sources/stacks.py: STEADY_WINDOW_S), on a
real process with the real py-spy, and the lengthened windows still fit the processors' windows."""

from __future__ import annotations

import pytest

from gputop.agent.job import BUDGET_STACKS_S, THREADS_SLACK_S, widen_windows
from gputop.catalogue import KIND_PHASE
from gputop.model import KIND_HEALTH, Sample
from gputop.sources import stacks
from gputop.sources.stacks import KIND_STACKS, StackSource
from gputop.sources.target import Target
from gputop.verdicts import default_processors

from stacks_helpers import WORKER_PARENT, Clock, Proc, wait_for, workload

pytestmark = pytest.mark.timeout(60)


def test_windows_lengthen_after_the_warm_up_and_health_says_so():
    p = Proc(workload("stacks_gil.py", "--spinners", "1", "--sleeper"))
    try:
        p.first()
        src = StackSource(Clock(), Target(p.pid), rate_hz=20, window_s=1, steady_window_s=3, warm_s=3.0)
        got: list = []
        src.start(got.append)
        try:
            assert wait_for(lambda: sum(s.kind == KIND_STACKS and s.data["dur_s"] > 2.2 for s in got) >= 2, 30)
        finally:
            src.stop()
    finally:
        p.kill()
    durs = [s.data["dur_s"] for s in got if s.kind == KIND_STACKS]
    first_long = next(i for i, d in enumerate(durs) if d > 2.2)
    # the warm-up's windows are short (3 s of 1 s windows), then every window is the steady one
    assert first_long >= 2 and all(d < 1.6 for d in durs[:first_long]), durs
    assert all(2.2 < d < 3.6 for d in durs[first_long:]), durs
    said = [s.data["window_s"] for s in got if s.kind == KIND_HEALTH and s.key == "stacks"
            and s.data.get("window_s") is not None]
    assert said[0] == 1 and said[-1] == 3, "health says the window in flight (the stall detector reads it)"
    assert src.describe()["window_s"] == 1 and src.describe()["steady_window_s"] == 3


def test_where_phases_are_judged_the_warm_up_lasts_until_the_job_has_trained_a_while():
    """A job still in start-up after ``warm_s`` keeps the short windows (its first training
    seconds are what the first verdict is made of); they lengthen ``warm_s`` after its first
    training step, as the budget processor's phase samples tell it (heard on the session's bus)."""
    p = Proc(workload("stacks_gil.py", "--spinners", "1", "--sleeper"))
    clock = Clock()
    try:
        p.first()
        src = StackSource(clock, Target(p.pid), rate_hz=20, window_s=1, steady_window_s=3, warm_s=2.0)
        got: list = []
        src.start(got.append)

        def phase(training_since):
            src.on_samples([Sample(clock.now(), KIND_PHASE, "main",
                                   {"phase": "startup" if training_since is None else "training",
                                    "training_since": training_since})])
        try:
            phase(None)
            assert wait_for(lambda: sum(s.kind == KIND_STACKS for s in got) >= 5, 30)
            trained_at = clock.now()
            phase(trained_at)
            phase(trained_at + 5.0)   # a later judged stretch: the first one counts
            assert wait_for(lambda: sum(s.kind == KIND_STACKS and s.data["dur_s"] > 2.2 for s in got) >= 2, 30)
        finally:
            src.stop()
    finally:
        p.kill()
    wins = [s.data for s in got if s.kind == KIND_STACKS]
    short = [w for w in wins if w["t0"] < trained_at]
    assert len(short) >= 4 and all(w["dur_s"] < 1.6 for w in short), "start-up past warm_s: short windows"
    first_long = next(w for w in wins if w["dur_s"] > 2.2)
    # the first long window starts warm_s after training began (at a window's end), not before;
    # how soon after depends on py-spy's start and exit on a loaded box (the exact rule is
    # checked with a clock of the test's own below)
    # (a window's t0 is its predecessor's end, stamped before the source decides at that end; on
    # a box busier than its cores the two were 0.22 s apart: half a second of slack)
    assert first_long["t0"] >= trained_at + 2.0 - 0.5, (trained_at, wins)
    assert first_long["t0"] <= trained_at + 2.0 + 2 * (1 + 1.5), (trained_at, wins)


def test_without_phases_the_warm_up_is_warm_s_after_the_first_window():
    """A source whose session judges no phases (no phase sample heard) lengthens its windows
    ``warm_s`` after the first one, as before; one whose job never trains, after MAX_WARM_S."""
    src = StackSource(Clock(), Target(1), window_s=1, steady_window_s=3, warm_s=2.0)
    src._first_spawn = 100.0
    assert src._warm(101.0) and not src._warm(102.5)
    src = StackSource(Clock(), Target(1), window_s=1, steady_window_s=3, warm_s=2.0)
    src._first_spawn = 100.0
    src.on_samples([Sample(0.0, KIND_PHASE, "main", {"phase": "startup", "training_since": None})])
    assert src._warm(102.5) and src._warm(100.0 + stacks.MAX_WARM_S - 1)
    assert not src._warm(100.0 + stacks.MAX_WARM_S) and not src._warm(102.5), "once over, over"


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def test_the_warm_up_ends_warm_s_after_the_first_judged_stretch_began():
    clock = _Clock(50.0)
    src = StackSource(clock, Target(1), window_s=1, steady_window_s=3, warm_s=2.0)
    src._first_spawn = 100.0
    src.on_samples([Sample(50.0, KIND_PHASE, "main", {"phase": "startup", "training_since": None})])
    src.on_samples([Sample(60.0, KIND_PHASE, "main", {"phase": "training", "training_since": 59.5})])
    src.on_samples([Sample(70.0, KIND_PHASE, "main", {"phase": "training", "training_since": 69.0})])
    clock.t = 61.4
    assert src._warm(111.0), "1.9 s of training"
    clock.t = 61.6
    assert not src._warm(111.2), "2.1 s after the first judged stretch began (a later one does not count)"


def test_a_longer_first_window_is_never_shortened():
    """The agent's 20 s windows stay 20 s: the steady window is the longer of the two."""
    src = StackSource(Clock(), Target(1), window_s=20)
    assert src.steady_window_s == 20 and src.first_window_s == 20


def test_the_steady_window_fits_the_interactive_processors():
    """The budget's window holds >= BUDGET_STACKS_S of stacks and a thread state's horizon one
    whole window and its fold at the steady window too: the agent's rule (widen_windows) changes
    none of the UI's processors."""
    for p in default_processors():
        before = (getattr(p, "window_s", None), getattr(p, "horizon_s", None))
        widen_windows(p, stacks.STEADY_WINDOW_S, p.interval_s)
        assert (getattr(p, "window_s", None), getattr(p, "horizon_s", None)) == before, p.name
    names = {p.name for p in default_processors()}
    assert {"budget", "threads"} <= names
    assert stacks.STEADY_WINDOW_S + BUDGET_STACKS_S <= 20 and stacks.STEADY_WINDOW_S + THREADS_SLACK_S <= 10


def test_workers_keep_their_short_windows_every_few_seconds_after_the_warm_up():
    """DataLoader workers are sampled in a first-length window every subprocess_every such
    windows' time, however long the main process's windows have grown: the thread states'
    horizon always holds one of theirs."""
    p = Proc(["-c", WORKER_PARENT])
    try:
        child = p.first()["child"]
        src = StackSource(Clock(), Target(p.pid), rate_hz=20, window_s=1, steady_window_s=3, warm_s=2.0,
                          subprocess_every=5)
        got: list = []
        src.start(got.append)
        try:
            def long_windows():
                return [s.t for s in got if s.kind == KIND_STACKS and s.key == str(p.pid) and s.data["dur_s"] > 2.2]

            def child_windows():
                return [s.t for s in got if s.kind == KIND_STACKS and s.key == str(child)]
            assert wait_for(lambda: len(long_windows()) >= 3, 40)
            # and four of the children's windows after the first long one: three gaps to judge the cadence by
            assert wait_for(lambda: sum(t >= long_windows()[0] - 1.0 for t in child_windows()) >= 4, 40)
        finally:
            src.stop()
    finally:
        p.kill()
    main = [s for s in got if s.kind == KIND_STACKS and s.key == str(p.pid)]
    first_long = next(i for i, s in enumerate(main) if s.data["dur_s"] > 2.2)
    after = main[first_long:]
    subs = [s for s in after if s.data["subprocesses"]]
    assert subs and all(s.data["dur_s"] < 1.6 for s in subs), "children's windows stay short"
    # the rest are steady ones, or cut short so that the children's next window starts on time:
    # never longer than a steady window (a cut one may end anywhere before: how long it ran
    # depends on the machine's load, which the children's cadence below does not)
    assert all(s.data["dur_s"] <= 3.0 + 1.0 for s in after if not s.data["subprocesses"])
    child_t = [s.t for s in got if s.kind == KIND_STACKS and s.key == str(child)]
    later = [t for t in child_t if t >= after[0].t - 1.0]
    # one every 5 first-length windows' time (5 s), as in the warm-up; without the cut, every
    # 1 + 3 + 3 s (a whole steady window late). By the median of three gaps: on CI's loaded 2-core
    # box beside the suite one window started 1.6 s late once (a 6.6 s gap), where the bug makes
    # every gap ~7 s
    gaps = sorted(b - a for a, b in zip(later, later[1:]))
    assert len(gaps) >= 3 and gaps[len(gaps) // 2] <= 5 + 1.0 and gaps[-1] <= 5 + 3.0, (child_t, gaps)


def test_a_live_session_tells_the_stack_source_the_jobs_phase():
    """The link the warm-up rule depends on: LiveSession subscribes the source to its bus, where
    the budget processor publishes the phase."""
    from gputop.session.session import LiveSession, SessionClock

    clock = SessionClock()
    src = StackSource(clock, Target(1), window_s=1, steady_window_s=3, warm_s=2.0)
    session = LiveSession([src], clock, {})
    session.bus.publish_many([Sample(3.0, KIND_PHASE, "main", {"phase": "training", "training_since": 2.5})])
    assert src._phases_heard and src._training_since == 2.5
