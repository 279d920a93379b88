"""The statistics of ``gputop diff``: steps/s per fixed window of the training part, and a Welch
t-interval on the ratio of two recordings' rates (on the log scale, so that it is an interval
for a ratio). Pure functions; no scipy (the t quantile comes from the regularised incomplete
beta function below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gputop.derive.steps import pool_steps
from gputop.model import Sample

LEVEL = 0.95            # the confidence level of every interval gputop diff prints
WINDOW_MAX_S = 10.0     # the window a long recording is cut into
WINDOW_MIN_S = 1.0      # ... never shorter than the probe's own window (~1 s)
WINDOWS_WANTED = 8      # a short recording gets shorter windows, so each side has about this many
MIN_WINDOWS = 3         # fewer windows than this on a side: no interval (its spread means nothing)


def window_length(training_a: float, training_b: float) -> float:
    """One window length for both sides: 10 s, shorter when a side trained for less than
    WINDOWS_WANTED x 10 s, never below the probe's own window."""
    shortest = min(training_a, training_b)
    return max(WINDOW_MIN_S, min(WINDOW_MAX_S, shortest / WINDOWS_WANTED))


def training_windows(windows: list[Sample]) -> list[Sample]:
    """The probe windows in which a step ended (what ``StepPool.training_s`` counts)."""
    return [w for w in windows if w.data.get("steps")]


def window_rates(windows: list[Sample], length_s: float) -> list[float]:
    """Steps per training second in consecutive windows of ``length_s``, each from the probe
    windows that ended in it, pooled by ``derive.steps.pool_steps`` (timed steps / their summed
    durations, as ``gputop report`` computes steps/s). A window less than half covered by
    training (the last one, a gap) is left out."""
    train = training_windows(windows)
    if not train:
        return []
    t0 = train[0].t - (_num(train[0].data.get("window_s")) or 0.0)
    buckets: dict[int, list[Sample]] = {}
    for w in train:
        buckets.setdefault(int((w.t - t0) // length_s), []).append(w)
    out = []
    for i in sorted(buckets):
        pool = pool_steps(s.data for s in buckets[i])
        rate = pool.steps_per_training_s
        if rate and rate > 0 and pool.training_s >= 0.5 * length_s and pool.timed_steps >= 2:
            out.append(rate)
    return out


@dataclass(frozen=True)
class RatioInterval:
    """B's rate / A's rate: the point (the two pooled rates' ratio) and a LEVEL interval."""

    ratio: float
    low: float | None
    high: float | None
    df: float | None
    n_a: int
    n_b: int
    why_none: str | None = None    # why there is no interval


def ratio_interval(rate_a: float, rate_b: float, windows_a: list[float], windows_b: list[float],
                   level: float = LEVEL) -> RatioInterval:
    """Welch's t-interval for log(B/A) from the spread of each side's per-window log rates,
    centred on the log of the pooled rates' ratio (the numbers ``gputop report`` prints)."""
    ratio = rate_b / rate_a
    na, nb = len(windows_a), len(windows_b)
    if min(na, nb) < MIN_WINDOWS:
        return RatioInterval(ratio, None, None, None, na, nb,
                             f"too few windows for an interval ({na} and {nb}; {MIN_WINDOWS} needed on each side)")
    la = [math.log(r) for r in windows_a]
    lb = [math.log(r) for r in windows_b]
    va, vb = _var(la) / na, _var(lb) / nb
    se = math.sqrt(va + vb)
    if se == 0:
        return RatioInterval(ratio, ratio, ratio, math.inf, na, nb)
    df = (va + vb) ** 2 / ((va * va / (na - 1) if va else 0.0) + (vb * vb / (nb - 1) if vb else 0.0))
    half = t_quantile(0.5 + level / 2, df) * se
    return RatioInterval(ratio, ratio * math.exp(-half), ratio * math.exp(half), df, na, nb)


def _var(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


# ---------------------------------------------------------------------------------------------
# Student's t quantile: the CDF from the regularised incomplete beta function (a continued
# fraction, as in Numerical Recipes' betacf), inverted by bisection. Exact to ~1e-10.

def t_cdf(t: float, df: float) -> float:
    if math.isinf(df):
        return 0.5 * (1 + math.erf(t / math.sqrt(2)))
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return (lo + hi) / 2


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d, c = _cf_step(aa, d, c)
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d, c = _cf_step(aa, d, c)
        h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _cf_step(aa: float, d: float, c: float) -> tuple[float, float]:
    tiny = 1e-300
    d, c = 1 + aa * d, 1 + aa / c
    d = 1 / (d if abs(d) > tiny else tiny)
    return d, (c if abs(c) > tiny else tiny)
