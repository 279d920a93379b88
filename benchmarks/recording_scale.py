"""Recording size per minute, and the time to open, seek and report a one-hour recording.

    python benchmarks/recording_scale.py OUTDIR [--source tests/data/h200/input_bound.gtrec] [--minutes 60]

A real recording (by default an H200 session of the input-bound scenario, with every source
running at its defaults) is tiled in time — its chunks written again and again with shifted
timestamps — into a recording of ``--minutes``, so the long file has a real session's content
and density. Then it measures: bytes per minute; the time to open it for replay (index from
frame headers), to seek to its middle and to its end; and the time of ``gputop report``
with and without recomputing the verdicts (the report replays every second through the
verdict engine). Prints a table and writes OUTDIR/recording_scale.json.

The tiled file has no summary frames (its chunks are copied, not written by the recorder): this
measures the path of files from gputop before format 1.1. benchmarks/long_recording.py builds
the long file through the recorder itself and measures the summary path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gputop.model import Sample
from gputop.report import build_report
from gputop.session.recording import RecordingReader, RecordingWriter
from gputop.session.replay import ReplaySession
from gputop.verdicts import default_processors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tile(src: str, dst: str, minutes: float) -> tuple[float, float]:
    with RecordingReader(src) as r:
        meta = dict(r.meta)
        chunks = [r.read_chunk(c) for c in r.index.chunks]
        span = r.index.t_end - r.index.t_start
        src_bytes = os.path.getsize(src)
    period = span + 1.0
    w = RecordingWriter(dst, meta)
    t_shift = 0.0
    while t_shift < minutes * 60.0:
        for samples in chunks:
            w.write_samples([Sample(s.t + t_shift, s.kind, s.key, s.data) for s in samples])
        t_shift += period
    w.close({"clean": True, "tiled_from": os.path.basename(src)})
    return span, src_bytes / (span / 60.0)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--source", default=os.path.join(ROOT, "tests", "data", "h200", "input_bound.gtrec"))
    ap.add_argument("--minutes", type=float, default=60.0)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    dst = os.path.join(a.outdir, "long.gtrec")
    if os.path.exists(dst):
        os.remove(dst)
    span, src_bpm = tile(a.source, dst, a.minutes)
    size = os.path.getsize(dst)

    t_open, session = timed(lambda: ReplaySession(dst, processors=default_processors(), start_playing=False))
    mid = (session.t_start + session.t_end) / 2
    t_seek_mid, _ = timed(lambda: session.seek(mid))
    t_seek_end, _ = timed(lambda: session.seek(session.t_end))
    t_step, _ = timed(lambda: session.seek_relative(-10.0))
    duration = session.t_end - session.t_start
    session.stop()
    t_report_plain, _ = timed(lambda: build_report(dst, recompute_verdicts=False))
    t_report, rep = timed(lambda: build_report(dst))
    out = {
        "source": os.path.relpath(a.source, ROOT), "source_span_s": round(span, 1),
        "source_mb_per_min": round(src_bpm / 1e6, 3),
        "long_minutes": round(duration / 60, 1), "long_bytes": size, "long_mb_per_min": round(size / 1e6 / (duration / 60), 3),
        "open_s": round(t_open, 3), "seek_middle_s": round(t_seek_mid, 3), "seek_end_s": round(t_seek_end, 3),
        "seek_back_10s_s": round(t_step, 3),
        "report_without_verdicts_s": round(t_report_plain, 3), "report_with_verdicts_s": round(t_report, 3),
        "primary_verdict": (rep.get("primary_verdict") or {}).get("id"), "cpu_count": os.cpu_count(),
    }
    with open(os.path.join(a.outdir, "recording_scale.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(f"source {out['source']}: {out['source_span_s']} s, {out['source_mb_per_min']} MB/min")
    print(f"tiled to {out['long_minutes']} min: {size / 1e6:.1f} MB ({out['long_mb_per_min']} MB/min)")
    print(f"{'open for replay':<32} {out['open_s']:>8.3f} s")
    print(f"{'seek to the middle':<32} {out['seek_middle_s']:>8.3f} s")
    print(f"{'seek to the end':<32} {out['seek_end_s']:>8.3f} s")
    print(f"{'seek back 10 s':<32} {out['seek_back_10s_s']:>8.3f} s")
    print(f"{'report (statistics only)':<32} {out['report_without_verdicts_s']:>8.3f} s")
    print(f"{'report (with verdicts replayed)':<32} {out['report_with_verdicts_s']:>8.3f} s")
    os.remove(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
