#!/usr/bin/env python3
"""Make the README's screenshots: replay real recordings in the UI and save SVGs.

    python scripts/make_screenshots.py [RECORDING ...] [--out screenshots] [--at SECONDS]

Without RECORDING it uses the H200 recordings of the input-bound and GPU-bound scenarios. For each recording it pauses the replay
at ``--at`` seconds (default: 60% of the way in) and saves, into ``--out``:

    <name>-overview-80x24.svg   the overview as it looks in an 80x24 terminal over SSH
    <name>-overview.svg         the overview at 120x36 (verdict strip on top)
    <name>-verdicts.svg         the verdicts view: evidence, advice, timeline
    <name>-gpus.svg             the GPU view (every counter, with a minute of history)
    <name>-threads.svg          Python threads: state shares, DataLoader workers
    <name>-steps.svg            the in-process probe's step split
    <name>-processes.svg        the target's process tree and the host

Times are shown in UTC so the files do not change with the machine they are made on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gputop.session.recording import RecordingError  # noqa: E402
from gputop.session.replay import ReplaySession  # noqa: E402
from gputop.ui.app import GputopApp  # noqa: E402
from gputop.verdicts import default_processors  # noqa: E402

DEFAULT = ("input_bound", "gpu_bound")
REAL = ("hf_trainer-pid", "checkpoint_stall-pid")  # real training code, watched from its start
SHOTS = (  # (suffix, terminal size, view shown)
    ("overview-80x24", (80, 24), "overview"),
    ("overview", (120, 36), "overview"),
    ("verdicts", (120, 36), "verdicts"),
    ("gpus", (120, 48), "gpus"),
    ("threads", (120, 36), "threads"),
    ("steps", (120, 36), "steps"),
    ("processes", (120, 36), "procs"),
    ("time", (120, 36), "time"),
)


async def whole_pass_done(app, pilot, timeout_s: float = 60.0) -> None:
    """The verdicts view reads the whole recording in a worker ("Reading the whole recording…
    N%" meanwhile): the shot waits for its timeline, so it does not depend on the machine's speed."""
    from gputop.ui.panels.verdict_timeline import VerdictTimeline

    timeline = next(p for p in app.panels["verdicts"] if isinstance(p, VerdictTimeline))
    deadline = time.monotonic() + timeout_s
    while timeline.timeline is None and time.monotonic() < deadline:
        await pilot.pause(0.05)
    app.redraw_now()
    await pilot.pause()


async def shoot(recording: str, out: str, at: float | None) -> list[str]:
    name = pathlib.Path(recording).stem
    made = []
    for suffix, size, view in SHOTS:
        # The verdicts are recomputed from the raw samples, as `gputop replay` does.
        session = ReplaySession(recording, processors=default_processors(), start_playing=False)
        position = at if at is not None else session.t_start + 0.6 * (session.t_end - session.t_start)
        session.seek(position)
        app = GputopApp(session, start_view=view)
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.3)
            if view == "verdicts":
                await whole_pass_done(app, pilot)
            filename = f"{name}-{suffix}.svg"
            app.save_screenshot(filename=filename, path=out)
            made.append(os.path.join(out, filename))
        session.stop()
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="replay recordings and save the README's SVG screenshots")
    p.add_argument("recordings", nargs="*", help="default: tests/data/*.gtrec")
    p.add_argument("--out", default=str(ROOT / "screenshots"))
    p.add_argument("--at", type=float, help="replay position in seconds (default: 60%% of each recording)")
    a = p.parse_args(argv)
    os.environ["TZ"] = "UTC"
    time.tzset()
    recordings = a.recordings or ([str(ROOT / "tests" / "data" / "h200" / f"{n}.gtrec") for n in DEFAULT]
                                  + [str(ROOT / "tests" / "data" / "h200" / "real" / f"{n}.gtrec") for n in REAL])
    if not recordings:
        print("make_screenshots: no recordings given and none in tests/data", file=sys.stderr)
        return 1
    os.makedirs(a.out, exist_ok=True)
    for rec in recordings:
        try:
            made = asyncio.run(shoot(rec, a.out, a.at))
        except RecordingError as e:
            print(f"make_screenshots: {e}", file=sys.stderr)
            return 1
        for path in made:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
