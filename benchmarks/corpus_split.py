"""Does the probe's per-step split agree with the time budget (issue 29)? For every corpus recording
made under ``gputop run`` (so with the probe) whose loop takes its batches from a DataLoader,
replayed with today's code: the share of the step the GPU idles while the loop waits for data.

- The probe: per step, the loop's wait in ``next(DataLoader)`` and the GPU span of the step (on
  the stream, from the event when its batch arrived to the event at the step's boundary). The GPU
  has nothing of this step to do outside that span, so it idles ``step - span`` of each step, and
  while the loop waits for data: ``min(data wait, step - span) / step``.
- The budget: its ``data`` share of the judged training (py-spy's samples in the DataLoader's
  frames joined with util.gpu, and with the probe's windows at step resolution).

    python -m benchmarks corpus_split DIR [DIR ...]

Prints one row per recording and how many agree within 5 points; the goal of issue 29 is all of
them. The GPU's busy share itself is not compared: the probe's span includes the bubbles between
kernels (a loop that launches slowly has a span of ~100% of its step), so it is not busy time;
that needs a kernel timeline (torch.profiler on a sampled step), which the probe does not take.
The two are also taken over slightly different stretches (the probe's training windows, the
budget's judged training after warm-up).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from gputop.report import build_report
from gputop.session.recording_format import RecordingError

AGREE_PTS = 5.0


def split(path: pathlib.Path) -> dict | None:
    rep = build_report(str(path))
    ranks = (rep.get("probe") or {}).get("ranks") or []
    shares = ((rep.get("budget") or {}).get("training") or {}).get("shares") or {}
    if not ranks or not shares:
        return None
    rk = max(ranks, key=lambda r: r.get("steps") or 0)
    step = (rk.get("step_ms") or {}).get("mean")
    span, wait = rk.get("gpu_ms_per_step"), rk.get("data_wait_ms_per_step")
    if not step or span is None or wait is None or not rk.get("batches") or shares.get("data") is None \
            or rk.get("data_idle_share") is None:
        return None   # no DataLoader, or no GPU span: nothing of the probe's to compare
    # probe_data: the report's own figure (derive/steps.py, StepPool.data_idle_share), input_bound's cost
    return {"file": path.name, "steps": rk.get("steps"), "wait": wait / step, "idle": max(0.0, step - span) / step,
            "probe_data": rk.get("data_idle_share"), "budget_data": shares["data"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    missing = [d for d in args.dirs if not pathlib.Path(d).is_dir()]
    if missing:
        print(f"corpus_split: no such folder: {', '.join(missing)} (give corpus_run's folders)", file=sys.stderr)
        return 2
    rows = []
    for d in args.dirs:
        for p in sorted(pathlib.Path(d).glob("*.gtrec")):
            try:
                r = split(p)
            except (RecordingError, OSError) as e:   # a damaged recording: skipped, the rest compared
                print(f"corpus_split: {p.name} skipped: {e}", file=sys.stderr)
                continue
            if r is not None:
                rows.append(r)
    print(f"{'recording':42s} {'steps':>6s} {'wait':>6s} {'GPU idle':>8s} {'probe':>6s} {'budget':>7s}  agree")
    agree = 0
    for r in rows:
        ok = abs(r["probe_data"] - r["budget_data"]) * 100 <= AGREE_PTS
        agree += ok
        print(f"{r['file'][:42]:42s} {r['steps'] or 0:6d} {r['wait'] * 100:5.1f}% {r['idle'] * 100:7.1f}% "
              f"{r['probe_data'] * 100:5.1f}% {r['budget_data'] * 100:6.1f}%  {'yes' if ok else 'NO'}")
    print(f"GPU-idle data wait, probe against budget, within {AGREE_PTS:.0f} points: {agree}/{len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
