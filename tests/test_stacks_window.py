"""The windows that must hold one py-spy window in flight (gputop/derive/stacks_window.py).

While calm, py-spy's windows are 20 s long (sources/calm.py: CALM_WINDOW_S) and their samples
arrive when a window ends, so just before the next one lands the newest stacks are 20 s old plus
the fold. The thread states' 10 s horizon would then hold no stacks at all and the threads
would lose their frames every other second; the horizon widens with the window the stacks
source's health says is in flight. Shown on a real py-spy window of an H200 HF Trainer job.
"""

from __future__ import annotations

import pathlib

import pytest

from gputop.catalogue import KIND_BUDGET, KIND_STACKS, SOURCE_STACKS
from gputop.derive.stacks_window import (BUDGET_STACKS_S, CALM_STRETCH, NO_HEALTH_WINDOW_S, THREADS_SLACK_S,
                                         budget_since, budget_window_s, stacks_window_s, threads_horizon_s,
                                         threads_since, works_now)
from gputop.derive.budget_processor import BudgetProcessor
from gputop.derive.threads import DEFAULT_HORIZON_S, KIND_THREAD_STATE, ThreadStateProcessor
from gputop.model import KIND_HEALTH, Sample, health_data
from gputop.session.recording_reader import RecordingReader
from gputop.session.store import SampleStore
from gputop.sources.calm import CALM_WINDOW_S

ROOT = pathlib.Path(__file__).resolve().parent.parent
HF = ROOT / "tests" / "data" / "h200" / "calm" / "hf_trainer-pid.gtrec"


