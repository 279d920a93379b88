"""The Python-stacks panels (gputop/ui/panels/stacks.py), driven with App.run_test().

Data: a real session recorded here (the stack source on tests/workloads/stacks_gil.py: the
main thread, one spinner and a sleeper), replayed with the thread-state processor re-run,
exactly as ``gputop replay`` does.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from gputop.derive.threads import ThreadStateProcessor
from gputop.session.recording import Recorder, RecordingWriter
from gputop.session.replay import ReplaySession
from gputop.session.session import LiveSession, SessionClock, base_meta
from gputop.sources.stacks import KIND_STACKS, StackSource
from gputop.sources.target import Target
from gputop.ui.app import GputopApp
from gputop.ui.panels.stacks import DataLoaderWorkersPanel, HotFramesPanel, ThreadStatesPanel

from stacks_helpers import Proc, wait_for, workload

pytestmark = pytest.mark.timeout(120)


def async_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def record(path: str, seconds_of_stacks: int, **source_kw) -> int:
    p = Proc(workload("stacks_gil.py", "--spinners", "1", "--sleeper"))
    try:
        p.first()
        clock = SessionClock()
        target = Target(p.pid)
        meta = base_meta(clock, [])
        meta["target"] = target.describe()
        src = StackSource(clock, target, window_s=2, **source_kw)
        sess = LiveSession([src], clock, meta, recorder=Recorder(RecordingWriter(path, meta)),
                           processors=[ThreadStateProcessor()])
        sess.start()
        if seconds_of_stacks:
            wait_for(lambda: len(sess.store.series(KIND_STACKS, str(p.pid))) >= seconds_of_stacks, 25, 0.2)
        else:
            wait_for(lambda: src.pyspy_state == "failed" and src.kernel_ticks > 100, 10, 0.2)
            wait_for(lambda: False, 1.5)
        sess.stop()
    finally:
        p.kill()
    return p.pid


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ui") / "stacks.gtrec")
    pid = record(path, 3)
    return path, pid


def replay(path: str) -> ReplaySession:
    s = ReplaySession(path, processors=[ThreadStateProcessor()], start_playing=False)
    s.seek(s.t_end)
    return s


async def show(pilot, view_id: str) -> None:
    n = [v.id for v in pilot.app.view_specs].index(view_id) + 1
    await pilot.press(str(n))
    await pilot.pause()


def panel(app, cls):
    return next(p for p in app.panels[cls.VIEW] if isinstance(p, cls))


@async_test
async def test_threads_view_shows_state_bars_main_thread_first(rec):
    path, pid = rec
    async with GputopApp(replay(path)).run_test(size=(110, 40)) as pilot:
        await show(pilot, "threads")
        states = panel(pilot.app, ThreadStatesPanel)
        text = states.text.plain
        assert states.display and "py-spy" in text and "GIL measured" in text
        rows = [ln for ln in text.splitlines() if ln.startswith(("MainThread", "spinner0", "sleeper"))]
        assert [r.split()[0] for r in rows][0] == "MainThread", text
        assert {r.split()[0] for r in rows} == {"MainThread", "spinner0", "sleeper"}
        main = rows[0]
        assert "main" in main and "GIL" in main and "G" in main  # the bar has GIL cells
        sleeper = next(r for r in rows if r.startswith("sleeper"))
        assert "idle" in sleeper.split("·")[-1] or "idle" in sleeper
        assert "main thread is mostly at:" in text and "stacks_gil.py" in text
        assert not panel(pilot.app, DataLoaderWorkersPanel).display  # no workers here
        assert pilot.app.tick_errors == 0


@async_test
async def test_hot_frames_follow_the_thread_filter_and_sort(rec):
    path, pid = rec
    async with GputopApp(replay(path)).run_test(size=(110, 40)) as pilot:
        await show(pilot, "stacks")
        hot = panel(pilot.app, HotFramesPanel)
        text = hot.text.plain
        assert text.startswith(f"MainThread (PID {pid}, TID {pid})") and "sorted by self" in text
        assert "main (stacks_gil.py:" in text
        await pilot.click(HotFramesPanel)   # focus it: its keys work
        await pilot.press("t")               # next thread after the main one
        await pilot.pause()
        assert hot.text.plain.startswith("spinner0"), hot.text.plain
        assert "spinner (stacks_gil.py:" in hot.text.plain
        await pilot.press("s")
        await pilot.pause()
        assert "sorted by total" in hot.text.plain
        assert "Thread._bootstrap" in hot.text.plain  # callers show up by total
        for _ in range(2):                   # sleeper, then all threads
            await pilot.press("t")
        await pilot.pause()
        assert hot.text.plain.startswith("all threads")
        assert pilot.app.tick_errors == 0


@async_test
async def test_clicking_a_thread_filters_hot_frames(rec):
    path, pid = rec
    async with GputopApp(replay(path)).run_test(size=(110, 40)) as pilot:
        await show(pilot, "threads")
        states = panel(pilot.app, ThreadStatesPanel)
        lines = states.text.plain.splitlines()
        row = next(i for i, ln in enumerate(lines) if ln.startswith("sleeper"))
        await pilot.click(ThreadStatesPanel, offset=(2, row + 1))  # +1: the panel's top border
        await show(pilot, "stacks")
        assert panel(pilot.app, HotFramesPanel).text.plain.startswith("sleeper")


@async_test
async def test_a_failed_sampler_is_one_clear_line(tmp_path):
    path = str(tmp_path / "nospy.gtrec")
    record(path, 0, pyspy=str(tmp_path / "missing" / "py-spy"))
    async with GputopApp(replay(path)).run_test(size=(110, 30)) as pilot:
        await show(pilot, "threads")
        text = panel(pilot.app, ThreadStatesPanel).text.plain
        first = text.splitlines()[0]
        assert first.startswith("stacks failed: py-spy not found") and "pip install py-spy" in first
        assert "MainThread" in text or "python" in text  # kernel-only thread states still drawn
        assert pilot.app.tick_errors == 0


@async_test
async def test_the_threads_title_says_the_horizon_its_states_are_over():
    """The thread states are over 10 s, and over 30 s while the stack source is calm
    (derive/stacks_window.py): the Threads view's title says which, from the same function,
    replaying an H200 HF Trainer job before and during its calm part."""
    import pathlib

    from gputop.catalogue import SOURCE_STACKS
    from gputop.model import KIND_HEALTH
    from gputop.verdicts import default_processors

    path = pathlib.Path(__file__).parent / "data" / "h200" / "calm" / "hf_trainer-pid.gtrec"
    session = ReplaySession(str(path), processors=default_processors(), start_playing=False)
    try:
        from gputop.session.recording_reader import RecordingReader
        with RecordingReader(str(path)) as r:
            health = [s for s in r.samples() if s.kind == KIND_HEALTH and s.key == SOURCE_STACKS]
        calm_t = next(s.t for s in health if s.data.get("calm") is True)
        app = GputopApp(session, start_view="threads")
        async with app.run_test(size=(120, 40)) as pilot:
            panel = app.query_one(ThreadStatesPanel)
            session.seek(calm_t - 20.0)
            app.redraw_now()
            await pilot.pause()
            assert "last 10 s" in str(panel.border_title), panel.border_title
            session.seek(calm_t + 20.0)
            app.redraw_now()
            await pilot.pause()
            assert "last 30 s" in str(panel.border_title), panel.border_title
            # early in the judged stretch the states are over it alone, as the budget's window
            # (phases.look_start): the title says those seconds, not the horizon
            from gputop.report import build_report
            t_train = next(c["t"] for c in build_report(str(path))["phases"] if c["phase"] == "training")
            for k in range(2, 12):   # (the live tracker says "training" a few seconds after the stretch began)
                session.seek(t_train + k)   # (this recording's times count from its start, as the report's)
                phase = session.store.latest("phase", "main")
                if phase.get("phase") == "training":
                    break
            app.redraw_now()
            await pilot.pause()
            look = float(str(panel.border_title).split("last ")[1].split(" s")[0])
            judged = session.position - phase.get("training_since")
            assert judged < 9.0 and abs(look - judged) <= 1.0, (panel.border_title, judged)
    finally:
        session.stop()
