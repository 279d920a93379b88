"""A GPU training loop that stops stepping, watched by `gputop --headless`: how long until it is
named `stalled`, which lines the snapshot names, and the GPU's state in it.

    python benchmarks/stall_h200.py OUT_DIR [--device cuda|cpu] [--stall-s 20] [--train-s 12]
                                            [--dim 4096] [--no-ranks]

Run 1: ``tests/workloads/stall_train.py --scenes sleep,lock --device cuda`` (one process, the
probe loaded as ``gputop run`` loads it): it trains (an MLP of width --dim, a few 4096-wide
matmuls a step keep the GPU busy), sleeps in ``stuck_in_sleep()`` for --stall-s, trains again,
waits --stall-s on a threading.Lock another thread holds, trains again and exits.
Run 2 (unless --no-ranks): two ranks (gloo on CUDA tensors, both on cuda:0 of a one-GPU machine)
where rank 1 sleeps in ``rank_elsewhere()`` while rank 0 waits in ``dist.all_reduce``.

Each run is watched by ``python -m gputop --pid JOB --headless --duration D --record
OUT_DIR/<run>.gtrec --json`` with the default thresholds (no step for max(10 s, 20x the median
step)). Afterwards the recording is read: for every stop, the time from the stop to the
``stalled`` verdict turning on and off after the steps resumed, the snapshot's places per rank
(and whether they are the workload's marked lines), its dump time, the GPU's state in it, and
the ticker thread's longest gap around the dump (a paused process would show one).

Prints a table and writes OUT_DIR/stall_h200.json (plus the recordings, reports and logs).
Without CUDA (``--device cpu``, or no GPU) it runs the same on the CPU: the GPU columns then
say n/a. Every wait has a timeout; the job is killed at the end whatever happened.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gputop.derive.stall import describe_snapshot, gpu_text  # noqa: E402
from gputop.session.launch import launch_with_probe  # noqa: E402
from gputop.session.recording import RecordingReader  # noqa: E402

WORKLOAD = os.path.join(ROOT, "tests", "workloads", "stall_train.py")
MARKS = {"sleep": "STALL-SLEEP", "lock": "STALL-LOCK", "collective": "STALL-ALLREDUCE"}


def marker_line(tag: str) -> int:
    with open(WORKLOAD) as f:
        for i, line in enumerate(f, 1):
            if re.search(rf"#\s*{tag}\b", line):
                return i
    raise SystemExit(f"stall_h200: no line marked {tag} in {WORKLOAD}")


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def run_one(out: str, name: str, job_args: list[str], watch_s: float) -> dict:
    rec = os.path.join(out, f"{name}.gtrec")
    events, ticks = os.path.join(out, f"{name}.events.jsonl"), os.path.join(out, f"{name}.ticks")
    for p in (rec, events):
        if os.path.exists(p):
            os.unlink(p)
    env = dict(os.environ, GPUTOP_PROBE_DIR=os.path.join(out, f"{name}.sock"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, WORKLOAD, "--events", events, "--ticks", ticks, *job_args]
    with open(os.path.join(out, f"{name}.job.log"), "w") as log:
        job = launch_with_probe(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wall0 = time.monotonic()
    try:
        with (
            open(os.path.join(out, f"{name}.report.json"), "w") as rep,
            open(os.path.join(out, f"{name}.gputop.err"), "w") as err,
        ):
            g = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gputop",
                    "--pid",
                    str(job.pid),
                    "--headless",
                    "--duration",
                    str(watch_s),
                    "--record",
                    rec,
                    "--json",
                ],
                stdout=rep,
                stderr=err,
                cwd=ROOT,
                timeout=watch_s + 60,
            )
        job.wait(timeout=30)
    finally:
        kill_group(job)
    r = RecordingReader(rec)
    start_wall = r.meta.get("start_wall")
    samples = [s for ref in r.index.chunks for s in r.read_chunk(ref)]
    evs = [json.loads(line) for line in open(events)]
    # the events' monotonic times -> session time: the recording starts at start_wall (wall
    # clock); the job wrote monotonic times, so map them through this machine's offset
    offset = time.time() - time.monotonic()
    for e in evs:
        e["t"] = e["t"] + offset - start_wall
    changes = [(s.t, s.get("active")) for s in samples if s.kind == "verdict_change" and s.key == "stalled"]
    shots = [s for s in samples if s.kind == "stall_snapshot"]
    tick_files = sorted(f for f in os.listdir(out) if f.startswith(f"{name}.ticks"))
    tick_rows = {
        f: [(float(t) + offset - start_wall, int(n)) for t, n in (ln.split() for ln in open(os.path.join(out, f)))]
        for f in tick_files
    }
    stops = []
    for scene in [e["scene"] for e in evs if e.get("start") and e.get("rank", 0) in (0, 1)]:
        if any(x["scene"] == scene for x in stops):
            continue
        starts = [e["t"] for e in evs if e.get("scene") == scene and e.get("start")]
        ends = [e["t"] for e in evs if e.get("scene") == scene and e.get("end")]
        start, end = min(starts), max(ends)
        on = [t for t, a in changes if a and start <= t <= end + 2]
        off = [t for t, a in changes if not a and on and t > on[0]]
        shot = next((s for s in shots if start <= s.t <= end), None)
        row = {
            "scene": scene,
            "stop_s": round(end - start, 1),
            "to_stalled_s": round(on[0] - start, 2) if on else None,
            "cleared_after_resume_s": round(off[0] - end, 2) if off else None,
        }
        if shot is not None:
            d = describe_snapshot(shot.data)
            t0, t1 = shot.data["t"], shot.data["t"] + (shot.data.get("dump_ms") or 0) / 1000.0
            gaps = []
            for rows in tick_rows.values():
                near = [t for t, _n in rows if t0 - 0.5 <= t <= t1 + 0.5]
                gaps += [b - a for a, b in zip(near, near[1:])]
            want = marker_line(MARKS[scene])
            row.update(
                {
                    "snapshot_at_s": round(shot.t - start, 2),
                    "dump_ms": shot.data.get("dump_ms"),
                    "places": {str(x["rank"]): x["where"] for x in d["ranks"]},
                    "collectives": {str(x["rank"]): x["collective"] for x in d["ranks"]},
                    "marked_line": want,
                    "right_line": any(
                        x["where"] and x["where"].endswith(f"stall_train.py:{want})") for x in d["ranks"]
                    ),
                    "gpu": {k: gpu_text(g) for k, g in d["gpus"].items()},
                    "gpu_raw": d["gpus"],
                    "last_step_before_stop_s": (
                        round(start - d["last_step_t"], 2) if d["last_step_t"] is not None else None
                    ),
                    "ticker_max_gap_ms": round(max(gaps) * 1000, 1) if gaps else None,
                }
            )
        stops.append(row)
    return {
        "run": name,
        "gputop_rc": g.returncode,
        "job_rc": job.returncode,
        "wall_s": round(time.monotonic() - wall0, 1),
        "changes": changes,
        "stops": stops,
        "snapshots": len(shots),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    ap.add_argument("--stall-s", type=float, default=20.0)
    ap.add_argument("--train-s", type=float, default=12.0)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--no-ranks", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    device = a.device
    if device is None:
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    dim = a.dim if device == "cuda" else min(a.dim, 256)
    common = [
        "--device",
        device,
        "--dim",
        str(dim),
        "--stall-s",
        str(a.stall_s),
        "--train-s",
        str(a.train_s),
        "--step-ms",
        "5",
        "--gpu-matmuls",
        "8" if device == "cuda" else "0",
    ]
    runs = [("single", ["--scenes", "sleep,lock", *common], 25 + 3 * a.train_s + 2 * a.stall_s)]
    if not a.no_ranks:
        runs.append(
            ("ranks", ["--launch-ranks", "2", "--scenes", "collective", *common], 30 + 2 * a.train_s + a.stall_s)
        )
    results = [run_one(a.out, name, args, watch) for name, args, watch in runs]
    doc = {
        "device": device,
        "stall_s": a.stall_s,
        "train_s": a.train_s,
        "dim": dim,
        "threshold": "no step for max(10 s, 20x median step) (defaults)",
        "runs": results,
    }
    with open(os.path.join(a.out, "stall_h200.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"device {device}; stops of {a.stall_s:.0f} s; default thresholds")
    print(
        f"{'run':<7} {'stop':<11} {'to stalled':>10} {'cleared':>8} {'dump':>7} {'tick gap':>8}"
        "  right line  places / GPU"
    )
    for r in results:
        for s in r["stops"]:
            fmt = lambda v, u="s": "n/a" if v is None else f"{v:.1f} {u}"  # noqa: E731
            print(
                f"{r['run']:<7} {s['scene']:<11} {fmt(s['to_stalled_s']):>10} {fmt(s['cleared_after_resume_s']):>8} "
                f"{fmt(s.get('dump_ms'), 'ms'):>7} {fmt(s.get('ticker_max_gap_ms'), 'ms'):>8}  "
                f"{str(s.get('right_line')):<10}  "
                + "; ".join(f"rank {k}: {v}" for k, v in (s.get("places") or {}).items())
            )
            for k, g in (s.get("gpu") or {}).items():
                print(f"{'':<50}GPU {k}: {g}")
        if r["gputop_rc"] != 0 or r["job_rc"] != 0:
            print(f"  {r['run']}: gputop exit {r['gputop_rc']}, job exit {r['job_rc']} (see {a.out}/{r['run']}.*)")
    ok = all(s.get("to_stalled_s") is not None and s.get("right_line") for r in results for s in r["stops"])
    print("all stops named stalled at the right line" if ok else "SOME STOP WAS NOT NAMED (see the JSON)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
