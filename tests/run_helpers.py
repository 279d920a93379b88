"""What the tests of `gputop run` share: a private home for gputop's state, runtime and probe
directories, whether a PID still runs (a zombie does not), and workloads' --json reports."""

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


def _headless_cmd(workload: str, job_args: tuple[str, ...], seconds: int) -> list[str]:
    return [sys.executable, "-m", "gputop", "run", "--headless", "--duration", str(seconds), "--json", "--",
            sys.executable, str(ROOT / "tests" / "workloads" / workload), *job_args]


def headless_reports(*runs: tuple[str, tuple[str, ...], int]) -> list[dict]:
    """The --json reports of ``gputop run --headless --duration SECONDS --json -- python
    tests/workloads/WORKLOAD ARGS...`` for each (WORKLOAD, ARGS, SECONDS), run at once (each job is
    stopped when its duration ends)."""
    procs = [subprocess.Popen(_headless_cmd(w, args, secs), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for w, args, secs in runs]
    try:
        outs = [(*p.communicate(timeout=180), p.returncode) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for (w, args, _secs), (_stdout, stderr, rc) in zip(runs, outs):
        assert rc == 0, (w, args, stderr[-2000:])
    return [json.loads(stdout) for stdout, _stderr, _rc in outs]
