"""Print, second by second, the signals and rule levels the verdict engine saw in a recording.

    python scripts/verdict_trace.py RECORDING [--every 5] [--signals gpu.sm_active,py.main.data]

A tool for tuning rules against real recordings: it replays the file through the same
processors as `gputop replay` and shows each rule's level (>= 1 holds) next to the signals.
"""

from __future__ import annotations

import argparse
import sys

from gputop.session.replay import ReplaySession
from gputop.verdicts import default_processors
from gputop.verdicts.engine import VerdictEngine
from gputop.verdicts.signals import build_signals


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("recording")
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--signals", default="")
    a = ap.parse_args()
    procs = default_processors()
    engine = next(p for p in procs if isinstance(p, VerdictEngine))
    s = ReplaySession(a.recording, processors=procs, start_playing=False, seek_window_s=0.0)
    t = s.t_start + a.every
    while t <= s.t_end + 1e-9:
        s.play_to(t)
        sig = build_signals(s.store, s.position)
        found = engine.evaluate(s.store, s.position)
        active = [v for v, st in engine.ranked()]
        print(f"t={s.position - s.t_start:6.1f}s  primary={active[0] if active else None}  active={active}")
        names = [n for n in a.signals.split(",") if n] or sorted(k for k, v in sig.values.items() if v is not None)
        print("   signals: " + ", ".join(f"{n}={sig.get(n):.3g}" for n in names if sig.get(n) is not None))
        print("   levels:  " + ", ".join(f"{f.id}={f.level:.2f}/{f.lost_share:.2f}" for f in found.values()))
        t += a.every
    return 0


if __name__ == "__main__":
    sys.exit(main())
