"""Judge every committed recording with today's rules and print one JSON line per file:
its primary verdict, and each verdict's active share and first second. A refactor that must not
change behaviour compares this output before and after:

    python scripts/judge_recordings.py > before.jsonl   # ... change ...
    python scripts/judge_recordings.py | diff before.jsonl -
"""

from __future__ import annotations

import json
import pathlib
import sys

from gputop.report import build_report

ROOT = pathlib.Path(__file__).resolve().parent.parent


def judge(path: pathlib.Path) -> dict:
    rep = build_report(str(path))
    prim = rep.get("primary_verdict") or {}
    return {"file": str(path.relative_to(ROOT)), "primary": prim.get("id"), "primary_share": prim.get("share"),
            "verdicts": {v: [d.get("active_share"), d.get("first_seen_s")] for v, d in sorted(rep.get("verdicts", {}).items())},
            "why_none": rep.get("no_verdict_why")}


def main(argv: list[str]) -> int:
    files = [pathlib.Path(a).resolve() for a in argv] or sorted((ROOT / "tests" / "data").rglob("*.gtrec"))
    for f in files:
        print(json.dumps(judge(f), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
