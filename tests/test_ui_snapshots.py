"""SVG snapshots of the UI replaying the committed real recording at fixed, paused positions.

A changed layout shows up as a failed comparison with a visual diff (snapshot_report.html).
After an intended change: ``python -m pytest tests/test_ui_snapshots.py --snapshot-update``
and look at the new SVGs in tests/__snapshots__/test_ui_snapshots/ before committing them.
"""

from __future__ import annotations

import pathlib
import time

import pytest

from gputop.session.replay import ReplaySession
from gputop.ui.app import GputopApp

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Relative to the checkout (the tests run from its root), because the Sources view shows the
# replayed file's path: the snapshots must not depend on where the checkout is.
FIXTURE = pathlib.Path("tests") / "data" / "host_cpu_demo.gtrec"


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Wall-clock times in the replay bar and the Sources view, the same on every machine; and
    the file paths, relative to the checkout's root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def app_at(position: float) -> GputopApp:
    session = ReplaySession(str(FIXTURE), start_playing=False)
    session.seek(position)
    return GputopApp(session)


def show(view_id: str):
    """run_before for snap_compare: press the view's number key (looked up: panel modules of
    other features add views, which renumbers the later ones)."""
    async def run_before(pilot):
        await pilot.press(str(([v.id for v in pilot.app.view_specs].index(view_id) + 1) % 10))  # the tenth is 0
    return run_before


def test_overview_80x24(snap_compare):
    assert snap_compare(app_at(45.0), terminal_size=(80, 24))


def test_overview_120x40(snap_compare):
    assert snap_compare(app_at(45.0), terminal_size=(120, 40))


def test_processes_80x24(snap_compare):
    assert snap_compare(app_at(45.0), terminal_size=(80, 24), run_before=show("procs"))


def test_threads_120x40(snap_compare):
    assert snap_compare(app_at(45.0), terminal_size=(120, 40), run_before=show("threads"))


def test_sources_80x24(snap_compare):
    assert snap_compare(app_at(45.0), terminal_size=(80, 24), run_before=show("sources"))


def test_help_80x24(snap_compare):
    assert snap_compare(app_at(45.0), terminal_size=(80, 24), press=["question_mark"])


def test_target_exited_80x24(snap_compare):
    assert snap_compare(app_at(10_000.0), terminal_size=(80, 24))  # seek clamps to the end


def test_terminal_too_small(snap_compare):
    assert snap_compare(app_at(45.0), terminal_size=(70, 20))


REAL = FIXTURE.parent / "h200" / "real"


def test_time_view_120x40(snap_compare):
    """The Time view of a real training loop with a periodic stall (processors rerun, as
    ``gputop replay`` does: the budget is recomputed from the raw samples)."""
    from gputop.verdicts import default_processors

    session = ReplaySession(str(REAL / "periodic_stall-pid.gtrec"), processors=default_processors(),
                            start_playing=False)
    session.seek(session.t_start + 30.0)
    assert snap_compare(GputopApp(session), terminal_size=(120, 40), run_before=show("time"))


def _gpu_recordings() -> list[pathlib.Path]:
    """Real H200 sessions (benchmarks/h200.sh): a GPU-bound and an input-bound job."""
    return [FIXTURE.parent / "h200" / f"{name}.gtrec" for name in ("gpu_bound", "input_bound")]


GPU_RECORDINGS = _gpu_recordings()
needs_gpu_recording = pytest.mark.skipif(
    not GPU_RECORDINGS, reason="needs a real GPU recording in tests/data (the H200 recordings are committed by "
                               "the lead; then run once with --snapshot-update and review the SVGs)")


def _middle(path: pathlib.Path) -> GputopApp:
    session = ReplaySession(str(path), start_playing=False)
    session.seek(session.t_start + 0.6 * (session.t_end - session.t_start))
    return GputopApp(session)


@needs_gpu_recording
@pytest.mark.parametrize("path", GPU_RECORDINGS or [None], ids=lambda p: p.stem if p else "none")
def test_gpu_overview_80x24(snap_compare, path):
    assert snap_compare(_middle(path), terminal_size=(80, 24))


@needs_gpu_recording
@pytest.mark.parametrize("path", GPU_RECORDINGS or [None], ids=lambda p: p.stem if p else "none")
def test_gpu_details_120x40(snap_compare, path):
    assert snap_compare(_middle(path), terminal_size=(120, 40), run_before=show("gpus"))


# -- every view at 80x24 (issue 12 item 6), on real H200 recordings ----------------------------------
H200 = FIXTURE.parent / "h200"


def _h200_at(name: str, frac: float = 0.6) -> GputopApp:
    """A replay that recomputes the verdicts and the time budget, as ``gputop replay`` does."""
    from gputop.verdicts import default_processors

    session = ReplaySession(str(H200 / f"{name}.gtrec"), processors=default_processors(), start_playing=False)
    session.seek(session.t_start + frac * (session.t_end - session.t_start))
    return GputopApp(session)


@pytest.mark.parametrize("view_id", ["gpus", "threads", "stacks", "steps", "time"])
def test_view_80x24(snap_compare, view_id):
    assert snap_compare(_h200_at("input_bound"), terminal_size=(80, 24), run_before=show(view_id))


def test_ranks_80x24(snap_compare):
    assert snap_compare(_h200_at("ranks"), terminal_size=(80, 24), run_before=show("ranks"))


def test_long_title_and_advice_wrap_80x24(snap_compare):
    """The verdict strip with a title and advice longer than a line: both wrap."""
    assert snap_compare(_h200_at("gil_contention"), terminal_size=(80, 24))


def test_output_view_80x24(snap_compare, tmp_path, monkeypatch):
    """The job's output (gputop run in the UI): a real process's log, the 11th view (tab)."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)  # the view shows the log's path: "run.log" on every machine
    with open("run.log", "wb") as f:
        subprocess.run([sys.executable, "-c", "for i in range(1, 41): print(f'epoch 0 step {i} loss {1/i:.4f}')\n"
                        "print('\\x1b[33mwarning\\x1b[0m: done')"], stdout=f, stderr=f, check=True, timeout=30)
    session = ReplaySession(str(ROOT / FIXTURE), start_playing=False)
    session.seek(45.0)

    async def to_output(pilot):
        await pilot.press("shift+tab")
        await pilot.pause(0.3)
    assert snap_compare(GputopApp(session, job_log="run.log"), terminal_size=(80, 24), run_before=to_output)
