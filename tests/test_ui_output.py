"""The Output view (issue 12 item 2, UI part): the job's output log that ``gputop run`` writes
in the UI, tailed at the UI's tick from a bounded read of its end, control characters stripped;
its path in the Sources view; reached with tab and listed in the help."""

from __future__ import annotations

import asyncio
import io
import pathlib
import subprocess
import sys

from rich.console import Console

from gputop.session.replay import ReplaySession
from gputop.ui import joblog
from gputop.ui.app import GputopApp, HelpScreen
from gputop.ui.panels.output import JobOutput
from gputop.ui.panels.sources import SessionFacts

DATA = pathlib.Path(__file__).parent / "data" / "h200"

JOB = r"""
import sys
for i in range(1, 301):
    print(f"step {i} loss {1.0 / i:.4f}")
print("\x1b[31mred warning\x1b[0m and a bell\x07")
print("progress 10%\rprogress 50%\rprogress 100%")
print("tab\tseparated", file=sys.stderr)
"""


def screen_text(app) -> str:
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def _job_log(tmp_path: pathlib.Path) -> pathlib.Path:
    """A real job's stdout and stderr in a log, as gputop run writes it."""
    path = tmp_path / "run-1-x.log"
    with open(path, "wb") as f:
        subprocess.run([sys.executable, "-c", JOB], stdout=f, stderr=f, check=True, timeout=30)
    return path


def _session() -> ReplaySession:
    s = ReplaySession(str(DATA / "input_bound.gtrec"), start_playing=False)
    s.seek(s.t_start + 10.0)
    return s


def test_output_view_tails_the_log_and_follows_it(tmp_path):
    path = _job_log(tmp_path)

    async def go():
        app = GputopApp(_session(), refresh_hz=10, job_log=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            ids = [v.id for v in app.view_specs]
            assert ids[-1] == "output" and len(ids) == 11  # after the ten number keys: tab only
            await pilot.press("shift+tab")  # from the overview back round to the last view
            await pilot.pause(0.3)
            assert app.current_view == "output"
            panel = next(p for p in app.panels["output"] if isinstance(p, JobOutput))
            text = panel.text.plain
            screen = screen_text(app)
            with open(path, "a") as f:  # the job prints on: shown at the next draw (once a second)
                f.write("step 301 after the view opened\n")
            await pilot.pause(1.3)
            later = panel.text.plain
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            help_text = screen_text(app)
            await pilot.press("escape")
            await pilot.press("shift+tab")  # Sources, the tenth view
            await pilot.pause(0.3)
            facts = next(p for p in app.panels["sources"] if isinstance(p, SessionFacts))
            return text, screen, later, help_text, facts.text.plain

    text, screen, later, help_text, sources = asyncio.run(go())
    lines = text.splitlines()
    assert lines[0].startswith("log ") and str(path)[:30] in lines[0]
    body = lines[1:]
    assert len(body) == joblog.MAX_LINES  # the last 200 lines, not the whole file
    assert "step 300 loss" in text and "step 104 loss" in text and "step 103 loss" not in text
    assert "red warning and a bell" in text and "\x1b" not in text and "\x07" not in text
    assert "progress 100%" in body and "progress 10%" not in text  # what a terminal would show
    assert "tab    separated" in text
    assert "tab    separated" in screen  # it follows the end, as tail -f does
    assert "step 301 after the view opened" in later
    assert "Output (tab)" in " ".join(help_text.split())
    assert "job output" in sources and str(path)[:20] in sources.replace("\n", "")


def test_no_log_no_output_view():
    app = GputopApp(_session())
    assert "output" not in [v.id for v in app.view_specs]


def test_tail_reads_a_bounded_end_of_a_big_log(tmp_path):
    path = tmp_path / "big.log"
    with open(path, "w") as f:
        f.write("x" * (8 * 1024 * 1024) + "\n")  # one 8 MiB line first: never read whole
        for i in range(5):
            f.write(f"line {i}\n")
    got = joblog.tail_lines(str(path))
    assert got[-5:] == [f"line {i}" for i in range(5)]
    assert sum(len(x) for x in got) <= joblog.MAX_BYTES
    # a missing log is one line in the view, never an exception
    tail = joblog.LogTail(str(tmp_path / "gone.log"))
    assert tail.lines() == [] and "cannot read" in tail.error


def test_bidirectional_controls_never_reach_the_screen():
    """U+202E (right-to-left override) shows what follows backwards: "gnp.exe" for "exe.png".
    A job's output (the Output view) and recorded text (the report, the UI) drop or write out
    every bidi control, as they do escape sequences."""
    from gputop.session.sanitize import BIDI_CONTROLS, printable

    line = "saved to report\u202egnp.exe and \u2066isolated\u2069 \u200fmark"
    shown = joblog.clean_line(line)
    assert not any(c in shown for c in BIDI_CONTROLS) and "gnp.exe" in shown
    text = printable(line)
    assert not any(c in text for c in BIDI_CONTROLS) and "\\u202e" in text
