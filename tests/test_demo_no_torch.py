"""The demo's no-torch words (issue 31, item 9): the torch it suggests is the README's CPU build
(a plain ``pip install torch`` fetches the multi-GB CUDA build on Linux). A real workload
process in an interpreter where ``import torch`` fails."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from gputop.demo.workload import NO_TORCH, NO_TORCH_HINT, TORCH_CPU_INSTALL, needs_torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_install_line_is_the_readmes_cpu_build():
    readme = (ROOT / "README.md").read_text()
    assert f".venv/bin/{TORCH_CPU_INSTALL}\n" in readme
    assert TORCH_CPU_INSTALL.endswith("--index-url https://download.pytorch.org/whl/cpu")
    assert TORCH_CPU_INSTALL in NO_TORCH_HINT and "python_gil" in NO_TORCH_HINT
    assert TORCH_CPU_INSTALL in needs_torch("input_bound") and all(n in needs_torch("x") for n in NO_TORCH)


def test_a_workload_that_needs_torch_run_without_it_gives_the_cpu_line():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from gputop.demo.workload import main\nsys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", code, "--scenario", "input_bound", "--duration", "1"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip() == needs_torch("input_bound"), r.stderr


def test_the_ui_says_the_no_torch_hint_as_it_starts():
    """The hint printed before the UI takes the screen is hidden until the user quits: the UI
    shows it too, as a notification, when it starts (gputop demo without torch)."""
    import asyncio

    from gputop.session.replay import ReplaySession
    from gputop.ui.app import GputopApp

    rec = ROOT / "tests" / "data" / "h200" / "gil_contention.gtrec"

    async def run():
        session = ReplaySession(str(rec), start_playing=False)
        try:
            app = GputopApp(session, notice=NO_TORCH_HINT)
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.pause()
                return [n.message for n in pilot.app._notifications]
        finally:
            session.stop()

    said = asyncio.run(run())
    assert NO_TORCH_HINT in said and TORCH_CPU_INSTALL in NO_TORCH_HINT
