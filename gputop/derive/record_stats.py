"""The report's statistics as a mergeable partial: built from a recording's columnar chunks, one
minute at a time by the recorder (summary frames) or from every chunk by the report; merged.

One function makes each number whichever way the partial was built: ``FieldStats.summary`` gives
n, mean, min and max exactly and p50/p95 from a log-bucketed histogram (relative error at most
``RELATIVE_ERROR``; docs/report.md says so), so a report merged from summary frames prints the
same numbers as one built by reading every sample. Pure: no file, no thread.
"""

from __future__ import annotations

import math
from collections import defaultdict

from gputop.model import (HEALTH_STATES, KIND_GPU, KIND_GPU_INFO, KIND_HEALTH, KIND_PROC, KIND_PROC_INFO, KIND_SYSTEM,
                          KIND_TARGET, Sample)
from gputop.session.sanitize import clean_samples
from gputop.sources.calm import CALM_HELD_FACTOR, MAX_WEIGHT, WEIGHT_FIELD, weight_of
from gputop.sources.nvml_fields import GPM_EVERY_S, HELD_FIELDS, OWN_CADENCE_FIELDS

RELATIVE_ERROR = 0.005                         # of a percentile, against the exact one
_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)
_TINY = 1e-9                                   # |v| below this counts as 0
_MAX_BUCKET = 20_000                           # |index|: beyond what a finite float can reach
_LAST_KINDS = (KIND_GPU_INFO, KIND_PROC_INFO, KIND_PROC, KIND_TARGET)   # the report reads their last row
# kinds whose samples say how many of the full rate they stand for while calm (WEIGHT_FIELD): the
# NVML fast loop's and the host source's (a host tick's weight also weighs the target tree's
# per-tick totals: ``tick_weights``)
_WEIGHED = (KIND_GPU, KIND_SYSTEM, KIND_PROC)
_MERGE_LAST = (KIND_GPU_INFO, KIND_PROC_INFO, KIND_HEALTH, KIND_TARGET)
_HEALTH_RANK = {"failed": 3, "degraded": 2, "ok": 1, "off": 0}


# A gpu, system or proc sample taken while the job was calm (gputop/sources/calm.py: the NVML loop
# at a quarter of its rate, the host source's at half) says how many samples of the full rate it
# stands for; every statistic counts it that many
# times, so a mean, a percentile or a share over a recording that mixes both rates is one over time.
# The fields read on their own schedules (nvml_fields.HELD_FIELDS, OWN_CADENCE_FIELDS) stretched
# less while calm: ``field_weights`` gives theirs.
def sample_weights(cols: dict, n: int) -> list[int] | None:
    """Each row's weight (1, or its ``calm_factor``); None when every row weighs 1."""
    col = cols.get(WEIGHT_FIELD)
    if not col:
        return None
    out = [weight_of(w) for w in col[:n]]
    out += [1] * (n - len(out))
    return out if any(w != 1 for w in out) else None


def held_weights(weights: list[int], windows: list | None) -> list[int] | None:
    """The weights of a gpu series' GPM and PCIe values (``field_weights``' ``held``): a calm row's
    GPM value (its ``gpm_window_s`` given) stands for the full-rate GPM readings of its window
    (one per GPM_EVERY_S, at most the row's own weight: 2 where GPM's gap doubled while calm, 4
    where it stretches with the fast loop); a calm PCIe reading without GPM (the slow loop's) for
    CALM_HELD_FACTOR. None where every row weighs 1."""
    out = []
    for i, w in enumerate(weights):
        win = windows[i] if windows is not None and i < len(windows) else None
        if w > 1 and type(win) in (int, float) and 0 < win < 3600:
            out.append(min(w, max(1, int(win / GPM_EVERY_S + 0.5))))
        else:
            out.append(min(w, CALM_HELD_FACTOR))
    return out if any(x != 1 for x in out) else None


