"""Summary statistics used by the report and the verdict rules. Pure functions."""

from __future__ import annotations

import math
from typing import Iterable


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of an already sorted list."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return sorted_values[0]
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(values: Iterable[float], ndigits: int = 3) -> dict:
    """mean, p50, p95, max, min and n of the numeric values (bools and None are skipped)."""
    xs = sorted(f for f in map(finite_float, values) if f is not None)
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "p95": None, "max": None, "min": None}

    def r(x):
        return None if x is None or not math.isfinite(x) else round(x, ndigits)

    try:
        mean = math.fsum(xs) / len(xs)
    except OverflowError:  # values near the float limit (a damaged file): no mean, no crash
        mean = None
    return {"n": len(xs), "mean": r(mean), "p50": r(percentile(xs, 50)),
            "p95": r(percentile(xs, 95)), "max": r(xs[-1]), "min": r(xs[0])}


def finite_float(v) -> float | None:
    """v as a finite float, or None (bools, non-numbers, NaN, inf and ints too big for a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
