"""The Textual UI, driven with App.run_test() and Pilot.

Data: tests/data/host_cpu_demo.gtrec, a real recording made by scripts/record_fixture.py (the
host source and the NVML source, which on the CI machine records that there is no NVIDIA
driver, watching the bundled input-bound workload until it exits). One test watches a real
process live. Keys are pressed as a user would; what is asserted is what the screen says and
what the replay did.
"""

from __future__ import annotations

import asyncio
import functools
import io
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import pytest
from rich.console import Console
from rich.text import Text

from gputop.session.replay import ReplaySession
from gputop.session.session import LiveSession, SessionClock, base_meta
from gputop.ui import panels as panel_registry
from gputop.ui.app import GputopApp, HelpScreen
from gputop.ui.panels import TextPanel

FIXTURE = pathlib.Path(__file__).parent / "data" / "host_cpu_demo.gtrec"


def async_test(fn):
    """Run an async test body with asyncio (the suite has no async pytest plugin)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def screen_text(app) -> str:
    """The screen as plain text, exactly as drawn (what a user reads)."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True,
                      color_system="truecolor")
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def replay_at(position: float) -> ReplaySession:
    session = ReplaySession(str(FIXTURE), start_playing=False)
    session.seek(position)
    return session


@pytest.fixture(scope="module")
def facts():
    """What the fixture holds, read straight from the file (not through the UI)."""
    s = ReplaySession(str(FIXTURE), start_playing=False)
    s.seek(s.t_end)
    procs = s.store.latest_of_kind("proc")
    exit_sample = next(iter(s.store.latest_of_kind("target").values()))
    out = {
        "t_start": s.t_start, "t_end": s.t_end, "pid": str(s.meta["target"]["pid"]),
        "procs": procs, "exit_t": exit_sample.t, "exit_state": exit_sample.data["state"],
        "nvml_message": s.store.latest("health", "nvml").data["message"],
    }
    s.stop()
    return out


def view_key(app, view_id: str) -> str:
    """The number key of a view: views are numbered in registration order, and panel modules
    of other features add views, so tests look the number up instead of assuming it."""
    return str(([v.id for v in app.view_specs].index(view_id) + 1) % 10)  # the tenth view is key 0


def bar(app) -> str:
    return screen_text(app).splitlines()[-2]


@async_test
async def test_overview_at_80x24_shows_target_processes_and_why_gpu_is_missing(facts):
    async with GputopApp(replay_at(30.0)).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(pilot.app)
    lines = text.splitlines()
    assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
    assert f"PID {facts['pid']}" in lines[0] and "REPLAY" in lines[0]
    assert "host ok" in lines[1] and "nvml failed" in lines[1] and "target running" in lines[1]
    # the reason the GPU panel is empty is the NVML source's own message
    flat = " ".join(line.strip() for line in lines)
    assert "no GPU data — nvml failed: no NVIDIA driver" in flat
    assert facts["nvml_message"][:40] in flat
    # the main process and its DataLoader workers, as a tree
    assert re.search(rf"^\s*{facts['pid']} main\s+python", text, re.M)
    workers = [line for line in lines if " loader " in line and "└ pt_data_worker" in line]
    assert len(workers) == 2
    assert "paused" in lines[-2] and "0:30 /" in lines[-2]
    assert lines[-1].startswith("q quit")


@async_test
async def test_space_toggles_play_and_pause():
    session = replay_at(10.0)
    async with GputopApp(session, refresh_hz=10).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not session.playing
        await pilot.press("space")
        assert session.playing and "playing" in bar(pilot.app)
        start = session.position
        await pilot.pause(0.6)
        assert session.position > start + 0.3  # the replay clock moved on its own
        await pilot.press("space")
        assert not session.playing and "paused" in bar(pilot.app)
        held = session.position
        await pilot.pause(0.4)
        assert session.position == held