def _one_window() -> Sample:
    with RecordingReader(str(HF)) as r:
        wins = [s for s in r.samples() if s.kind == KIND_STACKS and s.data.get("main")]
    return wins[len(wins) // 2]


def _health(t: float, window_s) -> Sample:
    return Sample(t, KIND_HEALTH, SOURCE_STACKS, health_data("ok", "", window_s=window_s))


def _thread_states(window_s: float, age_s: float) -> dict:
    """The processor's thread states ``age_s`` after the window's sample arrived, with the
    stacks source's health saying ``window_s`` is in flight."""
    win = _one_window()
    store = SampleStore()
    store.on_samples([win, _health(win.t + 0.1, window_s)])
    out = ThreadStateProcessor().process(store, win.t + age_s)
    return {s.key: s.data for s in out if s.kind == KIND_THREAD_STATE}


def test_a_calm_window_is_held_until_the_next_one_lands():
    # the next calm window lands ~CALM_WINDOW_S after this one, plus the fold and a derive tick
    age = CALM_WINDOW_S + 3.0
    calm = _thread_states(CALM_WINDOW_S, age)
    assert calm, "the thread states lost the calm window before the next one could land"
    main = [d for d in calm.values() if d.get("role") == "main"]
    assert main and main[0]["samples"] > 0 and main[0]["where"], main
    # the same age with 5 s windows in flight: past the horizon (the old rule), nothing is held
    assert not _thread_states(5, age)


def test_a_late_window_is_still_held_by_the_thread_states():
    """With 5 s windows in flight the horizon is 10 s; looked at 13 s after the newest window ended
    (the next one 8 s late, on a loaded box) it is still held, and no longer than one more window
    in flight: past that the look is the horizon again (threads_since)."""
    horizon = 5 + THREADS_SLACK_S
    late = _thread_states(5, horizon + 3.0)
    main = [d for d in late.values() if d.get("role") == "main"]
    assert main and main[0]["samples"] > 0 and main[0]["where"], late
    assert not _thread_states(5, horizon + 5 + 1.0)
    store = SampleStore()
    store.on_samples([_one_window(), _health(1.0, 5)])
    t = _one_window().t
    assert threads_since(store, t + horizon + 3.0, DEFAULT_HORIZON_S) == t
    assert threads_since(store, t + horizon + 6.0, DEFAULT_HORIZON_S) == t + 6.0


def test_the_windows_widen_with_the_window_in_flight_and_never_shrink():
    store = SampleStore()
    assert stacks_window_s(store) == NO_HEALTH_WINDOW_S
    assert threads_horizon_s(store, DEFAULT_HORIZON_S) == DEFAULT_HORIZON_S
    assert budget_window_s(store, 20.0) == 20.0
    store.on_samples([_health(1.0, CALM_WINDOW_S)])
    assert stacks_window_s(store) == CALM_WINDOW_S
    assert threads_horizon_s(store, DEFAULT_HORIZON_S) == CALM_WINDOW_S + THREADS_SLACK_S
    assert budget_window_s(store, 20.0) == CALM_WINDOW_S + BUDGET_STACKS_S
    # while calm, 30 s whatever the window in flight (a workers' 2 s window between calm ones),
    # and the budget twice its seconds of stacks: the calm rates are a quarter of the full ones
    store.on_samples([Sample(1.4, KIND_HEALTH, SOURCE_STACKS,
                             health_data("ok", "", window_s=CALM_WINDOW_S, calm=True))])
    assert threads_horizon_s(store, DEFAULT_HORIZON_S) == CALM_WINDOW_S + CALM_STRETCH * THREADS_SLACK_S == 30
    assert budget_window_s(store, 20.0) == CALM_WINDOW_S + CALM_STRETCH * BUDGET_STACKS_S == 40
    store.on_samples([Sample(1.5, KIND_HEALTH, SOURCE_STACKS, health_data("ok", "", window_s=2, calm=True))])
    assert threads_horizon_s(store, DEFAULT_HORIZON_S) == CALM_WINDOW_S + CALM_STRETCH * THREADS_SLACK_S
    assert budget_window_s(store, 20.0) == 2 + CALM_STRETCH * BUDGET_STACKS_S
    store.on_samples([Sample(1.6, KIND_HEALTH, SOURCE_STACKS, health_data("ok", "", window_s=2, calm=False))])
    assert threads_horizon_s(store, DEFAULT_HORIZON_S) == DEFAULT_HORIZON_S
    # the agent's 20 s windows and its long budget window stay as they are
    store.on_samples([_health(2.0, 20)])
    assert threads_horizon_s(store, 30.0) == 30.0
    # a damaged health value is read as no health, never as a window of its own
    for bad in (None, "10", True, float("nan")):
        store.on_samples([_health(3.0, bad)])
        assert stacks_window_s(store) == NO_HEALTH_WINDOW_S


def _window_budget(late_s: float) -> tuple[dict | None, float, float]:
    """The budget processor's window budget when py-spy's next window is ``late_s`` later than the
    5 s in flight, over the real windows of the H200 Trainer job up to one of 4.8 s; with the
    newest window's end and the time of the look."""
    wins = []
    with RecordingReader(str(HF)) as r:
        wins = [s for s in r.samples() if s.kind == KIND_STACKS and s.data.get("main") and s.t <= 60.52]
    newest = wins[-1]
    store = SampleStore()
    store.on_samples(wins + [_health(newest.t + 0.1, 5)])
    now = newest.t + 5 + late_s
    out = BudgetProcessor().process(store, now)
    window = [s.data for s in out if s.kind == KIND_BUDGET and s.key == "window"]
    return (window[0] if window else None), newest.t, now


def test_a_late_window_still_leaves_the_budget_its_seconds_of_stacks():
    """On a loaded box py-spy's next window lands seconds late; the budget's look reaches back so
    that it still holds BUDGET_STACKS_S before the newest window's end (a 20 s look once held 1 s
    of stacks beside two CPU hogs), and no further than a window in flight or BUDGET_STACKS_S more:
    py-spy that stopped is not judged as now."""
    on_time, _, _ = _window_budget(0.0)
    assert on_time["from"] == "stacks" and on_time["window_s"] == 20.0   # the look as it was
    # (4 s late the 20 s look still holds 10 s: the old look passed that; 8 and 12 s it did not)
    for late in (4.0, 8.0, 12.0):
        b, newest_t, now = _window_budget(late)
        assert b is not None and b["from"] == "stacks", late
        assert b["window_s"] >= now - (newest_t - BUDGET_STACKS_S) - 1e-6, (late, b["window_s"])
        # (py-spy's spawn gaps between the windows are not stacks: ~10% of them here)
        assert b["seconds"] >= 0.85 * BUDGET_STACKS_S, (late, b["seconds"])
    store = SampleStore()
    store.on_samples([_health(1.0, 5)])
    assert budget_since(store, "1", 100.0, 20.0) == 80.0   # no stacks of the process: as before
    # py-spy stopped: neither its old stacks nor a widened look over none of them
    stopped, _, _ = _window_budget(30.0)
    assert stopped is None or (stopped["from"] != "stacks" and stopped["window_s"] == 20.0), stopped
    store = SampleStore()
    store.on_samples([_one_window(), _health(1.0, 5)])
    newest_t = _one_window().t
    assert budget_since(store, _one_window().key, newest_t + 60.0, 20.0) == newest_t + 40.0


def _ticks_that_work(store, ticks: list[float], every_s: float) -> list[float]:
    worked, last = [], None
    for t in ticks:
        if works_now(store, t, every_s, last):
            worked.append(t)
            last = t
    return worked


def test_while_calm_the_budget_and_thread_states_work_every_other_run_on_a_grid():
    store = SampleStore()
    ticks = [7.31 + k for k in range(40)]          # a replay's: exactly every second
    assert _ticks_that_work(store, ticks, 1.0) == ticks   # not calm: every run works
    store.on_samples([Sample(1.0, KIND_HEALTH, SOURCE_STACKS,
                             health_data("ok", "", window_s=CALM_WINDOW_S, calm=True))])
    worked = _ticks_that_work(store, ticks, 1.0)
    assert len(worked) == len(ticks) // CALM_STRETCH
    assert all(b - a == pytest.approx(CALM_STRETCH) for a, b in zip(worked, worked[1:]))
    # a jump lands its fresh processors on the same grid: from any tick on, the same runs work
    for k in range(1, 6):
        assert _ticks_that_work(store, ticks[k:], 1.0) == [t for t in worked if t >= ticks[k]]
    # the thread states' 2 s runs work every 4 s
    two = [3.7 + 2 * k for k in range(20)]
    worked2 = _ticks_that_work(store, two, 2.0)
    assert len(worked2) == 10 and all(b - a == pytest.approx(4.0) for a, b in zip(worked2, worked2[1:]))


@pytest.mark.parametrize("gap", [0.97, 1.0, 1.013, 1.04])
def test_a_live_derive_threads_drifting_ticks_never_wait_longer_than_the_stretch(gap):
    """The live derive thread's ticks drift against the grid (each a little more or less than a
    second apart): a skipped grid time is made up at the next run, so a calm budget is never older
    than CALM_STRETCH runs (the engine drops one older than 3 s: signals.BUDGET_STALE_S), and
    still about every other run works."""
    store = SampleStore()
    store.on_samples([Sample(1.0, KIND_HEALTH, SOURCE_STACKS,
                             health_data("ok", "", window_s=CALM_WINDOW_S, calm=True))])
    ticks = [100.0 + gap * k for k in range(400)]
    worked = _ticks_that_work(store, ticks, 1.0)
    assert max(b - a for a, b in zip(worked, worked[1:])) <= CALM_STRETCH * gap + 1e-9
    assert 0.45 <= len(worked) / len(ticks) <= 0.6
