"""Long recordings: build one through the recorder, then time its report, replay open and seeks.

    python benchmarks/long_recording.py OUTDIR [--hours 1] [--source tests/data/h200/real/hf_trainer-run.gtrec]
                                              [--seeks 20] [--play-minutes 10] [--keep]
    python benchmarks/long_recording.py OUTDIR --profile [--minutes 10]     # the recorder's CPU by part
    python benchmarks/long_recording.py OUTDIR --seek-only FILE [--seeks 20]

1. Builds OUTDIR/long.gtrec by feeding a real recording's samples, looped with shifted times
   until they cover ``--hours``, through the recorder itself (session/rerecord.py: each chunk
   handed to ``Recorder.on_samples`` and written by ``Recorder.flush``, summary frames included,
   so the file has whatever the recorder writes). Measures the recorder's CPU per recorded
   second and the growth of this process's RSS while it writes (the recorder and its summaries
   over simulated hours: the live side's new memory).
2. ``gputop report FILE`` in a fresh process: wall time and peak RSS (the summary frames are
   merged), and the same report built by reading every sample (``--full``) for comparison.
3. ``ReplaySession`` (the replay's engine) in a fresh process: open, then ``--seeks`` seeks to
   random points (median and max), then ``--play-minutes`` of playback at full speed from a
   random point; peak RSS and RSS growth while playing.
Prints a table and writes OUTDIR/long_recording.json. The file is removed unless ``--keep``.

``--profile`` only records ``--minutes`` (with summary frames) and splits the recorder's CPU
(``time.thread_time``, this thread: the recorder's work runs here) per recorded minute into its
parts, each part's own time without the parts it calls: encode/write, the summary chain's decode
and validate of the chunk just written, sanitize, the report statistics, the processors, the
chain's feeding of the store, and the rest of ``Recorder.flush``. Writes OUTDIR/recorder_profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gputop.session.recorder import SUMMARY_S  # noqa: E402
from gputop.session.rerecord import rerecord  # noqa: E402
from gputop.verdicts.recording_summary import RecordingSummarizer  # noqa: E402

_REPLAY = r"""
import json, random, resource, sys, time
from gputop.session.replay import ReplaySession
from gputop.verdicts import default_processors
path, seeks, play_min = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
t = time.perf_counter()
s = ReplaySession(path, processors=default_processors(), start_playing=False)
open_s = time.perf_counter() - t
rng = random.Random(14)
times, cpu = [], []
for _ in range(seeks):
    at = rng.uniform(s.t_start, s.t_end)
    t, c = time.perf_counter(), time.process_time()
    s.seek(at)
    times.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
first_cpu = cpu[0] if cpu else None   # the first: no stack of the file named yet
times.sort(); cpu.sort()
start = rng.uniform(s.t_start, max(s.t_start, s.t_end - play_min * 60))
s.seek(start)
base = rss(); peak_play = base
t = time.perf_counter()
for k in range(int(play_min * 60)):
    s.play_to(start + k + 1)
    if k % 30 == 0:
        peak_play = max(peak_play, rss())
