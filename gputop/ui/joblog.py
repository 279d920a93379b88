"""The tail of the job's output log (``gputop run`` / ``gputop demo`` in the UI write the job's
stdout and stderr to a private log, gputop/cli.py): the Output view shows its last lines.

The log grows without bound while the job runs, so it is never read whole: one bounded read
from the end (``MAX_BYTES``), and only when its size or mtime changed since the last read.
What the job printed is made safe to draw: terminal escape sequences removed, a carriage
return keeps what was written after it (a progress bar's last state), other control
characters and the bidirectional-text controls (U+202E shows what follows backwards) dropped.
"""

from __future__ import annotations

import os
import re

from gputop.session.sanitize import BIDI_CONTROLS

MAX_LINES = 200
MAX_BYTES = 64 * 1024  # 200 lines of ~300 characters; a longer line is shown from its end
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = {c: None for c in [*range(0x20), 0x7F, *range(0x80, 0xA0), *map(ord, BIDI_CONTROLS)] if c != 0x09}
_CONTROL[0x09] = "    "


def clean_line(line: str) -> str:
    line = _ESCAPES.sub("", line)
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    return line.translate(_CONTROL)


def tail_lines(path: str, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> list[str]:
    """The last ``max_lines`` lines of the file, from at most its last ``max_bytes`` bytes
    (a first line cut by that limit is dropped, unless it is the only one)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - max_bytes)
        f.seek(start)
        data = f.read(max_bytes)
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if start > 0 and len(lines) > 1:
        lines = lines[1:]  # began mid-line
    return [clean_line(x) for x in lines[-max_lines:]]


class LogTail:
    """The job log's last lines, re-read only when the file changed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._lines: list[str] = []
        self.error: str | None = None

    def lines(self) -> list[str]:
        try:
            st = os.stat(self.path)
            key = (st.st_size, st.st_mtime_ns)
            if key != self._seen:
                self._lines = tail_lines(self.path)
                self._seen = key
            self.error = None
        except OSError as e:
            self.error = f"cannot read {self.path}: {e.strerror or e}"
        return self._lines
