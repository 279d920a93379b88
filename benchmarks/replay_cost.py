"""What the derivation processors cost, measured offline on real recordings.

    python benchmarks/replay_cost.py FILE.gtrec [FILE.gtrec ...] [--repeats 3]

Plays each recording through fresh default processors (``session/whole_replay.replay_whole``:
what ``gputop report`` does for a file without summary frames) and prints the CPU time of the
fastest of ``--repeats`` passes, per recorded second as % of one core. The live derive thread
runs the same processors over the same samples, and the recorder's summary chain runs them a
second time, so a cut here is a cut in both; reading and checking the file is included (the
chain decodes what it writes too). No GPU needed: the H200 recordings under tests/data are the
input (docs/benchmarks.md, "H200 run 12").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gputop.session.whole_replay import replay_whole  # noqa: E402
from gputop.verdicts import default_processors  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    for path in a.files:
        cpu = []
        for _ in range(max(1, a.repeats)):
            c0 = time.process_time()
            out = replay_whole(path, default_processors())
            cpu.append(time.process_time() - c0)
        span = max(out.t_end - out.t_start, 1e-9)
        print(f"{path}: {span:.0f} s recorded, CPU min {min(cpu):.3f} s = {100 * min(cpu) / span:.2f}% of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
