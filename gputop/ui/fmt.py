"""Text for numbers: units, n/a, durations and sparklines. Pure functions, no Textual.

Every formatter takes ``None`` and returns ``"n/a"`` (or blanks, for a sparkline): a missing
value is never drawn as zero.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

NA = "n/a"
SPARK_CHARS = "▁▂▃▄▅▆▇█"


def _num(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def pct(v, digits: int = 0) -> str:
    f = _num(v)
    return NA if f is None else f"{f:.{digits}f}%"


def num(v, unit: str = "", digits: int = 0) -> str:
    f = _num(v)
    return NA if f is None else f"{f:.{digits}f}{unit}"


_BIN = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def size(v, digits: int = 1) -> str:
    """Bytes in binary units, compact: 512B, 3.1K, 70.2G (K/M/G/T are KiB/MiB/GiB/TiB)."""
    f = _num(v)
    if f is None:
        return NA
    for suffix, scale in _BIN:
        if abs(f) >= scale:
            x = f / scale
            return f"{x:.{digits if x < 100 else 0}f}{suffix}"
    return f"{f:.0f}B"


def size_pair(used, total) -> str:
    """"70.1/141G": used and total in the total's unit (or n/a)."""
    u, t = _num(used), _num(total)
    if u is None:
        return NA
    if t is None or t <= 0:
        return size(u)
    for suffix, scale in _BIN:
        if t >= scale:
            return f"{u / scale:.{1 if u / scale < 100 else 0}f}/{t / scale:.{1 if t / scale < 100 else 0}f}{suffix}"
    return f"{u:.0f}/{t:.0f}B"


def rate_bytes(v) -> str:
    """Bytes per second: 1.2M/s."""
    f = _num(v)
    return NA if f is None else size(f) + "/s"


def rate_mib(v) -> str:
    """MiB/s as NVML/GPM report it: 13 MiB/s, 5.9 GiB/s."""
    f = _num(v)
    if f is None:
        return NA
    if abs(f) >= 1024:
        return f"{f / 1024:.1f} GiB/s"
    if abs(f) >= 10:
        return f"{f:.0f} MiB/s"
    return f"{f:.1f} MiB/s"


def duration(seconds) -> str:
    """0:42, 12:05, 1:02:03 (hours only when needed)."""
    f = _num(seconds)
    if f is None:
        return NA
    sign = "-" if f < 0 else ""
    s = int(abs(f))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{sign}{h}:{m:02d}:{sec:02d}" if h else f"{sign}{m}:{sec:02d}"


def clip(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` cells, marking the cut with an ellipsis."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "…"


def spark(points: Iterable[tuple[float, object]], t_end: float, window_s: float, width: int,
          lo: float = 0.0, hi: float | None = None) -> str:
    """A sparkline of ``width`` cells covering ``window_s`` seconds up to ``t_end``.

    Each cell is the mean of the samples that fall in its slice of time; a slice without any
    sample is a blank (no data), never a low bar. Slices are aligned to multiples of their
    width so the line scrolls steadily instead of shimmering as ``t_end`` moves. ``hi`` None
    scales to the largest value in view.
    """
    if width <= 0 or window_s <= 0:
        return ""
    cell = window_s / width
    last = math.floor(t_end / cell)
    first = last - width + 1
    sums = [0.0] * width
    counts = [0] * width
    for t, v in points:
        f = _num(v)
        if f is None:
            continue
        i = math.floor(t / cell) - first
        if 0 <= i < width:
            sums[i] += f
            counts[i] += 1
    means: list[float | None] = [sums[i] / counts[i] if counts[i] else None for i in range(width)]
    top = hi if hi is not None else max((m for m in means if m is not None), default=None)
    out = []
    for m in means:
        if m is None:
            out.append(" ")
            continue
        if top is None or top <= lo:
            out.append(SPARK_CHARS[0])
            continue
        frac = (m - lo) / (top - lo)
        idx = int(round(frac * (len(SPARK_CHARS) - 1)))
        out.append(SPARK_CHARS[min(max(idx, 0), len(SPARK_CHARS) - 1)])
    return "".join(out)


def peak(values: Sequence[tuple[float, object]]) -> float | None:
    nums = [f for _, v in values if (f := _num(v)) is not None]
    return max(nums) if nums else None
