"""What every part of the probe uses: its clock and its one way of telling the user.

Imports: the standard library only.
"""

from __future__ import annotations

import os
import sys
import time

_mono = time.monotonic


def say(line: str) -> None:
    """One line on the job's stderr, for faults the user must know about (never a traceback)."""
    try:
        sys.stderr.write(f"gputop probe [pid {os.getpid()}]: {line}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _env_int(env, name: str) -> int | None:
    v = env.get(name)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None
