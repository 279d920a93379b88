"""Digest of everything the derivation processors publish on committed recordings, to prove a
speed-up changed nothing: each file is played front to back through fresh default processors
(session/whole_replay.py, as ``gputop report`` does without summary frames) and every published
sample, time, kind, key and data, is hashed in the order published, per kind.

    python scripts/processor_digest.py [FILE ...] > digest.json      # default: every committed recording
    python scripts/processor_digest.py --check digest.json          # exit 1 and name what differs

tests/data/processor_digest.json was written by this script from the code before the cuts of
issue 14 (the processors' per-run work); tests/test_processor_digest.py checks it.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop.session.whole_replay import replay_whole  # noqa: E402
from gputop.verdicts import default_processors  # noqa: E402


def digest(path: pathlib.Path) -> dict[str, list]:
    """{kind: [samples, sha256]} of what fresh processors publish over the whole file."""
    procs = default_processors()
    got = replay_whole(str(path), procs)
    out: dict[str, list] = {}
    hashes: dict[str, hashlib._Hash] = {}
    for s in got.samples:
        h = hashes.setdefault(s.kind, hashlib.sha256())
        h.update(json.dumps([s.t, s.key, s.data], sort_keys=True, default=repr).encode())
        h.update(b"\n")
        out.setdefault(s.kind, [0, ""])[0] += 1
    for k, h in hashes.items():
        out[k][1] = h.hexdigest()
    return dict(sorted(out.items()))


def all_files() -> list[pathlib.Path]:
    return sorted((ROOT / "tests" / "data").rglob("*.gtrec"))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        want = json.loads(pathlib.Path(argv[1]).read_text())
        bad = 0
        for rel, d in want.items():
            now = digest(ROOT / rel)
            if now != d:
                bad += 1
                print(f"{rel}: differs in {sorted(k for k in set(d) | set(now) if d.get(k) != now.get(k))}")
        print("SAME" if not bad else f"{bad} files differ")
        return 1 if bad else 0
    files = [pathlib.Path(a).resolve() for a in argv] or all_files()
    print(json.dumps({str(f.relative_to(ROOT)): digest(f) for f in files}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
