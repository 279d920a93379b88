"""python -m benchmarks --list | NAME [ARGS ...]   (from the repository root; see benchmarks/__init__.py)"""

from __future__ import annotations

import runpy
import sys

from benchmarks import BENCHMARKS, get

USAGE = """usage: python -m benchmarks --list            every benchmark, where it runs and its goal
       python -m benchmarks NAME [ARGS ...]   run benchmarks/NAME.py with ARGS (NAME --help: its options)
On the H200: bash benchmarks/h200.sh [PHASE ...] runs the GPU machine's phases."""


def listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    lines = [f"{'NAME':<{width}}  WHERE  GOAL"]
    for b in BENCHMARKS:
        lines.append(f"{b.name:<{width}}  {b.where:<5}  {b.goal}")
        lines.append(f"{'':<{width}}         measures: {b.measures}")
    lines.append(f"{len(BENCHMARKS)} benchmarks; where: local = the 2-core box (no GPU), h200 = the GPU machine,"
                 " both = either (no GPU needed, also measured on the H200). Run one: python -m benchmarks NAME"
                 " [ARGS ...]")
    return "\n".join(lines)


def run(name: str, args: list[str]) -> None:
    """Run the benchmark's script as ``python benchmarks/SCRIPT ARGS`` would (its exit status included)."""
    b = get(name)
    script = str(b.path)
    sys.argv = [script, *args]
    sys.path.insert(0, str(b.path.parent))  # a script's own folder comes first on sys.path
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] == "--list":
        print(listing())
        return 0
    if get(argv[0]) is None:
        print(f"benchmarks: no benchmark named {argv[0]!r} (python -m benchmarks --list names them)",
              file=sys.stderr)
        return 2
    run(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
