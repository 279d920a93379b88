"""Replay details a newcomer trips over (issue 12 item 14), on real recordings: ``j`` with no
verdict to jump to says why; the GPU panel at t=0 of a session whose NVML source failed says it
failed and why; a recording cut short is not "a live file"."""

from __future__ import annotations

import asyncio
import functools
import io
import pathlib
import shutil

from rich.console import Console

from gputop.session.replay import ReplaySession
from gputop.ui import app as app_module
from gputop.ui.app import GputopApp
from gputop.verdicts import default_processors

DATA = pathlib.Path(__file__).parent / "data"


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


def bar(app) -> str:
    return screen_text(app).splitlines()[-2]


@async_test
async def test_j_with_no_primary_verdict_yet_says_why():
    session = ReplaySession(str(DATA / "h200" / "input_bound.gtrec"), processors=default_processors(),
                            start_playing=False)
    assert session.position == session.t_start
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("j")
        await pilot.pause()
        said = [n.message for n in pilot.app._notifications]
        assert session.position == session.t_start  # nothing to jump to: it stays
    assert any("no primary verdict at 0:00 yet" in m for m in said), said


@async_test
async def test_gpu_panel_at_t0_says_the_nvml_source_failed_and_why():
    """cpu_oversubscribed.gtrec was recorded on a machine without an NVIDIA driver; its first
    health sample comes a moment after the first sample, so at 0:00 only the metadata knows."""
    session = ReplaySession(str(DATA / "cpu_oversubscribed.gtrec"), start_playing=False)
    assert "nvml" not in session.store.latest_of_kind("health")  # the case: no health sample yet
    why = session.meta["sources"]["nvml"]["message"]
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(pilot.app)
    assert "this session has no NVML source" not in text
    assert "no GPU data — nvml failed: " + why[:30] in text, text


def _copy_cut(tmp_path: pathlib.Path, keep: int) -> str:
    src = DATA / "h200" / "input_bound.gtrec"
    path = tmp_path / "cut.gtrec"
    shutil.copyfile(src, path)
    with open(path, "r+b") as f:
        f.truncate(keep)
    return str(path)


@async_test
async def test_a_file_cut_inside_a_frame_ends_early_and_is_not_live(tmp_path):
    size = (DATA / "h200" / "input_bound.gtrec").stat().st_size
    session = ReplaySession(_copy_cut(tmp_path, size * 2 // 3), start_playing=False)
    assert session.growing and session.reader.index.truncated  # no end frame, ends mid-frame
    session.seek(session.t_end)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        line = bar(pilot.app)
    assert "the recording ends early (gputop was killed?)" in line and "live" not in line, line


@async_test
async def test_a_file_cut_between_frames_that_stops_growing_ends_early(tmp_path, monkeypatch):
    """Killed between two frames: nothing in the file tells, but a live recorder writes every
    second; once it has not grown for STILL_S the bar stops calling it live."""
    whole = ReplaySession(str(DATA / "h200" / "input_bound.gtrec"), start_playing=False)
    boundary = whole.reader.index.chunks[-1].offset  # a frame starts here: the one before is whole
    whole.stop()
    session = ReplaySession(_copy_cut(tmp_path, boundary), start_playing=False)
    assert session.growing and not session.reader.index.truncated
    # (first a STILL_S no loaded box reaches between the first draw and this check: under two CPU
    # hogs the app's start took over the 1 s this test once used; then a short one, to see it end)
    monkeypatch.setattr(app_module, "STILL_S", 60.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "following a live file" in bar(pilot.app)  # it may still be written
        monkeypatch.setattr(app_module, "STILL_S", 1.0)
        await pilot.pause(1.6)
        line = bar(pilot.app)
    assert "the recording ends early (gputop was killed?)" in line and "live" not in line, line
