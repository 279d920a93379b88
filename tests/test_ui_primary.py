"""The primary verdict's story (issue 31 items 4 and 5): the strip's "for N s" is how long the
current primary has been the primary (it starts again when the primary changes); without one the
strip says why (the engine's "why"); the Verdicts view's timeline lists each change of the
primary, so both tell the same story; ``j`` jumps to where the primary became it in every view of
a replay, and says in a line that it needs a replay when live.

Before: live, the strip went "for 4 s" -> "○ no verdict holds now" -> "for 10 s" (the count was
the verdict's, never reset), the timeline showed only the first "on", and ``j`` did nothing in
views 3-7, 9 and 0.

Data: real H200 recordings (tests/data/h200/), replayed with the engine recomputing verdicts as
``gputop replay`` does; the live story is the issue's, as samples the engine publishes."""

from __future__ import annotations

import asyncio
import functools
import io
import pathlib
import re
import time

import pytest
from rich.console import Console

from gputop.model import Sample
from gputop.session.replay import ReplaySession
from gputop.session.session import LiveSession, SessionClock, base_meta
from gputop.session.store import CallbackSubscriber
from gputop.ui.app import GputopApp
from gputop.ui.panels import verdict_timeline as vtimeline
from gputop.ui.panels import verdicts as vpanels
from gputop.ui.snapshot import Snapshot
from gputop.verdicts import default_processors
from gputop.verdicts.causal import gain_text

DATA = pathlib.Path(__file__).parent / "data" / "h200"
FLAPPING = DATA / "timeline" / "sync_stall_flapping.gtrec"   # its primary changes four times in 30 s
HF_RUN = DATA / "real" / "hf_trainer-run.gtrec"              # 50 s: a seek to 40 s lands mid-file


def async_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def screen_text(app) -> str:
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def strip_lines(text: str) -> list[str]:
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("─Verdict"))
    end = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("─"))
    return lines[top:end]


def view_key(app, view_id: str) -> str:
    return str(([v.id for v in app.view_specs].index(view_id) + 1) % 10)


def minsec(t: float) -> str:
    return f"{int(t) // 60}:{int(t) % 60:02d}"


def primary_flips(path: pathlib.Path) -> list[tuple[float, str | None, str]]:
    """(time, id, why) at each change of a whole recording's primary verdict, from the engine's
    samples (independently of the UI)."""
    got: list[Sample] = []
    s = ReplaySession(str(path), processors=default_processors(), start_playing=False, seek_window_s=0.0)
    s.bus.subscribe(CallbackSubscriber(lambda ss: got.extend(x for x in ss if x.kind == "verdict_primary")))
    s.play_to(s.t_end)
    s.stop()
    out, prev = [], object()
    for x in got:
        if x.data.get("id") != prev:
            out.append((x.t, x.data.get("id"), x.data.get("why") or ""))
            prev = x.data.get("id")
    return out


def replay(path: pathlib.Path, at: float) -> ReplaySession:
    s = ReplaySession(str(path), processors=default_processors(), start_playing=False)
    s.seek(s.t_start + at)
    return s


async def open_verdicts_view(pilot) -> vtimeline.VerdictTimeline:
    app = pilot.app
    await pilot.press(view_key(app, "verdicts"))
    await pilot.pause()
    timeline = next(p for p in app.panels["verdicts"] if isinstance(p, vtimeline.VerdictTimeline))
    deadline = time.monotonic() + 30
    while timeline.timeline is None:
        assert time.monotonic() < deadline, "the whole-file pass did not finish"
        await pilot.pause(0.05)
    app.redraw_now()
    await pilot.pause()
    return timeline


PRIMARY_ROW = re.compile(r"^[▸ ] +(\d+:\d\d) (on |off) (\S+) +primary +(.*)$")


def primary_rows(timeline_text: str) -> list[tuple[str, str, str, str]]:
    """The timeline's primary rows of its first section: (time, on/off, id, the rest)."""
    lines = timeline_text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("Recomputed") or line.startswith("Live"))
    out = []
    for line in lines[first + 1:]:
        if not re.match(r"^[▸ ] +\d+:\d\d (on |off)", line):
            break
        m = PRIMARY_ROW.match(line)
        if m:
            out.append((m.group(1), m.group(2).strip(), m.group(3), m.group(4)))
    return out


# -- a replay: the strip, the timeline and j ------------------------------------------------------

