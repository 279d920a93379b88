"""Does gputop name the right bottleneck? Scores scenario recordings against their known cause.

    python benchmarks/scenario_proof.py RECORDING... [--json OUT.json] [--drop probe|gpm|stacks]

Each recording's name is its scenario (``input_bound.gtrec``; see ``gputop demo --list``). The
recording is replayed through the same processors as a live session (the verdicts are
recomputed from the raw samples) and scored on the issue's criteria:

- ``first_ok_s``: seconds from attach until the primary verdict is the expected one (goal <= 10);
- ``held``: the share of the remaining evaluations in which it stays the primary (goal >= 80%);
- ``first_verdict_s``: seconds from attach to the first verdict of any kind (goal <= 5);
- ``alarms``: warning/critical verdicts seen on ``gpu_bound`` (only true ones are allowed).

``--drop`` replays without one source's samples (probe, stacks, or the GPM fields of the GPU
samples), to show how the rules degrade when that source is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from gputop.demo.workload import SCENARIOS
from gputop.model import Sample
from gputop.session.replay import ReplaySession
from gputop.session.store import CallbackSubscriber
from gputop.verdicts import default_processors

# What a GPU without GPM lacks. PCIe stays: there the NVML source reads it from
# nvmlDeviceGetPcieThroughput instead (about once a second).
GPM_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw", "gr_active", "nvlink_tx_mibs",
              "nvlink_rx_mibs", "gpm_window_s")
DROPS = {
    "probe": lambda s: None if s.kind.startswith("probe_") or (s.kind == "health" and s.key == "probe") else s,
    "stacks": lambda s: None if s.kind in ("stacks", "thread_kernel") or (s.kind == "health" and s.key == "stacks") else s,
    "gpm": lambda s: Sample(s.t, s.kind, s.key, {k: v for k, v in s.data.items() if k not in GPM_FIELDS})
    if s.kind == "gpu" else s,
}


class _Filtered(ReplaySession):
    """A replay whose chunks pass through a filter first (to remove one source)."""

    def __init__(self, path, keep, **kw):
        self._keep = keep
        super().__init__(path, **kw)

    def _chunk(self, ref):
        return [x for x in (self._keep(s) for s in super()._chunk(ref)) if x is not None]


def score(path: str, expect: str, drop: str | None = None) -> dict:
    kw = dict(processors=default_processors(), start_playing=False, seek_window_s=0.0)
    session = _Filtered(path, DROPS[drop], **kw) if drop else ReplaySession(path, **kw)
    primaries: list[tuple[float, str | None]] = []
    alarms: set[str] = set()

    def on(samples):
        for s in samples:
            if s.kind == "verdict_primary":
                primaries.append((s.t, s.get("id")))
            elif s.kind == "verdict" and s.get("active") and s.get("severity") in ("warning", "critical"):
                alarms.add(s.key)

    session.bus.subscribe(CallbackSubscriber(on))
    t0 = session.t_start
    session.play_to(session.t_end)
    session.stop()
    first_any = next((t - t0 for t, pid in primaries if pid), None)
    first_ok = next((i for i, (t, pid) in enumerate(primaries) if pid == expect), None)
    held = None
    if first_ok is not None:
        rest = primaries[first_ok:]
        held = sum(1 for _, pid in rest if pid == expect) / len(rest)
    from collections import Counter
    counts = Counter(pid for _, pid in primaries if pid)
    return {
        "recording": os.path.basename(path), "expect": expect, "drop": drop,
        "duration_s": round(session.t_end - t0, 1),
        "first_verdict_s": None if first_any is None else round(first_any, 1),
        "first_ok_s": None if first_ok is None else round(primaries[first_ok][0] - t0, 1),
        "held": None if held is None else round(held, 3),
        "primaries": dict(counts.most_common()),
        "alarms": sorted(alarms),
        "pass": bool(first_ok is not None and primaries[first_ok][0] - t0 <= 10.0 and held is not None and held >= 0.8),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("recordings", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--drop", choices=sorted(DROPS))
    a = ap.parse_args()
    rows = []
    for path in a.recordings:
        name = os.path.basename(path).split(".")[0]
        sc = SCENARIOS.get(name)
        if sc is None or not sc.expect:
            print(f"skip {path}: not a scenario recording", file=sys.stderr)
            continue
        rows.append(score(path, sc.expect, a.drop))
    print(f"{'scenario':<22} {'drop':<7} {'first verdict':>13} {'expected at':>11} {'held':>6}  pass  other primaries / alarms")
    for r in rows:
        others = {k: v for k, v in r["primaries"].items() if k != r["expect"]}
        print(f"{r['expect']:<22} {r['drop'] or '-':<7} {str(r['first_verdict_s']) + ' s':>13} "
              f"{str(r['first_ok_s']) + ' s':>11} {('%.0f%%' % (100 * r['held'])) if r['held'] is not None else '-':>6}  "
              f"{'yes' if r['pass'] else 'NO ':<4}  {others or ''} {r['alarms'] if r['expect'] == 'gpu_bound' else ''}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
