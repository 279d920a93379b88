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
    # the evidence sentence is its last window's (its figures are that window's; --json averages
    # them over the active time): the text says which span it is
    assert f"evidence, its last window: {p['summary']}" in text


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


ONE_EPOCH = """\
import time, torch
from torch.utils.data import DataLoader, Dataset

class Busy(Dataset):
    def __len__(self):
        return 240

    def __getitem__(self, i):
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass
        return torch.zeros(16)

if __name__ == "__main__":
    model = torch.nn.Linear(16, 4)
    for batch in DataLoader(Busy(), batch_size=4, num_workers=2):   # one epoch: 2 workers, once
        model(batch).sum().backward()
"""


def test_dataloader_workers_are_counted_per_process_not_per_thread(tmp_path):
    """A real one-epoch torch job with num_workers=2: each worker process has threads of its
    own (QueueFeederThread, a resource-sharing thread), which the report counted as workers
    ("seen over the session (6; ..."). It must say the 2 processes ps shows (issue 31, item 8)."""
    import time

    import psutil
    import pytest

    pytest.importorskip("torch")
    script = tmp_path / "one_epoch.py"
    script.write_text(ONE_EPOCH)
    job = subprocess.Popen([sys.executable, str(script)])
    rec = tmp_path / "epoch.gtrec"
    seen: set[int] = set()
    try:
        g = subprocess.Popen([sys.executable, "-m", "gputop", "--pid", str(job.pid), "--headless", "--duration", "14",
                              "--record", str(rec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        while g.poll() is None:   # the job's children, as ps shows them
            try:
                seen |= {c.pid for c in psutil.Process(job.pid).children()}
            except psutil.Error:
                pass
            time.sleep(0.1)
        out, err = g.communicate(timeout=60)
    finally:
        job.kill()
        job.wait()
    assert g.returncode == 0, err
    assert len(seen) == 2, seen
    rep = json.loads(gputop_cmd("report", str(rec), "--json").stdout)
    workers = rep["stacks"]["dataloader_workers"]
    assert {w["pid"] for w in workers} == seen, workers
    assert len(workers) == 2 and all(w["threads"] >= 1 for w in workers), workers
    assert sum(w["threads"] for w in workers) > 2, "the workers' own threads are summed into their process"
    line = next(ln for ln in out.splitlines() if "DataLoader worker processes seen over the session" in ln)
    assert "session (2; " in line, line
    assert len(line.split("CPU ", 1)[1].split(", ")) == 2, line
