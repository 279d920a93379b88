"""The README's install story (issue 12 item 10): its first two commands stay what CI and a
newcomer run, it installs from a clone (never `pip install gputop`, another project), shows the
CPU-only torch line and the GPU panels without a GPU."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _bash_blocks() -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", README, re.S)]


def test_the_first_two_commands_are_unchanged():
    blocks = _bash_blocks()
    assert blocks[0] == "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/gputop demo"
    assert blocks[1] == "bash scripts/test.sh"
    assert (ROOT / "scripts" / "test.sh").is_file()


def test_install_from_a_clone_never_from_pypi():
    commands = "\n".join(_bash_blocks())
    assert not re.search(r"pip install (gputop|gputop-triage)\b", commands)
    for line in README.splitlines():
        if "pip install gputop" in line:
            assert "never" in line or "unrelated" in line, line
    assert "pipx install ." in commands
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in commands


def test_the_gpu_panels_without_a_gpu_are_suggested():
    assert "`gputop demo --replay`" in README
    from gputop.cli import build_parser

    demo = build_parser()._subparsers._group_actions[0].choices["demo"]
    assert "--replay" in demo.format_help()  # the command the README names exists
