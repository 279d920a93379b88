"""The time budget in the UI: the overview's line and the Time view, on real H200 recordings.

Data: tests/data/h200/real/*.gtrec, real training loops recorded on the H200 (py-spy stacks,
NVML, some with the probe). A replay reruns the processors, so the budget shown is recomputed
from the raw samples by gputop/derive/budget_processor.py. Expected numbers are read from the
replay's own ``budget`` and ``phase`` samples, never written into the test; what is asserted
is that the screen says them.
"""

from __future__ import annotations

import asyncio
import functools
import io
import pathlib
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from gputop.derive import budget as bd
from gputop.session.replay import ReplaySession
from gputop.ui.app import GputopApp, HelpScreen
from gputop.ui.panels import budget as ui_budget
from gputop.ui.panels import panels_for
from gputop.ui.snapshot import Snapshot
from gputop.verdicts import default_processors

REAL = pathlib.Path(__file__).parent / "data" / "h200" / "real"


def async_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def screen_text(app) -> str:
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True,
                      color_system="truecolor")
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def replay(name: str, at: float) -> ReplaySession:
    """A replay that reruns the processors (as ``gputop replay``), paused ``at`` s into the file."""
    s = ReplaySession(str(REAL / f"{name}.gtrec"), processors=default_processors(), start_playing=False)
    s.seek(s.t_start + at)
    return s


def view_key(app, view_id: str) -> str:
    return str(([v.id for v in app.view_specs].index(view_id) + 1) % 10)  # the tenth view is key 0


async def time_view(session, size=(120, 60)) -> str:
    async with GputopApp(session).run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press(view_key(pilot.app, "time"))
        await pilot.pause()
        pilot.app.redraw_now()
        await pilot.pause()
        assert pilot.app.current_view == "time"
        return screen_text(pilot.app)


async def overview(session, size=(80, 24)) -> str:
    async with GputopApp(session).run_test(size=size) as pilot:
        await pilot.pause()
        return screen_text(pilot.app)