@async_test
async def test_the_strip_counts_from_when_the_primary_became_it_and_says_why_there_is_none():
    flips = primary_flips(FLAPPING)
    # the engine's story of this file: sync_stall, host_bound, none, sync_stall (it flapped twice
    # more before the causal loss: sync_stall now costs the GPU's idle share and holds its lead)
    assert [vid for _, vid, _ in flips] == [None, "sync_stall", "host_bound", None, "sync_stall"]
    session = replay(FLAPPING, 14.0)
    async with GputopApp(session).run_test(size=(120, 40)) as pilot:
        seen = {}
        for at in (14.0, 20.0, 25.5, 29.0):
            session.seek(session.t_start + at)
            pilot.app.redraw_now()
            await pilot.pause()
            seen[at] = strip_lines(screen_text(pilot.app))
        timeline = await open_verdicts_view(pilot)
        rows = primary_rows(timeline.text.plain)
    for at, strip in seen.items():
        now = FLAPPING_T0 + at
        t, vid, why = [f for f in flips if f[0] <= now + 1e-6][-1]
        if vid is not None:
            assert strip[1].startswith(f"● WARNING {vid}"), strip
            assert f"for {now - t:.0f} s" in strip[0], (at, strip[0])   # reset at every change
        else:
            # none: the engine's reason, and which verdict was the primary until when
            before = [f for f in flips if f[0] < t][-1][1]
            assert strip[1].startswith("○ no verdict now: " + why[:40]), strip
            assert f"({before} was the primary until {minsec(t)})" in " ".join(x.strip() for x in strip[1:])
    # the timeline tells the same story: each change of the primary, in order
    assert [(tm, onoff, vid) for tm, onoff, vid, _ in rows] == [
        (minsec(t), "on" if vid else "off", vid or prev) for (t, vid, _), (_, prev, _) in zip(flips[1:], flips)]
    assert rows[2][3].startswith("none now: " + flips[3][2][:40])


FLAPPING_T0 = ReplaySession(str(FLAPPING), start_playing=False).t_start


