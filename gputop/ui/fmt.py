"""Text for numbers: units, n/a, durations and sparklines. Pure functions, no Textual.

Every formatter takes ``None`` and returns ``"n/a"`` (or blanks, for a sparkline): a missing
value is never drawn as zero.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from rich.text import Text

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


def to_float(v) -> float | None:
    """A finite float, or None for anything else (None, bool, text, NaN)."""
    return _num(v)


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


_CONTROL = {c: "?" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_CONTROL.update({0x09: " ", 0x0A: "⏎", 0x0D: "⏎"})


def clean(text) -> str:
    """Text from a process or a recording, made safe to draw: control characters (newlines in
    a command line, terminal escape sequences) become visible placeholders, never bytes that
    the terminal would act on."""
    return str(text).translate(_CONTROL)


def clip(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` cells (control characters made visible), marking a cut with
    an ellipsis."""
    text = clean(text)
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "…"


def fit(text: Text, width: int) -> Text:
    """``clip`` for styled text: a copy cut to ``width`` cells, a cut marked with an ellipsis
    (a bare ``Text.truncate(width)`` cuts mid-word with no mark)."""
    out = text.copy()
    out.truncate(max(0, width), overflow="ellipsis")
    return out


def wrap(text: Text | str, width: int, max_lines: int = 2, indent: int = 0,
         sep: str = " ") -> list[Text]:
    """``text`` as at most ``max_lines`` lines of ``width`` cells, broken between words (at
    ``sep`` where one falls in the line, else at a space); lines after the first start with
    ``indent`` spaces; what does not fit in ``max_lines`` ends the last line with an ellipsis.
    A single word longer than a line is cut (with an ellipsis only on the last line)."""
    t = Text(clean(text)) if isinstance(text, str) else text
    plain = t.plain
    lines: list[Text] = []
    start = 0
    width = max(1, width)
    while start < len(plain) and len(lines) < max(1, max_lines):
        pad = indent if lines else 0
        room = max(1, width - pad)
        rest = t[start:]
        if len(lines) == max_lines - 1 or rest.cell_len <= room:
            line = fit(rest, room)
            start = len(plain)
        else:
            cut = plain.rfind(sep, start, start + room + 1) if sep != " " else -1
            if cut <= start:
                cut = plain.rfind(" ", start, start + room + 1)
            if cut <= start:
                cut = start + room  # one word longer than the line
            line = t[start:cut]
            line.rstrip()
            start = cut + (len(sep) if plain.startswith(sep, cut) else 0)
            while start < len(plain) and plain[start] == " ":
                start += 1
        lines.append(Text(" " * pad) + line if pad else line)
    return lines or [Text("")]


def _subclass_number(v) -> bool:
    """numpy.float64 and friends (a live source might hand one over); never a bool."""
    return v is not None and type(v) is not bool and isinstance(v, (int, float))


HOLD_S = 2.5  # a sampled value holds until the next sample, for at most this long


def cell_means(samples, fields: Sequence[str], t_end: float, window_s: float, width: int,
               hold_s: float = HOLD_S, longer: tuple[frozenset, float] | None = None) -> dict[str, list[float | None]]:
    """Per field, the value of each of ``width`` cells covering ``window_s`` seconds up to
    ``t_end``, from samples (objects with ``.t`` and ``.data``) in time order. One pass over
    the samples serves every field: the GPU view draws 15 sparklines per GPU.

    A cell is the mean of the samples that fall in its slice of time. A slice without a sample
    of its own takes the previous sample's value when that is at most ``hold_s`` older (a
    sampled value holds until the next sample; jittered sampling leaves such slices);
    otherwise it is None: no data, drawn blank, never as a low bar. Slices are aligned to
    multiples of their width so the line scrolls steadily as ``t_end`` moves. ``longer``:
    (fields, seconds) held that long instead (GPM's, read every 0.5 s, every 2 s while calm).
    """
    out: dict[str, list[float | None]] = {}
    if width <= 0 or window_s <= 0:
        return {f: [] for f in fields}
    cell = window_s / width
    first = math.floor(t_end / cell) - width + 1
    sums = {f: [0.0] * width for f in fields}
    counts = {f: [0] * width for f in fields}
    newest = {f: [0.0] * width for f in fields}
    before: dict[str, tuple[float, float]] = {}
    acc = [(f, sums[f], counts[f], newest[f]) for f in fields]
    numeric = (int, float)  # type() and not isinstance(): a bool is not a value here
    floor = math.floor
    for s in samples:  # the hot loop of the GPU view: kept plain on purpose
        t = s.t
        i = floor(t / cell) - first
        if i >= width:
            continue
        data = s.data
        if i >= 0:
            for f, sm, ct, nw in acc:
                v = data.get(f)
                if (type(v) in numeric or _subclass_number(v)) and v - v == 0:  # not NaN or inf
                    sm[i] += v
                    ct[i] += 1
                    nw[i] = t
        else:
            for f in fields:
                v = data.get(f)
                if (type(v) in numeric or _subclass_number(v)) and v - v == 0:  # not NaN or inf
                    before[f] = (t, v)
    for f in fields:
        means: list[float | None] = []
        hold = max(hold_s, longer[1]) if longer is not None and f in longer[0] else hold_s
        held_t, held_v = before.get(f, (None, None))
        c, sm, nw = counts[f], sums[f], newest[f]
        for i in range(width):
            if c[i]:
                m = sm[i] / c[i]
                means.append(m)
                held_t, held_v = nw[i], m
            elif held_t is not None and (first + i) * cell - held_t <= hold:
                means.append(held_v)
            else:
                means.append(None)
        out[f] = means
    return out


def spark_cells(means: Sequence[float | None], lo: float = 0.0, hi: float | None = None) -> str:
    """Cells (from ``cell_means``) as block characters; None is a blank. ``hi`` None scales to
    the largest value in view."""
    top = _num(hi) if hi is not None else max((m for m in means if m is not None), default=None)
    out = []
    last = len(SPARK_CHARS) - 1
    for m in means:
        if m is None:
            out.append(" ")
        elif top is None or top <= lo:
            out.append(SPARK_CHARS[0])
        else:
            idx = int(round((m - lo) / (top - lo) * last))
            out.append(SPARK_CHARS[min(max(idx, 0), last)])
    return "".join(out)


class _Point:
    __slots__ = ("t", "data")

    def __init__(self, t: float, v) -> None:
        self.t, self.data = t, {"v": v}


def spark(points: Iterable[tuple[float, object]], t_end: float, window_s: float, width: int,
          lo: float = 0.0, hi: float | None = None, hold_s: float = 2.5) -> str:
    """A sparkline of (t, value) points: ``cell_means`` then ``spark_cells``."""
    cells = cell_means([_Point(t, v) for t, v in points], ("v",), t_end, window_s, width, hold_s)["v"]
    return spark_cells(cells, lo, hi)
