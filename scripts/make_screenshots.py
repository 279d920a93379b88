#!/usr/bin/env python3
"""Make the README's screenshots: replay real recordings in the UI and save SVGs.

    python scripts/make_screenshots.py [RECORDING ...] [--out screenshots] [--at SECONDS]

Without RECORDING it uses every tests/data/*.gtrec. For each recording it pauses the replay
at ``--at`` seconds (default: 60% of the way in) and saves, into ``--out``:

    <name>-overview-80x24.svg   the overview as it looks in an 80x24 terminal over SSH
    <name>-overview.svg         the overview at 120x36
    <name>-gpus.svg             the GPU view (every counter, with a minute of history)
    <name>-processes.svg        the target's process tree and the host
    <name>-help.svg             the help screen (keys, and every metric in one line)

Times are shown in UTC so the files do not change with the machine they are made on.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gputop.session.recording import RecordingError  # noqa: E402
from gputop.session.replay import ReplaySession  # noqa: E402
from gputop.ui.app import GputopApp  # noqa: E402

SHOTS = (  # (suffix, terminal size, keys pressed before the shot)
    ("overview-80x24", (80, 24), ()),
    ("overview", (120, 36), ()),
    ("gpus", (120, 48), ("2",)),
    ("processes", (120, 36), ("3",)),
    ("help", (100, 40), ("question_mark",)),
)


async def shoot(recording: str, out: str, at: float | None) -> list[str]:
    name = pathlib.Path(recording).stem
    made = []
    for suffix, size, keys in SHOTS:
        session = ReplaySession(recording, start_playing=False)
        position = at if at is not None else session.t_start + 0.6 * (session.t_end - session.t_start)
        session.seek(position)
        app = GputopApp(session)
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.2)
            for key in keys:
                await pilot.press(key)
            await pilot.pause(0.3)
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
    recordings = a.recordings or sorted(glob.glob(str(ROOT / "tests" / "data" / "*.gtrec")))
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
