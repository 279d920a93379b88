"""What the tests of `gputop run` share: a private home for gputop's state, runtime and probe
directories, and whether a PID still runs (a zombie does not)."""

from __future__ import annotations

import pathlib

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
