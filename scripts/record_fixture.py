#!/usr/bin/env python3
"""Record the small real recording that the UI tests replay (tests/data/host_cpu_demo.gtrec).

It starts a bundled demo workload (by default ``input_bound``: a small MLP fed by a DataLoader
with 2 worker processes, on the CPU), watches it with the real sources exactly as
``gputop --pid PID --record FILE`` would (the host source, and the NVML source, which on a
machine without an NVIDIA driver records why the GPU panels are off), lets the workload end
by itself, and keeps recording a few seconds after, so the file holds the target's exit too.

    python scripts/record_fixture.py [OUT] [--scenario NAME] [--duration S] [--tail S]

OUT defaults to tests/data/host_cpu_demo.gtrec and is never overwritten (remove it first).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gputop.session.recording import Recorder, RecordingError, RecordingReader, RecordingWriter  # noqa: E402
from gputop.session.session import LiveSession, SessionClock, base_meta  # noqa: E402
from gputop.sources.host import HostSource  # noqa: E402
from gputop.sources.nvml import NvmlSource  # noqa: E402
from gputop.sources.target import Target  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=str(ROOT / "tests" / "data" / "host_cpu_demo.gtrec"))
    p.add_argument("--scenario", default="input_bound", help="demo workload scenario (default input_bound)")
    p.add_argument("--duration", type=float, default=16.0, help="how long the workload runs (s)")
    p.add_argument("--tail", type=float, default=4.0, help="keep recording this long after it exits (s)")
    a = p.parse_args(argv)
    if os.path.exists(a.out):
        print(f"record_fixture: {a.out} exists: remove it first to record a new one", file=sys.stderr)
        return 1

    child = subprocess.Popen([sys.executable, "-m", "gputop.demo.workload", "--scenario", a.scenario,
                              "--duration", str(a.duration)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        target = Target(child.pid)
        clock = SessionClock()
        # The same wiring as gputop --pid (gputop/cli.py), with the defaults' intervals.
        sources = [NvmlSource(clock, target, interval_s=0.1), HostSource(clock, target, interval_s=0.5)]
        meta = base_meta(clock, ["scripts/record_fixture.py", *(argv if argv is not None else sys.argv[1:])])
        meta["target"] = target.describe()
        meta["fixture"] = {"script": "scripts/record_fixture.py", "scenario": a.scenario,
                           "duration_s": a.duration, "tail_s": a.tail}
        try:
            recorder = Recorder(RecordingWriter(a.out, meta))
        except RecordingError as e:
            print(f"record_fixture: {e}", file=sys.stderr)
            return 1
        session = LiveSession(sources, clock, meta, recorder=recorder)
        session.start()
        exited_at = None
        deadline = time.monotonic() + a.duration + 60  # torch's import can be slow on a small VM
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if exited_at is None and child.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at >= a.tail:
                break
        session.stop({"stopped_by": "record_fixture"})
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    if child.returncode != 0:
        err = (child.stderr.read() or b"").decode(errors="replace").strip().splitlines()
        print(f"record_fixture: the workload failed (exit {child.returncode}): {err[-1] if err else ''}",
              file=sys.stderr)
        return 1
    with RecordingReader(a.out) as r:
        kinds: dict[str, int] = {}
        for ref in r.index.chunks:
            for s in r.read_chunk(ref):
                kinds[s.kind] = kinds.get(s.kind, 0) + 1
        print(f"{a.out}: {os.path.getsize(a.out)} bytes, {r.index.t_start:.1f}-{r.index.t_end:.1f} s, "
              f"clean end: {r.index.end is not None}")
        for k in sorted(kinds):
            print(f"  {k:<12} {kinds[k]:>6} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
