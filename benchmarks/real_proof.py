"""Score recordings of real training loops (benchmarks/h200.sh phase `real`) against issue 11's
proof: the expected primary verdict within 5 s of the first training step and held >= 90% of the
training time after it, the budget summing to 100% +-2 points, the named frame, the start-up
line; for the periodic stall, gputop's period and length against the loop's own `stall` lines;
under `gputop run`, the probe's steps/s against the framework's own count (`rate` lines).

    python benchmarks/real_proof.py DIR [DIR ...]      # folders of NAME-{pid,run}.gtrec (+ .rates)

Runs anywhere (no GPU needed): it replays the recordings with today's rules.
"""

from __future__ import annotations

import pathlib
import statistics
import sys

from gputop.demo.workload import SCENARIOS
from gputop.derive.phases import JUDGED
from gputop.report import build_report
from gputop.session.whole_replay import replay_whole
from gputop.verdicts import default_processors


def _rates(path: pathlib.Path) -> tuple[list[tuple[float, int]], list[tuple[float, float]]]:
    """The loop's own ("rate", steps/s, total steps) lines and ("stall", start, seconds) lines."""
    rates, stalls = [], []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "rate":
                rates.append((float(parts[1]), int(parts[2])))
            elif len(parts) == 3 and parts[0] == "stall":
                stalls.append((float(parts[1]), float(parts[2])))
    return rates, stalls


def score(rec: pathlib.Path) -> dict:
    name = rec.stem
    scenario = "default" if name == "demo" else name.rsplit("-", 1)[0]
    expect = SCENARIOS[scenario].expect
    got = replay_whole(str(rec), default_processors(), kinds={"budget", "phase", "verdict_primary"})
    prim = [(s.t, s.get("id"), s.get("phase")) for s in got.samples if s.kind == "verdict_primary"]
    judged = [(t, pid) for t, pid, ph in prim if ph in JUDGED]
    # the first training step: when the phases say training began
    t_train = next((s.get("training_since") for s in got.samples if s.kind == "phase" and s.get("phase") in JUDGED
                    and s.get("training_since") is not None), None)
    first_ok = next((t for t, pid in judged if pid == expect), None)
    held = None
    if first_ok is not None:
        after = [pid for t, pid in judged if t >= first_ok]
        held = sum(1 for p in after if p == expect) / len(after)
    sums = [sum(v for v in s.get("shares").values() if v is not None)
            for s in got.samples if s.kind == "budget" and s.key == "window"]
    rep = build_report(str(rec))
    row = {"recording": name, "expect": expect, "primary": (rep.get("primary_verdict") or {}).get("id"),
           "startup_s": rep.get("startup_s"),
           "first_ok_after_training_s": None if first_ok is None or t_train is None else round(first_ok - t_train, 1),
           "held_pct": None if held is None else round(100 * held, 1),
           "budget_sum_pct": (round(100 * min(sums), 1), round(100 * max(sums), 1)) if sums else None}
    v = (rep.get("verdicts") or {}).get(expect) or {}
    row["summary"] = v.get("summary")
    rates, stalls = _rates(rec.with_suffix(".rates"))
    if stalls:
        starts = [t for t, _ in stalls]
        row["true_stall_s"] = round(statistics.median(d for _, d in stalls), 2)
        row["true_period_s"] = round(statistics.median(b - a for a, b in zip(starts, starts[1:])), 2) if len(starts) > 2 else None
        ev = v.get("evidence") or {}
        row["gputop_stall_s"], row["gputop_period_s"] = ev.get("stall_s"), ev.get("stall_every_s")
    probe = (rep.get("probe") or {}).get("ranks") or []
    if probe and len(rates) > 3:
        # the framework's own count once it trains: steps over the time its rate lines cover
        steady = rates[len(rates) // 3:]
        steps = [b[1] - a[1] for a, b in zip(steady, steady[1:])]
        secs = sum(n / r for n, (r, _) in zip(steps, steady[1:]) if r > 0)
        row["framework_steps_per_s"] = round(sum(steps) / secs, 2) if secs else None
        row["probe_steps_per_s"] = probe[0].get("steps_per_s")
    return row


def main(argv: list[str]) -> int:
    rows = []
    for d in argv:
        for rec in sorted(pathlib.Path(d).glob("*.gtrec")):
            rows.append(score(rec))
    keys = ["recording", "expect", "primary", "startup_s", "first_ok_after_training_s", "held_pct", "budget_sum_pct",
            "true_stall_s", "gputop_stall_s", "true_period_s", "gputop_period_s", "framework_steps_per_s",
            "probe_steps_per_s"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |")
    for r in rows:
        print(f"{r['recording']}: {r.get('summary')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
