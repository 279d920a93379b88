"""What the UI does per tick (issue 14): it redraws when the session clock enters a new second,
not at every tick; only the visible view's panels are drawn; a line whose text did not change is
not updated, and one that changed is repainted without a new layout.

Data: tests/data/h200/gpu_bound.gtrec, a real recording, replayed through the real verdict
processors and played at 1x on a wall clock the test moves, so which tick crosses a second is
known; the app's own timer runs too (its ticks find the clock unmoved and must draw nothing).
"""

from __future__ import annotations

import asyncio
import functools
import io
import math
import pathlib

from rich.console import Console
from rich.text import Text

from gputop.session.replay import ReplaySession
from gputop.ui import app as app_module
from gputop.ui.app import GputopApp, HeaderBar, KeyBar, ReplayBar, TabLine
from gputop.ui.panels import TextPanel, changed_rows
from gputop.verdicts import default_processors

RECORDING = pathlib.Path(__file__).parent / "data" / "h200" / "gpu_bound.gtrec"


def async_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def count_calls(obj, name: str, log: list) -> None:
    """Record each call of obj.name (its keyword arguments) on this instance only."""
    original = getattr(obj, name)

    def counted(*args, **kwargs):
        log.append(kwargs)
        return original(*args, **kwargs)
    setattr(obj, name, counted)


def screen_text(app) -> str:
    """The screen as drawn: the compositor's strips, from each widget's cached rows."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True,
                      color_system="truecolor")
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text(styles=True)


class Wall:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@async_test
async def test_a_tick_draws_only_when_the_session_clock_enters_a_new_second(monkeypatch):
    monkeypatch.setattr(app_module, "REDRAW_AT_LEAST_S", 3600.0)  # no wall-clock redraw: the clock decides
    wall = Wall()
    session = ReplaySession(str(RECORDING), processors=default_processors(), start_playing=True, clock=wall)
    session.seek(session.t_start + 20.3)
    app = GputopApp(session, refresh_hz=1.0, start_view="overview")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app.tick()  # a redraw still due from start-up (a resize) happens here, not in the counts
        updates = {pid: [] for pid in ("overview", "gpus", "verdicts")}
        shown_overview = [p for p in app.panels["overview"] if p.display]
        assert len(shown_overview) >= 3  # verdict strip, GPUs, host, processes: a real view
        for view in updates:
            for panel in app.panels[view]:
                count_calls(panel, "update_view", updates[view])
        lines = {cls: [] for cls in (HeaderBar, TabLine, KeyBar, ReplayBar)}
        for cls, log in lines.items():
            count_calls(app.query_one(cls), "update", log)

        draws0, t0 = app.draws, session.now()
        for _ in range(20):  # 20 ticks of 0.2 s at 1x: 4 s of session time
            wall.t += 0.2
            app.tick()
        seconds_entered = math.floor(session.now()) - math.floor(t0)
        assert seconds_entered == 4
        assert app.draws - draws0 == seconds_entered  # not 20
        # each shown panel of the visible view once per draw; the hidden views' panels never
        assert len(updates["overview"]) == seconds_entered * len(shown_overview)
        assert updates["gpus"] == [] and updates["verdicts"] == []
        # the position moved: the replay bar was repainted, each time without a new layout;
        # the tab line and the key line did not change, so they were not updated at all
        assert 1 <= len(lines[ReplayBar]) <= seconds_entered
        assert all(kw.get("layout") is False for kw in lines[ReplayBar])
        assert lines[TabLine] == [] and lines[KeyBar] == []
        assert f"{int(session.now()) // 60}:{int(session.now()) % 60:02d}" in str(app.query_one(ReplayBar)._shown)

        # rows repainted one by one add up to what a full repaint of every widget draws
        await pilot.pause()
        shown = screen_text(app)
        for widget in app.query("*"):
            widget.refresh()
        await pilot.pause()
        assert screen_text(app) == shown
        # a panel drawn again from the same snapshot is not repainted
        text_panels = [p for p in shown_overview if isinstance(p, TextPanel)]
        repaints = [p.repaints for p in text_panels]
        for p in text_panels:
            p.update_view(app.snapshot)
        assert [p.repaints for p in text_panels] == repaints

        # ticks whose clock stays inside the same second draw nothing, the app's timer included
        wall.t += 0.05
        app.tick()
        draws1 = app.draws
        await pilot.pause(1.2)  # at least one tick of the app's own 1 Hz timer, the clock unmoved
        app.tick()
        assert app.draws == draws1

        # switching view draws the new view at once, and from then on only it
        before = len(updates["overview"])
        await pilot.press(str([v.id for v in app.view_specs].index("gpus") + 1))
        assert updates["gpus"], "the GPU view was not drawn when it was opened"
        n_gpus = len(updates["gpus"])
        for _ in range(5):
            wall.t += 0.2
            app.tick()
        assert len(updates["overview"]) == before
        assert len(updates["gpus"]) > n_gpus
    session.stop()


def test_changed_rows_names_the_rows_to_repaint():
    old = Text("GPU0  50%\nhost  12%\n")
    new = Text("GPU0  50%\nhost  13%\n")
    assert changed_rows(old, new, 80) == [1]
    restyled = Text("GPU0  50%\nhost  12%\n")
    restyled.stylize("bold red", 0, 4)  # same characters, another colour: still a change
    assert changed_rows(old, restyled, 80) == [0]
    assert changed_rows(old, old.copy(), 80) == []
    assert changed_rows(old, Text("GPU0  50%\n" + "x" * 90 + "\n"), 80) is None  # it wraps: rows unknown


@async_test
async def test_a_live_ui_ticks_once_a_second_just_after_its_clock_enters_it():
    """Live, a draw happens only when the session clock enters a new second, so the app ticks
    then and only then (at its old 5 Hz, four ticks of five drew nothing and still woke Textual):
    over 3 s about three ticks, each within a few hundredths of a second after a whole second,
    each one drawing; a key still draws at once."""
    from gputop.session.session import LiveSession, SessionClock

    clock = SessionClock()
    session = LiveSession([], clock, {})
    session.start()
    try:
        app = GputopApp(session, refresh_hz=5.0, start_view="overview")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.5)
            ticks0, draws0 = len(app.tick_log), app.draws
            at: list[float] = []
            real_tick = app.tick

            def tick() -> None:
                at.append(session.now())
                real_tick()
            app.tick = tick
            await pilot.pause(3.0)
            n_ticks = len(app.tick_log) - ticks0
            assert 2 <= n_ticks <= 4, n_ticks          # 5 Hz: ~15
            assert app.draws - draws0 == n_ticks        # every tick draws
            late = [t - math.floor(t) for t in at]
            assert late and all(x < 0.25 for x in late), late
            drawn, ticked = app.draws, len(app.tick_log)
            await pilot.press(str([v.id for v in app.view_specs].index("gpus") + 1))
            # the key drew by itself, not at the next tick (a wall-clock bound here failed beside
            # the suite's load: 0.72 s for a press that drew at once, the pilot itself descheduled)
            assert app.current_view == "gpus" and app.draws - drawn > len(app.tick_log) - ticked, \
                (app.draws - drawn, len(app.tick_log) - ticked)
    finally:
        session.stop()
