"""Run the corpus (benchmarks/corpus/manifest.py) as it is and fixed, each variant under
``gputop run --headless`` with a recording, and measure each variant's steps/s from the job's own
``rate`` lines (never from gputop). On the H200: ``bash benchmarks/h200.sh corpus``.

    python benchmarks/corpus_run.py OUTDIR [--jobs a,b] [--seconds 14] [--variants as_is,fixed[,second]]

Writes OUTDIR/<job>-<variant>.gtrec (the recording), .json (gputop's report), .log (the job's
output and gputop's messages) and one line per variant in OUTDIR/results.jsonl. Scoring is
offline: benchmarks/corpus_score.py replays the recordings with today's rules.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "corpus"))
from manifest import SETS  # noqa: E402

RATE_LINE = re.compile(r"(?:^|[^\w.=-])rate (\S+) (\d+) (\S+)\s*$")   # common.Meter's line: rate R STEPS SECONDS
SETTLE_SHARE = 0.4   # the first 40% of a job's rate lines are its warm-up: not part of its steady rate


def steady_rate(text: str) -> tuple[float | None, int]:
    """The job's own steps/s after its warm-up, and how many ``rate`` lines it printed: the steps
    from the first line after the first SETTLE_SHARE of them to the last, over the seconds in
    between (not the median of the lines: a checkpoint or a blocking call that stops the loop for
    longer than a line's interval barely moves a median, and it is the cost being measured)."""
    points = []
    # a progress bar (tqdm) redraws with a carriage return and no newline: a rate line can follow
    # it on the same line, so the last "rate N STEPS SECONDS" of each piece is read, wherever it
    # starts (not inside a word: "iterate 1 2 3" is not one)
    for chunk in re.split(r"[\r\n]", text):
        found = RATE_LINE.findall(chunk)
        if found:
            _rate, n, t = found[-1]
            try:
                point = (int(n), float(t))
            except ValueError:
                continue
            if math.isfinite(point[1]) and point[1] >= 0:
                points.append(point)
    if not points:
        return None, 0
    if len(points) < 3:
        # a job so slow it printed one or two lines (a main thread starved of the GIL): its mean
        # rate since its first step (the meter's clock starts when that step ends, so it is not
        # in the time), warm-up included
        n1, t1 = points[-1]
        return ((n1 - 1) / t1 if n1 > 1 and t1 > 0 else None), len(points)
    (n0, t0), (n1, t1) = points[int(len(points) * SETTLE_SHARE)], points[-1]
    return ((n1 - n0) / (t1 - t0) if t1 > t0 else None), len(points)


def run_variant(job, variant: str, out: pathlib.Path, seconds: float, timeout: float | None = None) -> dict:
    stem = f"{job.name}-{variant}"
    rec, log = out / f"{stem}.gtrec", out / f"{stem}.log"
    for p in (rec, log):
        p.unlink(missing_ok=True)
    job_cmd = [sys.executable, str(HERE / "corpus" / f"{job.name}.py"), "--seconds", str(seconds)]
    if variant == "fixed":
        job_cmd.append("--fixed")
    elif variant == "second":
        job_cmd.extend(job.second_flags)
    extra = job.second_startup_s if variant == "second" else 0.0   # a compile before the first step
    # the job ends by itself; --duration is only a ceiling, and --stop-with-gputop ends a job that hangs
    cmd = [sys.executable, "-m", "gputop", "run", "--headless", "--stop-with-gputop", "--duration",
           str(seconds + 45 + extra), "--record", str(rec), "--json", "--", *job_cmd]
    t0 = time.monotonic()
    with open(out / f"{stem}.json", "w") as fo, open(log, "w") as fe:
        try:
            rc = subprocess.run(cmd, stdout=fo, stderr=fe, timeout=timeout or seconds + 90 + extra).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.monotonic() - t0
    text = log.read_text(errors="replace")
    rate, lines = steady_rate(text)
    try:
        report = json.loads((out / f"{stem}.json").read_text())
        primary = (report.get("primary_verdict") or {}).get("id")
    except (OSError, ValueError):
        report, primary = None, None
    return {"job": job.name, "variant": variant, "rc": rc, "steps_per_s": rate, "rate_lines": lines,
            "wall_s": round(wall, 1), "primary_at_run": primary, "report": report is not None,
            "error_tail": text[-600:] if rate is None or report is None else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--jobs", default="", help="comma-separated job names (default: every job)")
    ap.add_argument("--seconds", type=float, default=14.0,
                    help="seconds each variant trains (a job's own `seconds` in the manifest wins)")
    ap.add_argument("--variants", default="as_is,fixed",
                    help="comma-separated: as_is, fixed, second (a job's second fix, where the manifest has one)")
    ap.add_argument("--set", default="corpus", choices=sorted(SETS),
                    help="corpus: issue 29's 30 jobs; issue30: the jobs of issue 30's causes")
    ap.add_argument("--order", choices=("manifest", "holdout-first"), default="manifest",
                    help="holdout-first: the held-out third first (a device session too short for the whole "
                         "corpus still scores it)")
    ap.add_argument("--start", default="", help="JOB:VARIANT to start from (inclusive), in the chosen order: "
                                                 "the next device call goes on where the last one stopped")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no variant once this many seconds have passed less the longest variant so far "
                         "(a device call has a hard limit; its results are packed after this returns)")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in a.jobs.split(",") if n]
    unknown_jobs = [n for n in names if n not in {j.name for j in SETS[a.set]}]
    if unknown_jobs:
        print(f"corpus_run: --jobs {','.join(unknown_jobs)}: not in the {a.set} set "
              f"(benchmarks/corpus/manifest.py lists its jobs)", file=sys.stderr)
        return 2
    jobs = [j for j in SETS[a.set] if not names or j.name in names]
    if a.order == "holdout-first":
        jobs.sort(key=lambda j: not j.holdout)   # stable: manifest order within each group
    # ("second": a job's second fix, only where the manifest has one)
    variants = a.variants.split(",")
    unknown = [v for v in variants if v not in ("as_is", "fixed", "second")]
    if unknown:
        print(f"corpus_run: --variants {','.join(unknown)}: each variant is as_is, fixed or second", file=sys.stderr)
        return 2
    runs = [(j, v) for j in jobs for v in variants if v != "second" or j.second_flags]
    if a.start:
        keys = [f"{j.name}:{v}" for j, v in runs]
        if a.start not in keys:
            print(f"corpus_run: --start {a.start} is not one of this run's JOB:VARIANT", file=sys.stderr)
            return 2
        runs = runs[keys.index(a.start):]
    t_start, longest = time.monotonic(), 0.0
    with open(out / "results.jsonl", "a") as res:
        for i, (job, variant) in enumerate(runs):
            secs = job.seconds or a.seconds
            extra = job.second_startup_s if variant == "second" else 0.0
            # (a second fix that compiles first runs longer than any variant so far)
            need = max(longest, secs + 45 + extra) if extra else longest
            if a.budget_s and time.monotonic() - t_start + need > a.budget_s:
                print(f"budget: stopped before {job.name}:{variant} ({len(runs) - i} left)", flush=True)
                break
            # a hung variant must not carry the call past its limit: at most the budget's rest and 40 s
            cap = max(30.0, a.budget_s + 40 - (time.monotonic() - t_start)) if a.budget_s else None
            row = run_variant(job, variant, out, secs, min(secs + 90 + extra, cap) if cap else None)
            longest = max(longest, row["wall_s"])
            res.write(json.dumps(row) + "\n")
            res.flush()
            print(f"{job.name:28s} {variant:6s} rc={row['rc']} steps/s={row['steps_per_s']} "
                  f"wall={row['wall_s']}s primary={row['primary_at_run']}", flush=True)
            if i == 0 and (row["steps_per_s"] is None or not row["report"]):
                # a broken set-up (gputop or the job failing on this machine) would fail every variant:
                # stop, so a device call is not spent on it
                print(f"first variant broken: stopping. {row['error_tail'] or ''}", flush=True)
                return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
