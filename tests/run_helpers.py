"""What the tests of `gputop run` share: a private home for gputop's state, runtime and probe
directories, whether a PID still runs (a zombie does not), and a workload's --json report."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def private_home(tmp_path, monkeypatch):
    """gputop's directories under ``tmp_path`` (0700), and this checkout on PYTHONPATH."""
    for d in ("state", "run", "tmp"):
        (tmp_path / d).mkdir(mode=0o700)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("GPUTOP_PROBE_DIR", str(tmp_path / "probe"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return tmp_path


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def headless_report(workload: str, *job_args: str, seconds: int) -> dict:
    """``gputop run --headless --duration SECONDS --json -- python tests/workloads/WORKLOAD ...``'s
    report (the job is stopped when the duration ends)."""
    cmd = [sys.executable, "-m", "gputop", "run", "--headless", "--duration", str(seconds), "--json", "--",
           sys.executable, str(ROOT / "tests" / "workloads" / workload), *job_args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)
