#!/usr/bin/env python3
"""Does the UI keep its tick (>= 4 Hz) with 8 GPUs of data, replayed without falling behind?

    python benchmarks/ui_tick.py OUT_DIR [--recording FILE] [--seconds 20] [--hz 5]
                                          [--size 120x40] [--speed 1]

Input: a real recording with samples of ONE GPU (default: the first tests/data/*.gtrec that has
"gpu" samples, i.e. the H200 recordings). It is turned into an 8-GPU recording by copying every
gpu / gpu_info / gpu_procs sample to keys 0..7 (the output says so): eight GPUs with identical
real numbers, which is what the UI's cost depends on (sample count, series, rows drawn).

The UI runs headless (App.run_test) at ``--size`` for ``--seconds``: half the time on the
overview, half on the GPU detail view (the costliest: 8 GPUs x 15 sparklines), replaying at
``--speed`` and looping to the start at the end of the file. Measured per phase: ticks, the
achieved tick rate, the tick handler's time (session.tick() + reading the store + drawing the
panels; Textual's own layout and render run between ticks and show up in the tick gaps), the
gaps between tick starts, and how far the replay clock fell behind wall time x speed.
Results: a table on stdout, OUT_DIR/ui_tick.txt and OUT_DIR/ui_tick.json.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import pathlib
import platform
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gputop.session.recording import RecordingError, RecordingReader, RecordingWriter  # noqa: E402
from gputop.model import Sample  # noqa: E402

GPU_KINDS = ("gpu", "gpu_info", "gpu_procs")
N_GPUS = 8


def find_recording() -> str | None:
    for path in sorted(glob.glob(str(ROOT / "tests" / "data" / "*.gtrec"))):
        try:
            with RecordingReader(path) as r:
                for ref in r.index.chunks[:20]:
                    if any(s.kind == "gpu" for s in r.read_chunk(ref)):
                        return path
        except RecordingError:
            continue
    return None


def make_eight_gpus(src: str, dst: str) -> dict:
    """Copy ``src`` to ``dst`` with every GPU sample of GPU key K0 repeated for keys 0..7."""
    with RecordingReader(src) as r:
        meta = dict(r.meta)
        chunks = [r.read_chunk(ref) for ref in r.index.chunks]
        t_start, t_end = r.index.t_start, r.index.t_end
    keys = sorted({s.key for c in chunks for s in c if s.kind == "gpu"})
    if not keys:
        raise SystemExit(f"ui_tick: {src} has no gpu samples: give a recording made on a GPU machine (--recording)")
    k0 = keys[0]
    meta["benchmark_note"] = f"8 GPUs made by copying GPU {k0} of {os.path.basename(src)} to keys 0-7"
    if os.path.exists(dst):
        os.remove(dst)
    w = RecordingWriter(dst, meta)
    n_in = n_out = 0
    for chunk in chunks:
        out = []
        for s in chunk:
            n_in += 1
            if s.kind in GPU_KINDS:
                if s.key != k0:
                    continue  # other GPUs of the source are dropped: 8 copies of one GPU
                out.extend(Sample(s.t, s.kind, str(g), s.data) for g in range(N_GPUS))
            else:
                out.append(s)
        n_out += len(out)
        w.write_samples(out)
    w.close({"clean": True})
    return {"source": src, "source_gpu": k0, "source_gpus": keys, "samples_in": n_in, "samples_out": n_out,
            "t_start": t_start, "t_end": t_end}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def measure(path: str, seconds: float, hz: float, size: tuple[int, int], speed: float) -> list[dict]:
    from gputop.session.replay import ReplaySession
    from gputop.ui.app import GputopApp

    session = ReplaySession(path, start_playing=True)
    session.set_speed(speed)
    app = GputopApp(session, refresh_hz=hz)
    phases = []
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.5)  # start-up, not measured
        for view_key, view in (("1", "overview"), ("2", "gpus")):
            await pilot.press(view_key)
            app.tick_log.clear()
            wall0, pos0, looped = time.monotonic(), session.position, 0.0
            lag_max = 0.0
            while time.monotonic() - wall0 < seconds / 2:
                await asyncio.sleep(0.05)
                if session.position >= session.t_end - 0.01:  # loop the file
                    looped += session.position - session.t_start
                    session.seek(session.t_start)
                    session.playing = True
                expected = (time.monotonic() - wall0) * speed
                lag_max = max(lag_max, expected - (session.position - pos0 + looped))
            wall = time.monotonic() - wall0
            log = list(app.tick_log)
            durations = [d * 1000 for _, d in log]
            starts = [s for s, _ in log]
            gaps = [(b - a) * 1000 for a, b in zip(starts, starts[1:])]
            phases.append({
                "view": view, "seconds": round(wall, 2), "ticks": len(log),
                "rate_hz": round(len(log) / wall, 2),
                "tick_ms_p50": round(statistics.median(durations), 2) if durations else None,
                "tick_ms_p95": round(pct(durations, 0.95), 2), "tick_ms_max": round(max(durations, default=0), 2),
                "gap_ms_p95": round(pct(gaps, 0.95), 1), "gap_ms_max": round(max(gaps, default=0), 1),
                "replay_lag_max_s": round(lag_max, 3), "tick_errors": app.tick_errors,
                "last_tick_error": app.last_tick_error,
            })
    session.stop()
    return phases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="UI tick rate with 8 GPUs of replayed data")
    p.add_argument("out_dir")
    p.add_argument("--recording", help="a real recording with one GPU (default: first in tests/data with GPU data)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hz", type=float, default=5.0, help="the UI's refresh rate (default 5, the app's default)")
    p.add_argument("--size", default="120x40", help="terminal size WxH (default 120x40)")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed (default 1)")
    a = p.parse_args(argv)
    src = a.recording or find_recording()
    if src is None:
        print("ui_tick: no recording with GPU samples in tests/data: pass one with --recording FILE "
              "(record one on a GPU machine: gputop --pid PID --headless --duration 30 --record FILE)",
              file=sys.stderr)
        return 1
    w, h = (int(x) for x in a.size.lower().split("x"))
    os.makedirs(a.out_dir, exist_ok=True)
    eight = os.path.join(a.out_dir, "eight_gpus.gtrec")
    made = make_eight_gpus(src, eight)
    phases = asyncio.run(measure(eight, a.seconds, a.hz, (w, h), a.speed))
    target_hz = min(a.hz, 4.0)
    ok = all(ph["rate_hz"] >= target_hz * 0.95 and ph["tick_errors"] == 0 and ph["replay_lag_max_s"] < 1.0
             for ph in phases)
    lines = [
        f"UI tick benchmark: {platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}",
        f"data: {made['source']}: GPU {made['source_gpu']} copied to GPUs 0-7 (8 identical real GPUs), "
        f"{made['t_end'] - made['t_start']:.0f} s looped, replay speed {a.speed:g}x",
        f"UI: {w}x{h} headless, refresh {a.hz:g} Hz (goal: >= 4 Hz, replay not falling behind)",
        "",
        f"{'view':<9} {'ticks':>6} {'rate Hz':>8} {'tick ms p50':>12} {'p95':>7} {'max':>7} "
        f"{'gap ms p95':>11} {'max':>7} {'lag s':>6}",
    ]
    for ph in phases:
        lines.append(f"{ph['view']:<9} {ph['ticks']:>6} {ph['rate_hz']:>8.2f} {ph['tick_ms_p50']:>12.2f} "
                     f"{ph['tick_ms_p95']:>7.2f} {ph['tick_ms_max']:>7.2f} {ph['gap_ms_p95']:>11.1f} "
                     f"{ph['gap_ms_max']:>7.1f} {ph['replay_lag_max_s']:>6.2f}")
    lines.append("")
    lines.append("RESULT: " + ("PASS" if ok else "FAIL") + f" (every phase >= {target_hz * 0.95:.2f} Hz, "
                 "no tick errors, replay lag < 1 s)")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out_dir, "ui_tick.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out_dir, "ui_tick.json"), "w") as f:
        json.dump({"data": made, "hz": a.hz, "size": [w, h], "speed": a.speed, "phases": phases, "pass": ok,
                   "host": platform.node(), "cpus": os.cpu_count()}, f, indent=2)
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