@async_test
async def test_after_a_seek_mid_file_the_strip_says_at_least_until_the_whole_file_is_read():
    flips = primary_flips(HF_RUN)
    became = next(t for t, vid, _ in flips if vid == "host_bound")
    session = replay(HF_RUN, 40.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        before = strip_lines(screen_text(pilot.app))
        await open_verdicts_view(pilot)
        await pilot.press(view_key(pilot.app, "overview"))
        await pilot.pause()
        after = strip_lines(screen_text(pilot.app))
        now = session.position
    # the replay's verdicts start again where the seek landed (10 s in): it cannot know what was before
    assert before[1].startswith("● WARNING host_bound") and re.search(r"for ≥ \d+ s", before[0]), before[0]
    # the whole file read, the count is exact (and the same as the timeline's row)
    assert f"for {now - became:.0f} s" in after[0] and "≥" not in after[0], after[0]


@pytest.mark.parametrize("path,at", [(FLAPPING, 29.0), (HF_RUN, 40.0)], ids=["flapping", "hf_trainer-run"])
@async_test
async def test_j_jumps_to_where_the_primary_became_it_in_every_view(path, at):
    flips = primary_flips(path)
    session = replay(path, at)
    landed = {}
    async with GputopApp(session).run_test(size=(120, 40)) as pilot:
        app = pilot.app
        target = [t for t, vid, _ in flips if t <= session.position + 1e-6][-1]
        assert len(app.view_specs) == 10  # every view has its number key
        for spec in app.view_specs:
            session.seek(session.t_start + at)
            await pilot.press(view_key(app, spec.id))
            await pilot.pause()
            assert app.current_view == spec.id
            await pilot.press("j")
            await pilot.pause()
            landed[spec.id] = session.position
            assert not session.playing
        said = [n.message for n in app._notifications]
    assert {v: round(p, 3) for v, p in landed.items()} == {v: round(target, 3) for v in landed}, said


@async_test
async def test_j_with_nothing_to_jump_to_says_why_in_every_view():
    session = replay(FLAPPING, 0.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        for key in ("1", "3", "5", "9", "0"):
            await pilot.press(key)
            await pilot.press("j")
            await pilot.pause()
        said = [n.message for n in pilot.app._notifications]
        assert session.position == session.t_start
    assert len([m for m in said if m.startswith("no primary verdict at 0:00 yet")]) == 5, said


# -- live -------------------------------------------------------------------------------------------

@async_test
async def test_live_j_says_in_a_line_that_jumping_needs_a_replay_in_every_view():
    clock = SessionClock()
    session = LiveSession([], clock, base_meta(clock))
    session.start()
    try:
        async with GputopApp(session).run_test(size=(80, 24)) as pilot:
            keys = [view_key(pilot.app, v.id) for v in pilot.app.view_specs[:10]]
            for key in keys:
                await pilot.press(key)
                await pilot.press("j")
                await pilot.pause()
            said = [n.message for n in pilot.app._notifications]
    finally:
        session.stop()
    assert len([m for m in said if m.startswith("j jumps in a replay only")]) == len(keys), said


WARMING = "warming up: the step time has not settled yet (autotuning, allocator growth, lazy init)"


def live_story(session: LiveSession, start: float, upto: float) -> None:
    """The issue's live story as the engine tells it, from ``start`` to ``upto`` s: input_bound on
    from 0.5 s and the primary from 1 s; none from 5 s to 9 s (warming up again); input_bound
    the primary again from 9 s."""
    out = []
    t = start
    while t <= upto:
        vid = None if 5.0 <= t < 9.0 else "input_bound"
        out.append(Sample(t, "verdict", "input_bound", {"active": True, "title": "Input-bound", "severity": "warning",
                                                         "since": 0.5, "confidence": 0.9, "gain": 0.25,
                                                         "summary": "waiting for data", "advice": "more workers"}))
        data = {"id": vid, "others": [], "why": WARMING if vid is None else "GPU busy 10%", "phase": "training"}
        if vid is not None:
            data.update({"title": "Input-bound", "severity": "warning", "since": 0.5, "gain": 0.25})
        out.append(Sample(t, "verdict_primary", "primary", data))
        t += 1.0
    session.bus.publish_many(out)


def _live() -> LiveSession:
    clock = SessionClock()
    return LiveSession([], clock, base_meta(clock))


def _draw(session: LiveSession, now: float, strip: vpanels.VerdictStrip, width: int = 100) -> str:
    session.now = lambda: now
    snap = Snapshot(session)
    text = strip.draw(snap, width)
    return f"{strip.border_title}\n{text.plain}"


def test_live_strip_resets_when_the_primary_changes_and_the_timeline_lists_each_change():
    session = _live()
    strip = vpanels.VerdictStrip()
    live_story(session, 1.0, 4.0)
    assert _draw(session, 4.0, strip).startswith("Verdict · for 3 s · " + gain_text(0.25))
    live_story(session, 5.0, 7.0)
    shown = _draw(session, 7.0, strip)
    assert shown.startswith("Verdict\n○ no verdict now: " + WARMING[:40]), shown
    assert "(input_bound was the primary until 0:05)" in " ".join(shown.split())
    live_story(session, 8.0, 20.0)
    shown = _draw(session, 20.0, strip)
    assert shown.startswith("Verdict · for 11 s"), shown   # from 9 s, not the verdict's 0.5 s
    timeline = vtimeline.VerdictTimeline()
    rows = primary_rows(timeline.draw(Snapshot(session), 120).plain)
    assert [(t, onoff, vid) for t, onoff, vid, _ in rows] == [
        ("0:01", "on", "input_bound"), ("0:05", "off", "input_bound"), ("0:09", "on", "input_bound")]
    assert rows[1][3].startswith("none now: " + WARMING[:30])


def test_live_primary_that_outlasts_the_store_keeps_counting():
    """The store keeps 300 s; the strip follows the primary at every draw (Panel.follow), so a
    primary of 400 s reads 7 min, not the 5 min the store still holds."""
    session = _live()
    strip = vpanels.VerdictStrip()
    t = 1.0
    while t <= 500.0:
        vid = "gpu_bound" if t < 100.0 else "input_bound"
        session.bus.publish_many([Sample(t, "verdict_primary", "primary", {
            "id": vid, "others": [], "title": vid, "severity": "warning", "since": 0.5, "why": ""})])
        if t % 10 == 0:
            session.now = lambda t=t: t
            strip.follow(Snapshot(session))  # what the app does at each draw, in every view
        t += 1.0
    assert session.store.series("verdict_primary", "primary")[0].t > 100.0  # the start is gone from the store
    assert _draw(session, 500.0, strip).startswith("Verdict · for 7 min"), strip.border_title


def test_the_app_follows_the_primary_in_every_view():
    app = GputopApp(_live())
    assert any(isinstance(p, vpanels.VerdictStrip) for p in app._followers)


# -- the Verdicts view: notes and gain ---------------------------------------------------------------

def test_verdicts_view_shows_the_engines_notes_and_the_gain():
    session = _live()
    live_story(session, 1.0, 20.0)
    session.bus.publish_many([Sample(20.5, "verdict_primary", "primary", {
        "id": "input_bound", "others": [], "title": "Input-bound", "severity": "warning", "since": 0.5,
        "gain": 0.25, "notes": [{"id": "host_bound", "text": "the main thread runs Python 30% of the time; the GPU "
                                                             "stays busy 97% of the time: not on the critical path"},
                                {"id": "x\x1b[2J", "text": "escaped\x07"}]})])
    session.now = lambda: 21.0
    text = vpanels.VerdictDetail().draw(Snapshot(session), 100).plain
    assert "Notes: causes that hold but cost no GPU time now" in text
    flat = " ".join(text.split())
    assert "host_bound — the main thread runs Python 30% of the time; the GPU stays busy 97% of the time: not " \
           "on the critical path" in flat
    assert "\x1b" not in text and "\x07" not in text
    assert gain_text(0.25) in flat and "the primary for 12 s (from 0:09)" in flat