play_s = time.perf_counter() - t
s.stop()
print(json.dumps({"open_s": open_s, "seek_median_s": times[len(times) // 2] if times else None,
                  "seek_max_s": times[-1] if times else None, "seek_cpu_median_s": cpu[len(cpu) // 2] if cpu else None,
                  "seek_cpu_max_s": cpu[-1] if cpu else None, "seek_cpu_first_s": first_cpu, "play_s": play_s,
                  "play_growth_mib": (peak_play - base) / 2**20,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _child(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of a fresh process; its CPU seconds in ``_CPU[-1]``."""
    import tempfile

    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env={**os.environ, "PYTHONPATH": ROOT})
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd[:4])} failed: {err.read().decode()[-400:]}")
    _CPU.append(ru.ru_utime + ru.ru_stime)
    return wall, ru.ru_maxrss / 1024, out.decode()


_CPU: list[float] = []


class _Parts:
    """Exclusive thread CPU per part: wrapped callables charge their own time, less that of the
    wrapped callables they call (those charge theirs)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list] = []   # [part, child seconds]

    def wrap(self, owner, attr: str, part) -> None:
        """``part``: a name, or a function of the call's arguments giving one."""
        fn = getattr(owner, attr)
        parts, clock = self, time.thread_time

        def timed(*args, **kw):
            name = part if isinstance(part, str) else part(*args)
            frame = [name, 0.0]
            parts._stack.append(frame)
            t = clock()
            try:
                return fn(*args, **kw)
            finally:
                dt = clock() - t
                parts._stack.pop()
                parts.cpu[name] = parts.cpu.get(name, 0.0) + dt - frame[1]
                parts.calls[name] = parts.calls.get(name, 0) + 1
                if parts._stack:
                    parts._stack[-1][1] += dt

        setattr(owner, attr, timed)


def profile_recorder(a) -> int:
    """The recorder's CPU per recorded minute, by part (see the module's docstring)."""
    from gputop.derive.record_stats import StatsPartial
    from gputop.session import recorder as R
    from gputop.session import summary_chain as C
    from gputop.verdicts import recording_summary as S

    parts = _Parts()
    # the summary chain's processors run through C.run_processor; at_end only at finish
    parts.wrap(C, "run_processor", lambda p, store, now: f"processor {p.name}")
    parts.wrap(C.IncrementalReplay, "_feed", "chain: feed the store (bus, SampleStore)")
    parts.wrap(C, "clean_samples", "chain: sanitize (clean_samples)")
    parts.wrap(C, "samples_of", "chain: series -> samples (samples_of)")
    parts.wrap(C.IncrementalReplay, "add_chunk", "chain: add_chunk, rest")
    parts.wrap(R, "decode_payload", "summary: decode the chunk written (decode_payload)")
    parts.wrap(R, "validate_chunk", "summary: validate it (validate_chunk)")
    parts.wrap(S, "clean_chunk", "sanitize, once for stats and chain (clean_chunk)")
    parts.wrap(StatsPartial, "add", "stats: StatsPartial.add")
    parts.wrap(S.RecordingSummarizer, "take", "summary frame: take (to JSON)")
    parts.wrap(R.RecordingWriter, "write_summary", "summary frame: write")
    parts.wrap(R.RecordingWriter, "write_samples", "chunk: encode + write")
    parts.wrap(R.Recorder, "flush", "recorder: flush, rest")
    parts.wrap(R.Recorder, "stop", "recorder: stop (final summary), rest")
    dst = os.path.join(a.outdir, "profile.gtrec")
    if os.path.exists(dst):
        os.remove(dst)
    c0 = time.thread_time()
    rec = rerecord(a.source, dst, S.RecordingSummarizer(), span_s=a.minutes * 60.0)
    total = time.thread_time() - c0
    if rec.error or rec.summary_error:
        raise SystemExit(f"recording failed: {rec.error or rec.summary_error}")
    from gputop.session.recording import RecordingReader

    with RecordingReader(dst) as r:
        minutes = (r.index.t_end - r.index.t_start) / 60.0
    os.remove(dst)
    per_min = {k: v / minutes for k, v in sorted(parts.cpu.items(), key=lambda kv: -kv[1])}
    recorder = sum(per_min.values())
    res = {"source": os.path.relpath(a.source, ROOT), "recorded_minutes": round(minutes, 2),
           "recorder_cpu_s_per_recorded_minute": round(recorder, 4),
           "feeding_cpu_s_per_recorded_minute": round(total / minutes - recorder, 4),   # rerecord's own loop
           "parts_cpu_s_per_recorded_minute": {k: round(v, 5) for k, v in per_min.items()},
           "calls": parts.calls, "cpu_count": os.cpu_count()}
    with open(os.path.join(a.outdir, "recorder_profile.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(f"recorder CPU {recorder:.4f} s per recorded minute ({100 * recorder / 60:.3f}% of a core in real "
          f"time) over {minutes:.1f} recorded minutes of {res['source']}")
    for k, v in per_min.items():
        print(f"  {k:<52} {v * 1000:8.2f} ms/min  {100 * v / recorder:5.1f}%")
    return 0


def _seek_only(a) -> int:
    """The replay part alone, on a file built before: CPU seconds of each seek (process_time)."""
    _, _, out = _child([sys.executable, "-c", _REPLAY, a.seek_only, str(a.seeks), str(a.play_minutes)])
    rp = json.loads(out.strip().splitlines()[-1])
    res = {k: round(v, 3) for k, v in rp.items() if isinstance(v, float)}
    res.update({"file": a.seek_only, "seeks": a.seeks, "loadavg": os.getloadavg()[0], "cpu_count": os.cpu_count()})
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "long_recording_seek.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(f"replay open {res['open_s']:.3f} s; {a.seeks} seeks: CPU median {res['seek_cpu_median_s']:.3f} s, "
          f"max {res['seek_cpu_max_s']:.3f} s, first {res['seek_cpu_first_s']:.3f} s; wall median "
          f"{res['seek_median_s']:.3f} s, max {res['seek_max_s']:.3f} s (load average {res['loadavg']:.1f})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--source", default=os.path.join(ROOT, "tests", "data", "h200", "real", "hf_trainer-run.gtrec"))
    ap.add_argument("--seeks", type=int, default=20)
    ap.add_argument("--play-minutes", type=float, default=None, help="default 10 (0 with --seek-only)")
    ap.add_argument("--no-full", action="store_true", help="skip the report built from every sample")
    ap.add_argument("--baseline-minutes", type=float, default=5.0,
                    help="also record this long without summary frames: the recorder's own CPU")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--summary-s", type=float, default=None, help="seconds per summary frame (default: the recorder's)")
    ap.add_argument("--profile", action="store_true", help="only the recorder's CPU by part")
    ap.add_argument("--minutes", type=float, default=10.0, help="recorded minutes for --profile")
    ap.add_argument("--seek-only", metavar="FILE", help="only time the replay's seeks on FILE (a --keep'd long.gtrec)")
    a = ap.parse_args()
    if a.play_minutes is None:
        a.play_minutes = 0.0 if a.seek_only else 10.0
    if a.seek_only:
        return _seek_only(a)
    os.makedirs(a.outdir, exist_ok=True)
    if a.profile:
        return profile_recorder(a)
    dst = os.path.join(a.outdir, "long.gtrec")
    if os.path.exists(dst):
        os.remove(dst)

    rss_rows = []
    rss0 = _rss()
    cpu0, t0 = time.process_time(), time.perf_counter()
    rec = rerecord(a.source, dst, RecordingSummarizer(), span_s=a.hours * 3600.0,
                   summary_s=a.summary_s if a.summary_s else SUMMARY_S, progress=lambda f: rss_rows.append((f, _rss())))
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if rec.error or rec.summary_error:
        raise SystemExit(f"recording failed: {rec.error or rec.summary_error}")
    base_cpu = None
    if a.baseline_minutes > 0:
        plain = os.path.join(a.outdir, "plain.gtrec")
        if os.path.exists(plain):
            os.remove(plain)
        c = time.process_time()
        rerecord(a.source, plain, None, span_s=a.baseline_minutes * 60.0)
        base_cpu = (time.process_time() - c) / (a.baseline_minutes * 60.0)
        os.remove(plain)
    from gputop.session.recording import RecordingReader

    with RecordingReader(dst) as r:
        span = r.index.t_end - r.index.t_start
        n_summaries = len(r.index.summaries)
    size = os.path.getsize(dst)
    # growth after the first 10 % (imports, the stores filling their 300 s windows)
    warm = next((m for f, m in rss_rows if f >= 0.1), rss_rows[0][1] if rss_rows else rss0)
    grow = (max(m for _, m in rss_rows) - warm) / 2**20 if rss_rows else None

    py = sys.executable
    rep_s, rep_rss, _ = _child([py, "-m", "gputop", "report", dst, "--json"])
    rep_cpu = _CPU[-1]
    full = None
    if not a.no_full:
        code = ("import sys, gputop.report as R; R._read_summaries = lambda reader: None; "
                "R.build_report(sys.argv[1])")
        full = _child([py, "-c", code, dst])
    _, _, out = _child([py, "-c", _REPLAY, dst, str(a.seeks), str(a.play_minutes)])
    rp = json.loads(out.strip().splitlines()[-1])

    res = {
        "source": os.path.relpath(a.source, ROOT), "hours": round(span / 3600, 3), "bytes": size,
        "mb_per_minute": round(size / 1e6 / (span / 60), 3), "summary_frames": n_summaries,
        "build_s": round(build_s, 1), "recorder_cpu_ms_per_recorded_s": round(1000 * build_cpu / span, 2),
        "recorder_cpu_ms_per_recorded_s_without_summaries": round(1000 * base_cpu, 2) if base_cpu else None,
        "recorder_rss_growth_mib": round(grow, 1) if grow is not None else None,
        "report_s": round(rep_s, 3), "report_cpu_s": round(rep_cpu, 3), "report_peak_rss_mib": round(rep_rss, 1),
        "report_full_s": round(full[0], 3) if full else None,
        "replay_open_s": round(rp["open_s"], 3), "seek_median_s": round(rp["seek_median_s"], 3),
        "seek_max_s": round(rp["seek_max_s"], 3),
        "seek_cpu_median_s": round(rp["seek_cpu_median_s"], 3), "seek_cpu_max_s": round(rp["seek_cpu_max_s"], 3),
        "play_minutes": a.play_minutes, "play_s": round(rp["play_s"], 2),
        "replay_play_growth_mib": round(rp["play_growth_mib"], 1), "replay_peak_rss_mib": round(rp["peak_rss_mib"], 1),
        "cpu_count": os.cpu_count(),
    }
    with open(os.path.join(a.outdir, "long_recording.json"), "w") as f:
        json.dump(res, f, indent=2)
    print(f"source {res['source']} looped to {res['hours']} h through the recorder in {res['build_s']} s "
          f"({res['recorder_cpu_ms_per_recorded_s']} ms CPU per recorded second)")
    rows = [("recorder CPU without summaries", f"{res['recorder_cpu_ms_per_recorded_s_without_summaries']} ms "
                                                "per recorded second"),
            ("file size", f"{size / 1e6:.1f} MB, {res['mb_per_minute']} MB/min, {n_summaries} summary frames"),
            ("recorder RSS growth", f"{res['recorder_rss_growth_mib']} MiB"),
            ("gputop report (summaries)", f"{res['report_s']:.3f} s wall, {res['report_cpu_s']:.3f} s CPU, "
                                          f"peak RSS {res['report_peak_rss_mib']} MiB"),
            ("report from every sample", f"{res['report_full_s']} s"),
            ("replay open", f"{res['replay_open_s']:.3f} s"),
            ("replay seek (median / max)", f"{res['seek_median_s']:.3f} / {res['seek_max_s']:.3f} s, CPU "
                                           f"{rp['seek_cpu_median_s']:.3f} / {rp['seek_cpu_max_s']:.3f} s"),
            (f"replay play {a.play_minutes:g} min",
             f"{res['play_s']} s, RSS growth {res['replay_play_growth_mib']} MiB, "
             f"peak {res['replay_peak_rss_mib']} MiB")]
    for k, v in rows:
        print(f"  {k:<30} {v}")
    if not a.keep:
        os.remove(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