def block(text: str, title: str) -> list[str]:
    """The lines of the panel titled ``title`` (its border line first)."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("─" + title))
    end = next((i for i in range(top + 1, len(lines)) if lines[i].startswith("─")), len(lines))
    return lines[top:end]


def pct0(v: float) -> str:
    return f"{v * 100:.0f}%"


def pct1(v: float) -> str:
    return f"{v * 100:.1f}%"


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# -- the Time view ---------------------------------------------------------------------------------

@async_test
async def test_time_view_shows_the_window_budget_and_the_periodic_stall():
    session = replay("periodic_stall-pid", 30.0)
    data = session.store.latest("budget", "window").data
    text = await time_view(session)
    session.stop()
    table = block(text, "Where the training loop's time went")
    for c in bd.CATEGORIES:
        row = next(line for line in table if line.startswith(bd.LABELS[c]))
        v = data["shares"][c]
        assert row[len(bd.LABELS[c]):].split()[0] == pct1(v), (c, row, v)
    assert data["largest"] == "blocked"
    assert "← largest" in next(line for line in table if line.startswith(bd.LABELS["blocked"]))
    st = data["stalls"]
    assert st["periodic"] and st["frame"].startswith("push_metrics (real_loops.py:")  # what the loop was built to do
    flat = " ".join(" ".join(table).split())
    assert f"stops {st['duration_s']:.1f} s every {st['period_s']:.1f} s in {st['frame']}" in flat
    assert f"{pct0(st['share'])} of the window" in flat
    # the blocked time's top frame, with its share of the window and its owner
    frames = block(text, "Top frames")
    f, share, owner = data["frames"]["blocked"][0]
    assert any(line.split()[:3] == [pct1(share), owner, f.split()[0]] and f in line for line in frames), frames
    head = next(line for line in frames if line.startswith(bd.LABELS["blocked"]))
    assert pct1(data["shares"]["blocked"]) in head


@async_test
async def test_time_view_phase_startup_and_session_budget_training_first():
    session = replay("checkpoint_stall-run", 25.0)
    window = session.store.latest("budget", "window").data
    phase = session.store.latest("phase", "main").data
    sess = session.store.latest("budget", "session").data
    text = await time_view(session)
    session.stop()
    # the probe's split of a step, labelled as the probe's
    probe = window["probe"]
    line = block(text, "Per step (probe)")[1]
    assert f"{probe['steps_per_s']:.1f} steps/s" in line and f"{probe['step_ms']:.1f} ms/step" in line
    assert f"data wait {pct0(probe['data_wait_share'])}" in line and f"GPU {pct0(probe['gpu_share'])}" in line
    # the phase, with the start-up's parts
    lines = block(text, "Phase")
    assert lines[1].startswith(phase["label"])
    assert lines[2].strip() == (phase["startup_text"] or "no start-up seen (attached to a running job)")
    # the session's budget per phase, training first, with its seconds and shares
    rows = block(text, "Whole session")[1:]
    rows = rows[:rows.index(next(r for r in rows if not r.strip()))]  # then the empty rest of the view
    assert "training" in sess["phases"] and rows[0].startswith("training")
    assert len(rows) == len(sess["phases"])
    for row in rows:
        name = next(p for p in sess["phases"] if row.startswith(ui_budget.phase_words(p)[:10]))  # may be clipped
        d = sess["phases"][name]
        assert f"{d['seconds']:.1f} s" in row
        c, v = ui_budget.ordered_shares(d)[0]
        assert f"{ui_budget.SHORT[c]} {pct0(v)}" in row, (row, c, v)


# -- the overview's line ---------------------------------------------------------------------------

@async_test
async def test_overview_line_largest_first_with_the_frame_and_the_phase_in_80_columns():
    session = replay("periodic_stall-pid", 30.0)
    data = session.store.latest("budget", "window").data
    text = await overview(session)
    session.stop()
    lines = block(text, "Time budget")
    assert len(lines) == 2, lines
    line = lines[1].rstrip()
    assert len(line) <= 80
    shares = sorted(((c, v) for c, v in data["shares"].items() if v is not None and v >= 0.01), key=lambda cv: -cv[1])
    # largest first; at 80 columns the smallest may be left out, never the largest three
    shown = [f"{ui_budget.SHORT[c]} {pct0(v)}" for c, v in shares]
    parts = [p.split(" (")[0] for p in line.split(" · ")[:-1]]
    assert parts == shown[:len(parts)] and len(parts) >= min(3, len(shown)), (line, shown)
    frame = data["frames"][data["largest"]][0][0]
    assert f"({ui_budget.frame_short(frame)})" in line and line.endswith("phase training")
    for c, v in data["shares"].items():
        if v is not None and v < 0.01:
            assert f"{ui_budget.SHORT[c]} " not in line.replace("phase training", "")


@async_test
async def test_overview_line_in_start_up_says_the_start_up_parts():
    session = replay("slow_startup-pid", 8.0)
    phase = session.store.latest("phase", "main").data
    assert phase["phase"] == "startup"
    text = await overview(session, size=(160, 40))
    session.stop()
    line = block(text, "Time budget")[1].rstrip()
    assert line.endswith(phase["startup_text"]), (line, phase)


@async_test
async def test_overview_line_waits_for_stacks_before_the_first_budget():
    session = replay("periodic_stall-pid", 0.0)
    assert session.store.latest("budget", "window") is None
    text = await overview(session)
    session.stop()
    assert block(text, "Time budget")[1].startswith("time budget: waiting for stacks")


@async_test
async def test_time_view_says_why_a_non_python_target_has_no_stacks():
    """A real ``sleep`` watched live: the stack source says "off, not a Python program", and the
    Time view says that instead of waiting for stacks that never come (issue 31, item 7)."""
    import subprocess

    from gputop.session.session import LiveSession, SessionClock, base_meta
    from gputop.sources.host import HostSource
    from gputop.sources.stacks import StackSource
    from gputop.sources.target import Target

    child = subprocess.Popen(["sleep", "100"])
    try:
        target = Target(child.pid)
        clock = SessionClock()
        meta = base_meta(clock, [])
        meta["target"] = target.describe()
        session = LiveSession([HostSource(clock, target, interval_s=0.5), StackSource(clock, target)], clock, meta,
                              processors=default_processors())
        session.start()
        try:
            async with GputopApp(session, refresh_hz=10).run_test(size=(160, 40)) as pilot:
                await pilot.pause()
                await pilot.press(view_key(pilot.app, "time"))
                deadline = time.monotonic() + 15
                text = ""
                while "not a Python program" not in text and time.monotonic() < deadline:
                    await pilot.pause(0.3)
                    text = screen_text(pilot.app)
                health = session.store.latest("health", "stacks")
                assert health is not None and health.get("state") == "off", health
                line = " ".join(" ".join(block(text, "Where the training loop's time went")[1:3]).split())
                assert "waiting for stacks" not in line, line
                want = f"time budget: no stacks: process {child.pid} is not a Python program (sleep)"
                assert line.startswith(want), line
        finally:
            session.stop()
    finally:
        child.kill()
        child.wait()


def test_no_budget_reason_without_a_stack_source_or_when_py_spy_failed():
    class Snap:
        def __init__(self, state, sources):
            self.meta = {"sources": sources}
            self.state = state

        def source_state(self, name):
            return self.state

    assert ui_budget.no_budget_reason(Snap(None, {"host": {}})).startswith("no stack source in this session")
    assert ui_budget.no_budget_reason(Snap(None, {})).startswith("waiting for stacks")
    failed = {"state": "failed", "message": "py-spy may not read process 7 (ptrace not permitted)"}
    assert ui_budget.no_budget_reason(Snap(failed, {"stacks": {}})) == (
        "no stacks yet, py-spy failed: py-spy may not read process 7 (ptrace not permitted)")
    assert ui_budget.no_budget_reason(Snap({"state": "ok", "message": "starting py-spy"}, {"stacks": {}})).startswith(
        "waiting for stacks")


def test_strip_fits_every_width_and_keeps_the_phase():
    session = replay("checkpoint_stall-pid", 20.0)
    snap = Snapshot(session)
    session.stop()
    for width in range(20, 161):
        t = ui_budget.strip_text(snap, width)
        assert t.cell_len <= width, (width, t.plain)
        if width >= 60:
            assert "phase" in t.plain, (width, t.plain)


def test_short_names_and_help_cover_every_category():
    assert set(ui_budget.SHORT) == set(bd.CATEGORIES)
    assert len(set(ui_budget.SHORT.values())) == len(bd.CATEGORIES)


@async_test
async def test_help_lists_each_category_with_its_label_and_meaning():
    session = replay("periodic_stall-pid", 30.0)
    async with GputopApp(session).run_test(size=(200, 200)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(pilot.app.screen, HelpScreen)
        text = " ".join(screen_text(pilot.app).split())
    session.stop()
    assert "9 Time" in text and "0 Sources" in text
    for c in bd.CATEGORIES:
        assert bd.LABELS[c] in text
        assert " ".join(bd.HELP[c].split()[:6]) in text, c


# -- damaged files ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
BUDGET_FIELDS = ["seconds", "shares", "largest", "frames", "cpu_owners", "blocked_in_calls", "window_s",
                 "gpu_source", "phase", "pid", "from", "stalls", "probe", "phases", "startup", "startup_text"]


@st.composite
def budget_data(draw):
    d = {k: draw(json_values) for k in draw(st.lists(st.sampled_from(BUDGET_FIELDS), unique=True))}
    if draw(st.booleans()):
        d["shares"] = {c: draw(json_values) for c in draw(st.lists(st.sampled_from(bd.CATEGORIES), unique=True))}
    if draw(st.booleans()):
        d["stalls"] = {k: draw(json_values) for k in ("count", "duration_s", "share", "period_s", "periodic",
                                                       "cause", "frame")}
    if draw(st.booleans()):
        d["frames"] = {c: draw(st.lists(st.lists(json_values, max_size=4), max_size=3))
                       for c in (bd.CPU, bd.IO, bd.BLOCKED)}
    return d


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget_data(), budget_data(), st.dictionaries(st.sampled_from(["phase", "label", "since", "training_since",
                                                                      "startup", "startup_text"]), json_values))
@example(window={"shares": {"gpu_busy": 5.992310449541053e+306}}, session_={}, phase={})  # once overflowed a bar
def test_damaged_budget_samples_draw_without_error(window, session_, phase):
    from gputop.session.store import SampleStore
    from gputop.model import Sample

    store = SampleStore()
    store.on_samples([Sample(1.0, "budget", "window", window), Sample(1.0, "budget", "session", session_),
                    Sample(1.0, "phase", "main", phase)])

    class S:
        meta: dict = {}
        playback = None

        def __init__(self):
            self.store = store

        def now(self):
            return 2.0

    snap = Snapshot(S())
    for cls in panels_for("time") + [ui_budget.TimeBudgetStrip]:
        panel = cls()
        panel.shown(snap)
        text = panel.draw(snap, 80)
        assert "\x1b" not in text.plain


def test_docs_list_every_category_and_phase_with_the_codes_labels():
    """docs/metrics.md "Time budget" repeats the labels of gputop/derive: they must stay the same."""
    from gputop.derive import phases as ph

    doc = (pathlib.Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    section = doc.split("## Time budget", 1)[1].split("\n## ", 1)[0]
    for c in bd.CATEGORIES:
        assert f"| `{c}` | {bd.LABELS[c]} | {bd.HELP[c]} |" in section, c
    for p in ph.PHASES:
        assert f"| `{p}` | {ph.LABELS[p]} |" in section, p
    for field in ("seconds", "shares", "largest", "frames", "cpu_owners", "blocked_in_calls", "window_s",
                  "gpu_source", "phase", "pid", "from", "stalls", "probe", "phases", "startup", "startup_text",
                  "changes", "label", "since", "training_since"):
        assert f"| `{field}`" in section or f"`{field}`," in section, field
    prom = (pathlib.Path(__file__).parents[1] / "docs" / "prometheus.md").read_text()
    assert "gputop_time_budget_share{category}" in prom and "gputop_phase_info{phase}" in prom