@async_test
async def test_speed_keys_stay_between_quarter_and_16x():
    session = replay_at(10.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.press("plus")
        assert session.speed == 2.0
        for _ in range(8):
            await pilot.press("plus")
        assert session.speed == 16.0 and "16x" in bar(pilot.app)
        for _ in range(12):
            await pilot.press("minus")
        assert session.speed == 0.25 and "0.25x" in bar(pilot.app)
        await pilot.press("equals_sign")  # + without shift
        assert session.speed == 0.5


@async_test
async def test_seek_keys(facts):
    session = replay_at(40.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.press("right")
        assert session.position == pytest.approx(50.0)
        assert "0:50 /" in bar(pilot.app)
        await pilot.press("left", "left")
        assert session.position == pytest.approx(30.0)
        await pilot.press("right_square_bracket")
        assert session.position == pytest.approx(min(90.0, facts["t_end"]))
        await pilot.press("left_square_bracket")
        assert session.position == pytest.approx(min(90.0, facts["t_end"]) - 60.0)
        await pilot.press("end")
        assert session.position == pytest.approx(facts["t_end"])
        await pilot.press("home")
        assert session.position == pytest.approx(facts["t_start"])
        assert "0:00 /" in bar(pilot.app)
        await pilot.press("pagedown")  # pgdn seeks a minute in a replay
        assert session.position == pytest.approx(facts["t_start"] + 60.0)


@async_test
async def test_step_keys_pause_and_move_one_second():
    session = ReplaySession(str(FIXTURE), start_playing=True)
    session.seek(20.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.press("full_stop")
        assert not session.playing
        at = session.position
        await pilot.press("full_stop")
        assert session.position == pytest.approx(at + 1.0)
        await pilot.press("comma", "comma")
        assert session.position == pytest.approx(at - 1.0)
        assert "paused" in bar(pilot.app)


@async_test
async def test_help_opens_explains_metrics_and_closes():
    session = replay_at(10.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(pilot.app.screen, HelpScreen)
        console = Console(width=78, file=io.StringIO(), record=True)
        console.print(pilot.app.screen.content)
        plain = console.export_text()
        # keys, and the sources' own one-line explanations of their metrics
        assert "play / pause" in plain and "slower / faster" in plain
        assert "voluntary context switches per second" in plain      # gputop.sources.host
        assert "share of SMs with work" in plain                       # gputop.sources.nvml
        before = session.position
        await pilot.press("right")  # replay keys do nothing while help is open
        assert session.position == before
        await pilot.press("escape")
        assert not isinstance(pilot.app.screen, HelpScreen)
        await pilot.press("question_mark")
        await pilot.press("q")  # q closes the help, it does not quit
        assert not isinstance(pilot.app.screen, HelpScreen)
        assert pilot.app.is_running


@async_test
async def test_small_terminal_says_so_and_recovers():
    async with GputopApp(replay_at(30.0)).run_test(size=(70, 20)) as pilot:
        await pilot.pause()
        text = screen_text(pilot.app)
        assert "needs a terminal of at least 80x24; this one is 70x20" in text
        assert "Target processes" not in text
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        text = screen_text(pilot.app)
        assert "needs a terminal" not in text
        assert "Target processes" in text and "pt_data_worker" in text
        await pilot.resize_terminal(80, 23)
        await pilot.pause()
        assert "this one is 80x23" in screen_text(pilot.app)


@async_test
async def test_number_keys_switch_views(facts):
    session = replay_at(30.0)
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.press(view_key(pilot.app, "procs"))
        await pilot.pause()
        table = pilot.app.query_one("#view-procs DataTable")
        keys = {k.value for k in table.rows}
        live_at_30 = {pid for pid, s in facts["procs"].items() if s.t > 25}
        assert facts["pid"] in keys and live_at_30 <= keys
        text = screen_text(pilot.app)
        assert f"[{view_key(pilot.app, 'procs')} Prc]" in text and "cgroup memory" in text  # 80 columns: short names
        await pilot.press(view_key(pilot.app, "threads"))
        await pilot.pause()
        assert f"[{view_key(pilot.app, 'threads')} Thr]" in screen_text(pilot.app)
        assert len(pilot.app.query_one("#view-threads DataTable").rows) >= 1
        await pilot.press(view_key(pilot.app, "sources"))
        await pilot.pause()
        text = " ".join(screen_text(pilot.app).split())
        assert "nvml failed no NVIDIA driver" in text
        assert pilot.app.view_specs[-1].id == "sources"  # the last view: tab wraps to the first
        await pilot.press("tab")
        assert pilot.app.current_view == "overview"


@async_test
async def test_process_table_follows_the_replay_in_place(facts):
    session = replay_at(30.0)
    async with GputopApp(session).run_test(size=(100, 30)) as pilot:
        await pilot.press(view_key(pilot.app, "procs"))
        await pilot.pause()
        table = pilot.app.query_one("#view-procs DataTable")
        row_key = next(k for k in table.rows if k.value == facts["pid"])
        seen = set()
        for _ in range(4):
            expected = f"{session.store.latest('proc', facts['pid']).data['cpu_pct']:.0f}%"
            assert table.get_cell(row_key, "cpu").plain.strip() == expected
            seen.add(expected)
            await pilot.press("right")
            await pilot.pause()
        assert len(seen) > 1  # the values did change on the way
        # the same row object all along: updated in place, never removed and added again
        assert any(k is row_key for k in table.rows)
        assert {k.value for k in table.rows} == {pid for pid, s in session.store.latest_of_kind("proc").items()
                                                 if s.t > session.position - 60}


@async_test
async def test_target_exit_banner_and_data_kept(facts):
    assert facts["exit_state"] == "exited"
    session = replay_at(facts["t_end"])
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(pilot.app)
        assert "TARGET EXITED" in text
        assert f"Target PID {facts['pid']} exited at" in text and "all data is kept" in text
        # the processes stay listed with their last memory figures, marked gone
        assert re.search(rf"^\s*{facts['pid']} main\s+python\s+n/a\s+\S+M\s+\d+\s+n/a gone", text, re.M)
        await pilot.press("home")
        await pilot.pause()
        assert "TARGET EXITED" not in screen_text(pilot.app)


def screen_colours(app) -> set[tuple[int, int, int]]:
    """Every foreground and background colour on the screen, as drawn."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True,
                      color_system="truecolor")
    console.print(app.screen._compositor.render_update(full=True))
    out = set()
    for seg in console._record_buffer:
        for colour in (seg.style.color, seg.style.bgcolor) if seg.style else ():
            if colour is not None and not colour.is_default:
                out.add(tuple(colour.get_truecolor()))
    return out


def _grey(rgb: tuple[int, int, int]) -> bool:
    return max(rgb) - min(rgb) <= 2


@async_test
async def test_no_color_makes_everything_monochrome_and_states_stay_readable(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = GputopApp(replay_at(30.0))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        colours = screen_colours(pilot.app)
        text = screen_text(pilot.app)
    assert colours and all(_grey(c) for c in colours), sorted(c for c in colours if not _grey(c))
    # states are words, not colours
    assert "nvml failed" in text and "host ok" in text and "paused" in text and "[1 Ovw]" in text
    monkeypatch.delenv("NO_COLOR")
    async with GputopApp(replay_at(30.0)).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        coloured = screen_colours(pilot.app)
    assert any(not _grey(c) for c in coloured)  # the check above can fail


@async_test
async def test_a_registered_panel_plugs_in_without_editing_the_app(monkeypatch):
    monkeypatch.setattr(panel_registry, "_VIEWS", dict(panel_registry._VIEWS))
    monkeypatch.setattr(panel_registry, "_PANELS", list(panel_registry._PANELS))
    # the ten number keys are taken by the built-in views: a view placed before the last ones
    # takes a key, and those after it are reached with tab
    panel_registry.register_view("extra", "Extra", order=84)

    @panel_registry.register_panel
    class ThreadCount(TextPanel):
        VIEW = "extra"
        NEEDS = ("thread",)
        TITLE = "Thread count"

        def draw(self, snap, width):
            return Text(f"threads seen: {len(snap.keys('thread'))}")

    @panel_registry.register_panel
    class NeedsProbe(TextPanel):
        VIEW = "extra"
        NEEDS = ("probe_step",)  # no such samples in the recording
        TITLE = "Probe steps"

        def draw(self, snap, width):
            return Text("never drawn")

    session = replay_at(30.0)
    n_threads = len(session.store.keys("thread"))
    async with GputopApp(session).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        key = view_key(pilot.app, "extra")
        assert f"{key} Ex" in screen_text(pilot.app).splitlines()[2]  # in the tab line, maybe shortened
        await pilot.press(key)
        await pilot.pause()
        text = screen_text(pilot.app)
        assert f"[{key} Extra]" in text.splitlines()[2]
    assert f"threads seen: {n_threads}" in text and "Thread count" in text
    assert "Probe steps" not in text and "never drawn" not in text


@async_test
async def test_live_session_shows_a_real_target_and_its_exit():
    """A real process, watched live by the real host source; it exits while the UI runs."""
    from gputop.sources.host import HostSource
    from gputop.sources.target import Target

    # the child spins until the flag file goes (a loaded box may take seconds to show the UI)
    flag = tempfile.NamedTemporaryFile(prefix="gputop-ui-test-", delete=False)
    flag.close()
    child = subprocess.Popen([sys.executable, "-c", "import os, sys\nwhile os.path.exists(sys.argv[1]): pass",
                              flag.name])
    try:
        target = Target(child.pid)
        clock = SessionClock()
        meta = base_meta(clock, [])
        meta["target"] = target.describe()
        session = LiveSession([HostSource(clock, target, interval_s=0.5)], clock, meta)
        session.start()
        try:
            async with GputopApp(session, refresh_hz=10).run_test(size=(80, 24)) as pilot:
                text = ""
                deadline = time.monotonic() + 15
                while not ("target running" in text and re.search(rf"^\s*{child.pid} main\s+python", text, re.M)) \
                        and time.monotonic() < deadline:
                    await pilot.pause(0.3)
                    text = screen_text(pilot.app)
                assert f"PID {child.pid}" in text and "not recording" in text
                assert re.search(rf"^\s*{child.pid} main\s+python", text, re.M)
                assert "target running" in text
                os.unlink(flag.name)
                deadline = time.monotonic() + 10
                while "TARGET EXITED" not in text and time.monotonic() < deadline:
                    await pilot.pause(0.3)
                    text = screen_text(pilot.app)
                assert "TARGET EXITED" in text and f"Target PID {child.pid} exited" in text
                assert re.search(rf"^\s*{child.pid} main\s+python .* gone", text, re.M), text  # kept
                assert pilot.app.tick_errors == 0
        finally:
            session.stop()
    finally:
        if os.path.exists(flag.name):
            os.unlink(flag.name)
        child.kill()
        child.wait()


@async_test
async def test_recording_indicator_and_replaying_a_file_still_being_written(tmp_path):
    """Live: a real process watched and recorded. Meanwhile the same file is replayed in a
    second UI, which follows it as it grows."""
    from gputop.session.recording import Recorder, RecordingWriter
    from gputop.sources.host import HostSource
    from gputop.sources.target import Target

    path = str(tmp_path / "growing.gtrec")
    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<20: pass"])
    try:
        target = Target(child.pid)
        clock = SessionClock()
        meta = base_meta(clock, [])
        meta["target"] = target.describe()
        live = LiveSession([HostSource(clock, target, interval_s=0.5)], clock, meta,
                           recorder=Recorder(RecordingWriter(path, meta), flush_s=0.5))
        live.start()
        try:
            async with GputopApp(live, refresh_hz=10).run_test(size=(80, 24)) as pilot:
                await pilot.pause(1.5)
                header = screen_text(pilot.app).splitlines()[0]
                assert "● REC" in header and "REPLAY" not in header
                await pilot.press(view_key(pilot.app, "sources"))
                await pilot.pause()
                assert re.search(r"recording to\s+" + re.escape(path[:40]), screen_text(pilot.app))
            replay = ReplaySession(path, start_playing=True)
            first_end = replay.t_end
            assert replay.growing
            # play from just before the end it had when opened: the test is about what comes after
            replay.seek(max(replay.t_start, first_end - 0.5))
            async with GputopApp(replay, refresh_hz=10).run_test(size=(80, 24)) as pilot:
                await pilot.pause(0.3)
                assert "following a live file" in bar(pilot.app)
                await pilot.pause(2.5)
                # new frames were picked up and played through
                assert replay.t_end > first_end + 1.0
                assert replay.position > first_end
                assert re.search(rf"^\s*{child.pid} main\s+python", screen_text(pilot.app), re.M)
            replay.stop()
        finally:
            live.stop()
    finally:
        child.kill()
        child.wait()


def _gpu_recordings() -> list[pathlib.Path]:
    """Real H200 sessions (benchmarks/h200.sh): a GPU-bound and an input-bound job."""
    return [FIXTURE.parent / "h200" / f"{name}.gtrec" for name in ("gpu_bound", "input_bound")]


GPU_RECORDINGS = _gpu_recordings()


@pytest.mark.skipif(not GPU_RECORDINGS, reason="needs a real GPU recording in tests/data (the H200 recordings "
                                               "are made on the GPU machine and committed by the lead)")
@pytest.mark.parametrize("path", GPU_RECORDINGS or [None], ids=lambda p: p.name if p else "none")
@async_test
async def test_gpu_views_show_every_value_or_its_na_reason(path):
    from gputop.ui.fmt import pct
    from gputop.ui.panels.gpus import ROWS, GpuDetails
    from gputop.ui.sourceinfo import clock_events_text

    session = ReplaySession(str(path), start_playing=False)
    session.seek(session.t_start + 0.6 * (session.t_end - session.t_start))
    store = session.store
    keys = sorted(store.keys("gpu"), key=int)
    async with GputopApp(session).run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        overview = screen_text(pilot.app)
        for key in keys:
            # what the panels show: the newest values, GPM fields filled from the last 0.6 s
            # (GPM is read on ~60% of the 10 Hz samples)
            from gputop.ui.snapshot import Snapshot
            d = Snapshot(session).current("gpu", key)
            field = "sm_active" if d.get("sm_active") is not None else "util_gpu"
            assert re.search(rf"GPU{key}\*?\s.*{re.escape(pct(d.get(field)))}", overview), (key, field)
        await pilot.press(view_key(pilot.app, "gpus"))
        await pilot.pause()
        details = pilot.app.query_one(GpuDetails).text.plain
    blocks = details.split("\n\n")
    assert len(blocks) == len(keys)
    for key, block in zip(keys, blocks):
        d = store.latest("gpu", key).data
        na = (store.latest("gpu_info", key).data.get("na") or {}) if store.latest("gpu_info", key) else {}
        lines = {line[2:17].strip(): line[17:] for line in block.splitlines()[1:]}
        for row in ROWS:
            shown = lines[row.label]
            if all(d.get(f) is None for f in row.fields) and row.fields[0] in na:
                assert shown.startswith(f"n/a: {na[row.fields[0]]}"[:40]), (row.label, shown)
            elif d.get(row.fields[0]) is not None:
                assert shown.startswith(row.show(d, store.latest("gpu_info", key).data)), (row.label, shown)
        if d.get("clock_events") is not None:
            assert lines["clock events"].startswith(clock_events_text(d["clock_events"])[:40])
    session.stop()
