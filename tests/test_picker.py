"""`gputop` with no arguments: the list of processes to watch (a pipe) and the picker (a terminal).
Real processes: the test starts a Python process and expects to find it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from gputop.sources.candidates import WHAT_PROBE, WHAT_PYTHON, find_candidates, one_line
from gputop.ui.picker import PickerApp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "gputop_picker_test_marker"


@pytest.fixture
def python_job():
    # A multi-line -c script: its newlines must not reach the list's lines.
    p = subprocess.Popen([sys.executable, "-c", f"import time\n# {MARK}\ntime.sleep(60)"])
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def _env():
    return dict(os.environ, PYTHONPATH=ROOT)


def test_no_arguments_without_a_terminal_lists_the_python_process_and_exits_2(python_job):
    out = subprocess.run([sys.executable, "-m", "gputop"], capture_output=True, text=True, env=_env(),
                         stdin=subprocess.DEVNULL, timeout=60)
    assert out.returncode == 2, out.stderr
    mine = [ln for ln in out.stdout.splitlines() if ln.split()[:1] == [str(python_job.pid)]]
    assert len(mine) == 1, out.stdout
    assert MARK in mine[0] and "time.sleep(60)" in mine[0]
    assert mine[0].split()[1] in ("Python", "Python+probe")
    assert out.stdout.splitlines()[0].split() == ["PID", "WHAT", "COMMAND"]
    assert out.stderr.count("\n") == 1 and "give --pid PID" in out.stderr
    assert "Traceback" not in out.stderr


def test_headless_without_pid_is_a_bad_command_line(python_job):
    out = subprocess.run([sys.executable, "-m", "gputop", "--headless", "--duration", "1"], capture_output=True,
                         text=True, env=_env(), stdin=subprocess.DEVNULL, timeout=60)
    assert out.returncode == 2
    assert str(python_job.pid) in out.stdout


def test_candidates_order_and_one_line_commands(python_job):
    found = find_candidates()
    by_pid = {c.pid: c for c in found.items}
    me = by_pid[python_job.pid]
    assert me.what in (WHAT_PYTHON, WHAT_PROBE) and "\n" not in me.command
    assert os.getpid() not in by_pid  # gputop does not offer itself
    order = {"GPU": 0, "Python+probe": 1, "Python": 2}
    ranks = [order[c.what] for c in found.items]
    assert ranks == sorted(ranks)
    same = [c.started for c in found.items if c.what == me.what]
    assert same == sorted(same, reverse=True)  # newest first within a group
    assert one_line(["python", "-c", "a\nb\tc"]) == "python -c a b c"
    assert one_line(["x" * 500], limit=10) == "x" * 9 + "…"


def test_picker_lists_the_process_and_enter_returns_its_pid(python_job):
    async def go():
        app = PickerApp()
        async with app.run_test(size=(100, 30)) as pilot:
            from textual.widgets import DataTable

            table = app.query_one(DataTable)
            keys = [k.value for k in table.rows]
            assert str(python_job.pid) in keys
            table.move_cursor(row=keys.index(str(python_job.pid)))
            await pilot.press("enter")
            await pilot.pause()
        return app.return_value

    assert asyncio.run(go()) == python_job.pid


def test_picker_q_quits_with_no_pid(python_job):
    async def go():
        app = PickerApp()
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("q")
            await pilot.pause()
        return app.return_value

    assert asyncio.run(go()) is None