def field_weights(name: str, weights: list[int] | None, held: list[int] | None) -> list[int] | None:
    """The weights of one gpu field's rows: the sample's (the fast loop's factor), ``held`` for a
    GPM or PCIe field (``held_weights``, made once per series), none for the energy counter (read
    every 5 s at any rate)."""
    if weights is None or name in OWN_CADENCE_FIELDS:
        return None
    return held if name in HELD_FIELDS else weights


def _num(v) -> float | None:
    t = type(v)
    if t is float:
        return v if math.isfinite(v) else None
    if t is int:
        try:
            f = float(v)
        except OverflowError:
            return None
        return f if math.isfinite(f) else None
    return None


class FieldStats:
    """count, sum, min, max and a histogram of one field: merged by adding."""

    __slots__ = ("n", "sum", "min", "max", "pos", "neg", "zero")

    def __init__(self) -> None:
        self.n = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.pos: dict[int, int] = {}
        self.neg: dict[int, int] = {}
        self.zero = 0

    def add_column(self, col: list, weights: list[int] | None = None) -> None:
        """``weights``: how many samples of the full rate each row stands for (``sample_weights``;
        None: one each)."""
        if weights is not None:
            pairs = [(f, w) for f, w in zip(map(_num, col), weights) if f is not None]
            if not pairs:
                return
            nums = [f for f, _ in pairs]
            self.n += sum(w for _, w in pairs)
            try:
                self.sum += math.fsum(f * w for f, w in pairs)
            except OverflowError:
                self.sum = math.inf
        else:
            nums = [f for f in map(_num, col) if f is not None]
            if not nums:
                return
            pairs = None
            self.n += len(nums)
            try:
                self.sum += math.fsum(nums)
            except OverflowError:
                self.sum = math.inf
        self.min = min(self.min, min(nums))
        self.max = max(self.max, max(nums))
        pos, neg, log, lg = self.pos, self.neg, math.log, _LOG_GAMMA
        for f, w in (pairs if pairs is not None else ((f, 1) for f in nums)):
            if f > _TINY:
                i = math.ceil(log(f) / lg)
                pos[i] = pos.get(i, 0) + w
            elif f < -_TINY:
                i = math.ceil(log(-f) / lg)
                neg[i] = neg.get(i, 0) + w
            else:
                self.zero += w

    def merge(self, other: "FieldStats") -> None:
        self.n += other.n
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        for mine, theirs in ((self.pos, other.pos), (self.neg, other.neg)):
            for i, c in theirs.items():
                mine[i] = mine.get(i, 0) + c
        self.zero += other.zero

    def _at_rank(self, r: int) -> float:
        """The value of rank ``r`` (0-based) as the histogram knows it, inside [min, max]."""
        if r <= 0:
            return self.min
        if r >= self.n - 1:
            return self.max
        seen = 0
        for i in sorted(self.neg, reverse=True):
            seen += self.neg[i]
            if seen > r:
                return max(self.min, -2 * _GAMMA ** i / (_GAMMA + 1))
        seen += self.zero
        if seen > r:
            return min(max(0.0, self.min), self.max)
        for i in sorted(self.pos):
            seen += self.pos[i]
            if seen > r:
                return min(self.max, 2 * _GAMMA ** i / (_GAMMA + 1))
        return self.max

    def percentile(self, q: float) -> float | None:
        """As derive.stats.percentile (linear between the two ranks), from the histogram."""
        if self.n == 0:
            return None
        pos = (self.n - 1) * q / 100.0
        lo = math.floor(pos)
        a = self._at_rank(lo)
        b = self._at_rank(min(lo + 1, self.n - 1))
        return a + (b - a) * (pos - lo)

    def summary(self, ndigits: int = 3) -> dict:
        """The report's n, mean, p50, p95, max, min (as derive.stats.summarize lays them out)."""
        if self.n == 0:
            return {"n": 0, "mean": None, "p50": None, "p95": None, "max": None, "min": None}

        def r(x):
            return None if x is None or not math.isfinite(x) else round(x, ndigits)

        return {"n": self.n, "mean": r(self.sum / self.n), "p50": r(self.percentile(50)),
                "p95": r(self.percentile(95)), "max": r(self.max), "min": r(self.min)}

    def to_json(self) -> list:
        flat = lambda d: [x for i, c in sorted(d.items()) for x in (i, c)]  # noqa: E731
        empty = self.n == 0
        return [self.n, self.sum if math.isfinite(self.sum) else None, None if empty else self.min,
                None if empty else self.max, flat(self.pos), flat(self.neg), self.zero]

    @classmethod
    def from_json(cls, row) -> "FieldStats":
        """From ``to_json``'s list; raises ValueError on anything else (a damaged summary)."""
        if not (isinstance(row, list) and len(row) == 7):
            raise ValueError("field statistics")
        n, s, lo, hi, pos, neg, zero = row
        st = cls()
        if not (_is_count(n) and _is_count(zero) and isinstance(pos, list) and isinstance(neg, list)):
            raise ValueError("field statistics")
        st.n, st.zero = n, zero
        st.sum = math.inf if s is None else _float(s)
        if n:
            st.min, st.max = _float(lo), _float(hi)
        for d, flat in ((st.pos, pos), (st.neg, neg)):
            if len(flat) % 2:
                raise ValueError("histogram")
            for i, c in zip(flat[::2], flat[1::2]):
                if not (type(i) is int and -_MAX_BUCKET <= i <= _MAX_BUCKET and _is_count(c)):
                    raise ValueError("histogram")
                d[i] = d.get(i, 0) + c
        if sum(st.pos.values()) + sum(st.neg.values()) + st.zero != n or (n and not st.min <= st.max):
            raise ValueError("histogram does not add up")
        return st


