"""Pool the target-slowdown estimates of several stacks_overhead.py runs into one number per loop.

    python benchmarks/pool_slowdown.py RESULT.json [RESULT.json ...]

Each run of ``benchmarks/stacks_overhead.py`` gives per-pair slowdown estimates (twin or
alternating design). On a machine whose loops drift by ±10-20% from one 5-10 s phase to the next,
one run's interval is too wide to decide a 3% goal, so runs are combined: each run's mean is
weighted by the inverse of its squared standard error (runs with longer phases and less noise
count more), and the pooled mean gets a 95% interval (normal approximation, 1.96 standard
errors). Prints one row per run and one pooled row per target loop.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    by_mode: dict[str, list[tuple[float, float]]] = {}
    print("| run | loop | design | pairs | phase s | mean % | sd | standard error |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["slowdown"]:
            xs = r["slowdown_pct"]
            if len(xs) < 2:
                continue
            m, sd = statistics.fmean(xs), statistics.stdev(xs)
            se = sd / math.sqrt(len(xs))
            design = r.get("design", "alternating")
            by_mode.setdefault(r["mode"], []).append((m, se))
            print(f"| {os.path.basename(path)} | {r['mode']} | {design} | {len(xs)} | {doc['args']['phase']:.0f} | "
                  f"{m:+.2f} | {sd:.2f} | {se:.2f} |")
    print()
    print("| loop | runs | pooled slowdown % | 95% interval |")
    print("|---|---|---|---|")
    for mode, runs in by_mode.items():
        w = [1.0 / se ** 2 for _, se in runs]
        mean = sum(wi * m for wi, (m, _) in zip(w, runs)) / sum(w)
        se = 1.0 / math.sqrt(sum(w))
        print(f"| {mode} | {len(runs)} | {mean:+.2f} | [{mean - 1.96 * se:+.2f}, {mean + 1.96 * se:+.2f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
