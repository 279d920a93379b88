"""The report's words (issue 12 item 13): a finished session says why there was no verdict over
it, the first verdict's two times are labelled, the target tree's rows have labels and units,
terse host rows are explained, and a multi-line `-c` command is one line (also in the stderr line
of --headless, cut between words). Real recordings, a real headless session of a real process."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
INPUT_BOUND = ROOT / "tests" / "data" / "h200" / "input_bound.gtrec"


def gputop_cmd(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_the_first_verdicts_two_times_are_labelled_and_match_the_json():
    text = gputop_cmd("report", str(INPUT_BOUND)).stdout
    rep = json.loads(gputop_cmd("report", str(INPUT_BOUND), "--json").stdout)
    p = rep["primary_verdict"]
    held = rep["verdicts"][p["id"]]["first_seen_s"]
    assert held < p["first_seen_s"]  # the rule held before the verdict turned on: two numbers
    assert f"from {p['first_seen_s']:.0f} s (its rule held from {held:.0f} s)" in text
    assert f"first verdict named {rep['first_verdict_s']:.1f} s after the session started" in text
    assert "first_seen_s in --json is when the rule first held" in text


def test_rows_have_labels_and_terse_ones_are_explained():
    text = gputop_cmd("report", str(INPUT_BOUND)).stdout
    assert "cpu_pct" not in text and "\n  processes " not in text
    assert "CPU (100% = 1 core)" in text and "process count" in text and "memory (RSS)" in text
    assert "    mem stall all: share of time all non-idle tasks were stalled on memory at once" in text


def test_a_short_session_of_a_multiline_c_command(tmp_path):
    script = "import time\n" + "\n".join(f"x{i} = {i}" for i in range(30)) + "\nwhile True:\n    time.sleep(0.1)\n"
    job = subprocess.Popen([sys.executable, "-c", script])
    rec = tmp_path / "short.gtrec"
    try:
        r = gputop_cmd("--pid", str(job.pid), "--headless", "--duration", "2", "--no-stacks", "--record", str(rec))
    finally:
        job.kill()
        job.wait()
    assert r.returncode == 0, r.stderr
    watching = [ln for ln in r.stderr.splitlines() if ln.startswith("gputop: watching PID")]
    assert len(watching) == 1, r.stderr
    shown = watching[0].split("(", 1)[1].split(") for ")[0]
    assert shown.endswith("…") and len(shown) <= 80
    whole = " ".join(f"{sys.executable} -c {script}".split()) + " "
    assert whole.startswith(f"{shown[:-1]} ")  # cut between words, not in one
    target = [ln for ln in r.stdout.splitlines() if ln.startswith("  target   PID")]
    assert len(target) == 1 and "import time x0 = 0 x1 = 1" in target[0] and "time.sleep(0.1)" in target[0]
    # too short to judge: the report says so, in words for after the end
    assert "no verdict: collecting evidence" not in r.stdout
    assert "no verdict over the session: the session ended while gputop was still collecting evidence" in r.stdout
