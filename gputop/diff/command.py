"""The ``gputop diff`` subcommand: read both recordings, compare, print, and an exit status a CI
job can use (docs/report.md, "gputop diff"):

  0  compared (and, with --fail-above, B is not slower by more than PCT with confidence)
  1  --fail-above PCT: B is slower than A by more than PCT with 95% confidence
  2  bad command line, or a recording that cannot be read (one line per file)
  3  --fail-above PCT but no interval could be computed (no probe steps, too few windows)
"""

from __future__ import annotations

import json
import sys

from gputop.diff.compare import compare
from gputop.diff.load import load
from gputop.diff.render import render_text
from gputop.session.recording import RecordingError
from gputop.session.sanitize import json_safe, printable

EXIT_OK, EXIT_SLOWER, EXIT_BAD_INPUT, EXIT_CANNOT_JUDGE = 0, 1, 2, 3


def run(path_a: str, path_b: str, as_json: bool = False, fail_above: float | None = None) -> int:
    sides, bad = [], []
    for name, path in (("A", path_a), ("B", path_b)):
        try:
            sides.append(load(path))
        except (RecordingError, OSError) as e:
            bad.append(f"gputop: error: {name}: {printable(str(e), 500)}")
    if bad:
        for line in bad:
            print(line, file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        d = compare(*sides)
    except Exception as e:   # noqa: BLE001 (a bug or a file no recorder writes: never exit 1, "slower")
        print(f"gputop: error: could not compare {printable(path_a, 200)} and {printable(path_b, 200)}: "
              f"{type(e).__name__}: {printable(str(e), 300)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    code, why = judge(d, fail_above)
    d["fail_above_pct"], d["exit_code"] = fail_above, code
    if why:
        d["exit_why"] = why
    if as_json:
        print(json.dumps(json_safe(d), indent=2, allow_nan=False))
    else:
        sys.stdout.write(render_text(d))
        if why:
            print(f"gputop diff: {why}")
    return code


def judge(d: dict, fail_above: float | None) -> tuple[int, str | None]:
    """The exit status for --fail-above PCT: 1 when even the interval's least slowdown of B
    exceeds PCT (so a noisy recording does not fail a build on chance)."""
    if fail_above is None:
        return EXIT_OK, None
    slow = d["steps"].get("slowdown_pct")
    if slow is None:
        return EXIT_CANNOT_JUDGE, f"cannot check --fail-above {fail_above:g}: {d['steps'].get('why_none')}"
    if slow["low"] > fail_above:
        return EXIT_SLOWER, (f"B is slower than A by more than {fail_above:g}% (at least {slow['low']:.1f}% "
                             f"with {d['steps']['level'] * 100:.0f}% confidence): failing")
    return EXIT_OK, None