def _is_count(v) -> bool:
    return type(v) is int and 0 <= v < (1 << 53)


def _float(v) -> float:
    f = _num(v)
    if f is None:
        raise ValueError("not a number")
    return f


class StatsPartial:
    """What the report's statistics need from some chunks, mergeable with the next ones'."""

    def __init__(self) -> None:
        self.n_samples = 0
        self.t_first, self.t_last = math.inf, -math.inf
        self.values: dict[tuple[str, str], dict[str, FieldStats]] = defaultdict(dict)
        self.tree_ticks: dict[float, list] = {}                  # tick -> [cpu, rss, n]
        self.tick_weights: dict[float, int] = {}                 # tick -> its calm_factor (> 1 only)
        self.last: dict[tuple[str, str], dict] = {}
        self.gpu_rows: dict[str, int] = defaultdict(int)
        self.clock_events: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.health_worst: dict[str, dict] = {}
        self.health_last: dict[str, dict] = {}
        self.bad_counts: dict[str, int] = {}                     # BadValues, mergeable
        self.bad_reasons: dict[str, str] = {}

    # -- building ---------------------------------------------------------------------------
    def add(self, kind: str, key: str, ts: list, cols: dict) -> None:
        """One cleaned columnar series (session.sanitize.clean_series)."""
        self.n_samples += len(ts)
        if ts:
            self.t_first = min(self.t_first, ts[0], ts[-1])
            self.t_last = max(self.t_last, ts[0], ts[-1])
        weights = sample_weights(cols, len(ts)) if kind in _WEIGHED else None
        if kind in (KIND_GPU, KIND_SYSTEM):
            dst = self.values[(kind, key)]
            held = held_weights(weights, cols.get("gpm_window_s")) if weights is not None and kind == KIND_GPU else None
            for name, col in cols.items():
                if name != WEIGHT_FIELD:
                    self._field(dst, name).add_column(col, field_weights(name, weights, held))
        elif kind == KIND_PROC:
            # The tree's total per host tick: samples of one tick share a timestamp (to 50 ms).
            cpu, rss = cols.get("cpu_pct", []), cols.get("rss", [])
            for i, t in enumerate(ts):
                at = round(t * 20) / 20
                tick = self.tree_ticks.get(at)
                if tick is None:
                    tick = self.tree_ticks[at] = [0.0, 0.0, 0]
                if weights is not None and weights[i] > 1:
                    self.tick_weights[at] = max(self.tick_weights.get(at, 1), weights[i])
                c = _num(cpu[i]) if i < len(cpu) else None
                r = _num(rss[i]) if i < len(rss) else None
                if c is not None:
                    tick[0] += c
                if r is not None:
                    tick[1] += r
                tick[2] += 1
            dst = self.values[(kind, key)]
            for name in ("cpu_pct", "rss"):
                self._field(dst, name).add_column(cols.get(name, []), weights)
        if kind == KIND_GPU:
            self.gpu_rows[key] += sum(weights) if weights is not None else len(ts)
            for i, evs in enumerate(cols.get("clock_events", [])):
                if isinstance(evs, list):
                    w = weights[i] if weights is not None and i < len(weights) else 1
                    for ev in evs:
                        if isinstance(ev, str):
                            self.clock_events[key][ev] += w
        elif kind == KIND_HEALTH:
            for state, msg in zip(cols.get("state", []), cols.get("message", [])):
                self._health(key, {"_rank": _HEALTH_RANK.get(state, 0), "state": state, "message": msg})
        if ts and kind in _LAST_KINDS:
            self._last(kind, key, {name: col[-1] for name, col in cols.items()})

    @staticmethod
    def _field(dst: dict, name: str) -> FieldStats:
        st = dst.get(name)
        if st is None:
            st = dst[name] = FieldStats()
        return st

    def _health(self, key: str, h: dict) -> None:
        if h["_rank"] >= self.health_worst.get(key, {}).get("_rank", -1):
            self.health_worst[key] = h
        self.health_last[key] = h

    def _last(self, kind: str, key: str, last: dict) -> None:
        prev = self.last.get((kind, key))
        if prev is not None and kind in _MERGE_LAST:
            # Keep fields a later sample left out (None), e.g. a partial info update.
            last = {**prev, **{k: v for k, v in last.items() if v is not None}}
        self.last[(kind, key)] = last

    def add_bad(self, counts: dict[str, int], reasons: dict[str, str]) -> None:
        for where, n in counts.items():
            self.bad_counts[where] = self.bad_counts.get(where, 0) + n
            self.bad_reasons.setdefault(where, reasons.get(where, ""))

    # -- merging ----------------------------------------------------------------------------
    def merge(self, o: "StatsPartial") -> None:
        """Add ``o``, the partial of the chunks after this one's."""
        self.n_samples += o.n_samples
        self.t_first, self.t_last = min(self.t_first, o.t_first), max(self.t_last, o.t_last)
        for kk, fields in o.values.items():
            dst = self.values[kk]
            for name, st in fields.items():
                self._field(dst, name).merge(st)
        for tick, (c, r, n) in o.tree_ticks.items():
            mine = self.tree_ticks.setdefault(tick, [0.0, 0.0, 0])
            mine[0] += c
            mine[1] += r
            mine[2] += n
        for tick, w in o.tick_weights.items():
            self.tick_weights[tick] = max(self.tick_weights.get(tick, 1), w)
        for kk, last in o.last.items():
            self._last(kk[0], kk[1], last)
        for key, n in o.gpu_rows.items():
            self.gpu_rows[key] += n
        for key, evs in o.clock_events.items():
            for ev, n in evs.items():
                self.clock_events[key][ev] += n
        for key in o.health_last:
            # ``o``'s worst, then its last: what adding its samples one by one would have left
            if key in o.health_worst:
                self._health(key, o.health_worst[key])
            self.health_last[key] = o.health_last[key]
        self.add_bad(o.bad_counts, o.bad_reasons)

    def to_json(self) -> dict:
        return {
            "n": self.n_samples,
            "t": [self.t_first, self.t_last] if self.n_samples else None,
            "fields": [[kind, key, name, st.to_json()] for (kind, key), f in self.values.items()
                       for name, st in f.items()],
            "ticks": [[t, c, r, n] for t, (c, r, n) in self.tree_ticks.items()],
            # (its own list, so that a reader of the files before it, which checks "ticks" rows of
            # four, still takes these frames)
            "tick_weights": [[t, w] for t, w in self.tick_weights.items()],
            "last": [[kind, key, last] for (kind, key), last in self.last.items()],
            "gpu_rows": dict(self.gpu_rows),
            "clock_events": {k: dict(v) for k, v in self.clock_events.items()},
            "health": [[k, self.health_worst.get(k), h] for k, h in self.health_last.items()],
            "bad": [[w, n, self.bad_reasons.get(w, "")] for w, n in self.bad_counts.items()],
        }

    @classmethod
    def from_json(cls, obj) -> "StatsPartial":
        """From ``to_json``'s dict (decoded from a file: every part checked); ValueError if bad."""
        p = cls()
        if not isinstance(obj, dict):
            raise ValueError("statistics")
        n = obj.get("n")
        if not _is_count(n):
            raise ValueError("sample count")
        p.n_samples = n
        if n:
            t = obj.get("t")
            if not (isinstance(t, list) and len(t) == 2):
                raise ValueError("times")
            p.t_first, p.t_last = _float(t[0]), _float(t[1])
        for row in _rows(obj, "fields", 4):
            kind, key, name, st = row
            p.values[(_str(kind), _str(key))][_str(name)] = FieldStats.from_json(st)
        for t, c, r, k in _rows(obj, "ticks", 4):
            if not _is_count(k):
                raise ValueError("tick")
            p.tree_ticks[_float(t)] = [_float(c), _float(r), k]
        if obj.get("tick_weights") is not None:   # (absent in frames of the code before it)
            for t, w in _rows(obj, "tick_weights", 2):
                if not _is_count(w) or not 1 <= w <= MAX_WEIGHT:
                    raise ValueError("tick weight")
                p.tick_weights[_float(t)] = w
        for kind, key, last in _rows(obj, "last", 3):
            if not isinstance(last, dict):
                raise ValueError("last row")
            # an info row's values are checked as its samples' are (a GPU name that is a dict,
            # a PID that is a string...): the same cleaned values whichever way the report reads
            clean = clean_samples([Sample(0.0, _str(kind), _str(key), last)])
            if not clean:
                raise ValueError("last row")
            p.last[(kind, key)] = dict(clean[0].data)
        for name in ("gpu_rows", "clock_events"):
            if not isinstance(obj.get(name), dict):
                raise ValueError(name)
        for k, v in obj["gpu_rows"].items():
            if not _is_count(v):
                raise ValueError("gpu rows")
            p.gpu_rows[k] = v
        for k, evs in obj["clock_events"].items():
            if not isinstance(evs, dict) or not all(_is_count(v) for v in evs.values()):
                raise ValueError("clock events")
            p.clock_events[k].update(evs)
        for key, worst, last in _rows(obj, "health", 3):
            # both or neither (the report reads the worst of every source it has a last row of),
            # each as the recorder writes it
            if (worst is None) != (last is None):
                raise ValueError("health")
            for h in (worst, last):
                if h is not None and not (isinstance(h, dict) and type(h.get("_rank")) is int
                                          and h.get("state") in HEALTH_STATES
                                          and isinstance(h.get("message", ""), str)):
                    raise ValueError("health")
            if worst is not None:
                p.health_worst[_str(key)] = worst
            if last is not None:
                p.health_last[_str(key)] = last
        for where, k, why in _rows(obj, "bad", 3):
            if not _is_count(k):
                raise ValueError("bad values")
            p.add_bad({_str(where): k}, {where: _str(why)})
        return p


def _rows(obj: dict, name: str, width: int) -> list:
    rows = obj.get(name)
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == width for r in rows):
        raise ValueError(name)
    return rows


def _str(v) -> str:
    if not isinstance(v, str):
        raise ValueError("not a string")
    return v
