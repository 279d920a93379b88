"""The tab line (issue 31 item 3): full names where they fit, else short names that stay unique
and readable ("Ovw Vrd GPU Prc Thr Stk Stp Rnk Time Src", declared with each view), "…" where
the line is cut; and the same layout whatever view is current, so nothing moves when you switch.

Before: at 120 columns live the line read "2 Verdi 4 Proce 5 Threa 6 Stack 0 Sourc · Outpu" and
its widths moved with the current view; at 80x24 "2 V 3 G 4 P 5 T 6 S 7 S 8 R 9 T 0 S"."""

from __future__ import annotations

import asyncio
import functools
import io
import pathlib
import re

import pytest
from rich.console import Console

from gputop.session.replay import ReplaySession
from gputop.session.session import LiveSession, SessionClock, base_meta
from gputop.ui.app import GputopApp, TabLine
from gputop.ui.panels import ViewSpec, load_panel_modules, views
from gputop.verdicts import default_processors

DATA = pathlib.Path(__file__).parent / "data" / "h200"
REPLAY = DATA / "real" / "hf_trainer-run.gtrec"

FULL = {"overview": "Overview", "verdicts": "Verdicts", "gpus": "GPUs", "procs": "Processes", "threads": "Threads",
        "stacks": "Stacks", "steps": "Steps", "ranks": "Ranks", "time": "Time", "sources": "Sources",
        "output": "Output", "stall": "Stall"}
SHORT = {"overview": "Ovw", "verdicts": "Vrd", "gpus": "GPU", "procs": "Prc", "threads": "Thr", "stacks": "Stk",
         "steps": "Stp", "ranks": "Rnk", "time": "Time", "sources": "Src", "output": "Out", "stall": "Stl"}


def async_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def screen_text(app) -> str:
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def tab_line(app) -> str:
    return screen_text(app).splitlines()[2]


def names_in(line: str) -> list[str]:
    """The view names in a tab line, in order ("[4 Prc]" and " 4 Prc " both give "Prc")."""
    return re.findall(r"(?:^|[\s\[\]])[0-9·s] (\S+?)(?=[\s\[\]]|$)", line)


def replay_app() -> GputopApp:
    session = ReplaySession(str(REPLAY), processors=default_processors(), start_playing=False)
    session.seek(session.t_start + 30.0)
    return GputopApp(session)


def live_app(tmp_path: pathlib.Path) -> tuple[GputopApp, LiveSession]:
    """A live `gputop run` UI: every view, the job's Output and the Stall view included."""
    log = tmp_path / "job.log"
    log.write_text("step 1\n")
    clock = SessionClock()
    session = LiveSession([], clock, base_meta(clock))
    return GputopApp(session, job_log=str(log)), session


async def every_tab_line(pilot) -> dict[str, str]:
    """The tab line with each view current (switched with tab, as a user does)."""
    app = pilot.app
    seen = {}
    for _ in app.view_specs:
        await pilot.pause()
        seen[app.current_view] = tab_line(app)
        await pilot.press("tab")
    return seen


def check(seen: dict[str, str], specs: list[ViewSpec], width: int, names: dict[str, str]) -> None:
    ids = [s.id for s in specs]
    assert set(seen) == set(ids)
    for current, line in seen.items():
        assert len(line.rstrip()) <= width
        got = names_in(line)
        assert got == [names[i] for i in ids], (current, line)
        assert len(set(got)) == len(got)  # unique: never two S's or two T's
        n = ids.index(current) + 1
        assert re.search(rf"\[{n % 10 if n <= 10 else '[·s]'} {re.escape(names[current])}\]", line), (current, line)
    # the same cells whatever view is current: only the brackets of the current one differ
    plain = {re.sub(r"[\[\]]", " ", line).rstrip() for line in seen.values()}
    assert len(plain) == 1, plain


def test_every_built_in_view_declares_a_unique_readable_short_name():
    load_panel_modules()
    specs = {s.id: s for s in views()}
    assert {i: specs[i].short for i in SHORT} == SHORT
    shorts = [s.short_title for s in specs.values()]
    assert len(set(shorts)) == len(shorts) and all(3 <= len(x) <= 4 for x in shorts)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
@async_test
async def test_replay_tab_line_reads_and_does_not_move(size):
    app = replay_app()
    async with app.run_test(size=size) as pilot:
        seen = await every_tab_line(pilot)
        specs = app.view_specs
    if size[0] >= 120:
        check(seen, specs, size[0], FULL)  # every full name fits at 120
    else:
        # at 80 the names that save the most become short first; every one stays a word
        names = {**FULL, "overview": "Ovw", "verdicts": "Vrd", "procs": "Prc", "threads": "Thr", "sources": "Src"}
        check(seen, specs, size[0], names)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
@async_test
async def test_live_run_tab_line_with_output_and_stall_reads_and_does_not_move(size, tmp_path):
    app, session = live_app(tmp_path)
    session.start()
    try:
        async with app.run_test(size=size) as pilot:
            seen = await every_tab_line(pilot)
            specs = app.view_specs
    finally:
        session.stop()
    assert [s.id for s in specs][-2:] == ["output", "stall"]
    if size[0] >= 120:
        check(seen, specs, size[0], {**FULL, "procs": "Prc"})  # one name short, the rest in full
    else:
        check(seen, specs, size[0], SHORT)
        assert "s Stl" in seen["overview"]  # the Stall view's own key, not "·"


def test_a_line_too_narrow_for_the_short_names_is_cut_with_an_ellipsis():
    specs = [ViewSpec(f"v{i}", f"Viewnumber{i}", i) for i in range(30)]
    line = TabLine().draw(specs, "v0", {}, 80)
    assert line.cell_len == 80 and line.plain.endswith("…")
    assert line.plain.startswith("[1 Vie…]2 Vie… 3 Vie…")  # a view without a short name: its title, cut


def test_a_view_without_a_short_name_keeps_a_short_title_and_cuts_a_long_one():
    assert ViewSpec("x", "Extra", 1).short_title == "Extra"
    assert ViewSpec("x", "Memory maps", 1).short_title == "Mem…"
    assert ViewSpec("x", "Memory maps", 1, short="Map").short_title == "Map"
