"""The one place where values read from a recording are type- and range-checked.

A recording is well-formed JSON, but nothing stops it from holding a list where a health state
belongs, a start time of 1e300, a 4000-digit integer or a value nested 900 deep (a damaged,
hand-edited or hostile file). Everything after the reader (report, replay, the UI, the
derivations) may trust what comes out of here:

- a field gputop knows has the type gputop writes there (``SCHEMA``; ``None`` is always allowed:
  it means "no value"), or it is None;
- numbers are finite and within +-1e18 (no gputop measurement is bigger; bigger ones would also
  make later sums overflow); sample times within +-1e10 s;
- strings are at most ``MAX_STRING`` characters (longer ones are cut, with an ellipsis);
- lists and dicts are nested at most ``MAX_DEPTH`` deep (a deeper value becomes None).

Good data comes back unchanged (the very same objects), so results do not move. A bad value
becomes None and ``BadValues`` keeps one line of reason per field, which the report prints.

Also here, for output: ``printable`` (a recorded string made safe for a terminal) and
``json_safe`` (a report made strict JSON). The recording reader itself (recording.py) checks
framing, sizes and the JSON; this module checks what the values mean.
"""

from __future__ import annotations

import math
import re
from typing import Iterable

from gputop.model import HEALTH_STATES, Sample
from gputop.sources.probe_fields import MEMORY_FIELDS

MAX_NUMBER = 1e18
MAX_TIME_S = 1e10
MAX_STRING = 16384
MAX_KEY = 256
MAX_DEPTH = 8
MAX_WALL = 1e11          # a wall-clock time after the year 5000 is not one gputop recorded

# Expected types: N number (int or float, not bool), I int, S str, B bool, L list, LS list of
# str, D dict, A anything (the generic bounds only). Fields not listed get the generic bounds.
N, I, S, B, L, LS, D, A = "number", "int", "str", "bool", "list", "list of str", "dict", "any"  # noqa: E741


def _table(**by_type: str) -> dict[str, str]:
    return {name: t for t, names in by_type.items() for name in names.split()}


# What gputop writes, kind by kind (checked against every committed recording).
SCHEMA: dict[str, dict[str, str]] = {
    "gpu": _table(list="clock_events"),          # every other gpu field is a number (below)
    "gpu_info": _table(str="chosen_by cuda_driver driver name nvml_version pci_bus_id uuid",
                       bool="gpm mig watched", dict="na",
                       number="architecture clock_mem_max_mhz clock_sm_max_mhz index mem_total power_limit_w"),
    "gpu_procs": _table(number="other_count other_mem", dict="procs others", str="sm_na"),
    "health": _table(str="state message cgroup pyspy pyspy_version target_state", bool="calm found gil_known",
                     list="probes",
                     number="behind_s cost_pct kernel_rate_hz kernel_threads kernel_threads_capped procs "
                            "pyspy_cpu_pct rate_hz rate_requested_hz restarts sampler_cpu_pct threads tick_ms "
                            "window_s windows"),
    "event": _table(str="level message"),
    "phase": _table(str="label phase startup_text", number="since training_since", dict="startup"),
    "budget": _table(number="blocked_in_calls cpu_after_sync seconds window_s", list="changes",
                     dict="cpu_owners frames phases probe shares stalls startup",
                     str="from gpu_source largest phase pid startup_text"),
    "probe_config": _table(list="amp_autocast loaders",
                           bool="anomaly_detection cuda_build cuda_initialized cudnn_benchmark cudnn_deterministic "
                                "deterministic_algorithms tf32_cudnn tf32_matmul",
                           str="capability cuda device_name dist_backend float32_matmul_precision step_source "
                               "torch torch_info",
                           dict="compile hooks optimizer",
                           number="cudnn device local_rank num_threads rank sync_debug_mode_job world_size"),
    "probe_memory": _table(number=" ".join(("device", "rank") + MEMORY_FIELDS)),   # (the declared fields: one home)
    "probe_step": _table(dict="step_hist flops_by_dtype collective_ops", str="sync_top flops_dtype flops_off "
                         "collective_top_op collective_off recompile_fn recompile_where recompile_reason "
                         "compile_off recompile_limit_fn recompile_limit_where kernel_off",
                         bool="flops_varies loss_scale_read"),   # the rest are numbers
    "probe_sync": _table(list="lines", number="rank total"),
    "proc": _table(str="name role state"),                    # the rest are numbers
    "proc_info": _table(list_of_str="cmdline", str="name role user", number="create_time ppid"),
    "rank": _table(str="gpu_hint name node rank_var source state why cuda_visible_devices",
                   number="launcher_pid local_rank local_world_size pid rank restart_count world_size"),
    "stacks": _table(dict="code", number="calm_factor dur_s rate_hz t0", list="frames threads",
                     bool="main subprocesses"),
    "system": {},                                             # all numbers
    "target": _table(str="command state", number="exit_t pid", bool="python"),
    "thread": _table(str="name state"),                       # the rest are numbers
    "thread_kernel": _table(list="cols threads", number="calm_factor dur_s t0 ticks", bool="gil_known main python",
                            str="python_version"),
    "thread_state": _table(str="comm idle_kind name role top where", bool="gil_known python"),
    "verdict": _table(bool="active", str="advice severity summary title",
                      number="confidence first_seen level lost_share since", dict="evidence", list="missing"),
    "verdict_change": _table(bool="active", str="severity title", number="since"),
    "verdict_primary": _table(number="confidence lost_share since", str="id phase severity summary title why",
                              list="others"),
}
# Kinds whose fields not listed above are all numbers.
NUMERIC_KINDS = frozenset({"gpu", "probe_step", "proc", "system", "thread", "thread_state"})
for _kind in SCHEMA:
    SCHEMA[_kind] = {f: (LS if t == "list_of_str" else t) for f, t in SCHEMA[_kind].items()}

META_SCHEMA = _table(str="gputop_version format host platform python benchmark", list_of_str="argv",
                     int="gputop_pid", dict="target sources fixture")
META_SCHEMA = {f: (LS if t == "list_of_str" else t) for f, t in META_SCHEMA.items()}
TARGET_SCHEMA = {"pid": I, "name": S, "cmdline": LS, "user": S, "create_time": N, "python": B}
SOURCE_SCHEMA = {"state": S, "message": S, "rates": D}


class BadValues:
    """Why values became None: one reason per place (``kind.field``), with a count."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.reasons: dict[str, str] = {}

    def add(self, where: str, why: str) -> None:
        where = printable(where, 80)
        self.counts[where] = self.counts.get(where, 0) + 1
        self.reasons.setdefault(where, why)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def summary(self, limit: int = 40) -> dict[str, str]:
        """{place: "reason (n values)"}, the first ``limit`` places in the order found."""
        out = {}
        for where in list(self.counts)[:limit]:
            n = self.counts[where]
            out[where] = f"{self.reasons[where]}" + (f" ({n} values)" if n > 1 else "")
        if len(self.counts) > limit:
            out["..."] = f"{len(self.counts) - limit} more fields"
        return out


def _type_name(v) -> str:
    return {list: "a list", dict: "an object", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(v), type(v).__name__)


_TOO_DEEP = f"nested deeper than {MAX_DEPTH}"


def _bounded(v, depth: int = 0):
    """(value within the generic bounds, reason or None). Clean input is returned as is."""
    t = type(v)
    if v is None or t is bool:
        return v, None
    if t is float or t is int:
        # NaN fails both comparisons; a huge int is compared exactly, never converted
        if -MAX_NUMBER <= v <= MAX_NUMBER:
            return v, None
        return None, "not finite" if t is float and not math.isfinite(v) else "out of range (beyond 1e18)"
    if t is str:
        if len(v) <= MAX_STRING:
            return v, None
        return v[:MAX_STRING - 1] + "…", f"a string of {len(v)} characters, cut to {MAX_STRING}"
    if t is list or t is dict:
        if depth >= MAX_DEPTH:
            return None, _TOO_DEEP
        if _within_bounds(v, depth):
            return v, None
        why = None
        if t is list:
            out = None
            for i, x in enumerate(v):
                y, w = _bounded(x, depth + 1)
                if w is _TOO_DEEP:
                    return None, w   # the whole value, not a hollowed-out shape of it
                if w is not None:
                    why = why or w
                    if out is None:
                        out = list(v)
                    out[i] = y
            return (v if out is None else out), why
        outd = None
        for k, x in v.items():
            y, w = _bounded(x, depth + 1)
            if w is _TOO_DEEP:
                return None, w
            if w is None and len(k) > MAX_KEY:
                w = f"a key of {len(k)} characters"
            if w is not None:
                why = why or w
                if outd is None:
                    outd = dict(v)
                if len(k) > MAX_KEY:
                    del outd[k]
                    continue
                outd[k] = y
        return (v if outd is None else outd), why
    return None, f"{t.__name__} is not a JSON value"


def _within_bounds(v, depth: int) -> bool:
    """Whether a list or dict and everything in it is within the generic bounds (then ``_bounded``
    gives it back as it is): one walk with no call per item, the numbers checked at once. The
    recorder's summary chain checks every py-spy window, thread_kernel row and verdict as it is
    written, and the recursive walk per item was most of that (~100k calls a minute). False
    sends the value to the item-by-item walk, which says what is wrong."""
    todo = [(v, depth)]
    nums: list = []
    while todo:
        x, d = todo.pop()
        if d >= MAX_DEPTH:
            return False
        if type(x) is dict:
            for k in x:
                if type(k) is not str or len(k) > MAX_KEY:
                    return False
            x = x.values()
        for y in x:
            t = type(y)
            if t is float or t is int:
                nums.append(y)
            elif t is str:
                if len(y) > MAX_STRING:
                    return False
            elif t is list or t is dict:
                todo.append((y, d + 1))
            elif not (y is None or t is bool):
                return False
    # (a NaN or an infinity makes the sum not finite; values within 1e18 cannot overflow it)
    return not nums or (-MAX_NUMBER <= min(nums) and max(nums) <= MAX_NUMBER and math.isfinite(sum(nums)))


def clean_value(v, want: str = A, depth: int = 0):
    """(v checked against ``want`` and the generic bounds, reason or None)."""
    if v is None:
        return None, None
    t = type(v)
    if want == N and (t is bool or t not in (int, float)) or want == I and t is not int:
        return None, f"{_type_name(v)} where a number belongs"
    if want == S and t is not str or want == B and t is not bool:
        return None, f"{_type_name(v)} where {'a string' if want == S else 'true/false'} belongs"
    if want in (L, LS) and t is not list or want == D and t is not dict:
        return None, f"{_type_name(v)} where {'an object' if want == D else 'a list'} belongs"
    if want == LS and not all(type(x) is str for x in v):
        return None, "a list with items that are not strings"
    return _bounded(v, depth)


def _want(kind: str, name: str) -> str:
    fields = SCHEMA.get(kind)
    if fields is None:
        return A
    got = fields.get(name)
    if got is None:
        return N if kind in NUMERIC_KINDS else A
    return got


# Fields with a closed set of values: anything else becomes None.
ENUMS: dict[tuple[str, str], tuple] = {("health", "state"): HEALTH_STATES}


_NONE = type(None)
_NUMBERS = {float, int, _NONE}
_STRINGS = {str, _NONE}
_BOOLS = {bool, _NONE}
_ONLY_NONE = {_NONE}


def _column_ok(col: list, want: str, allowed) -> bool:
    """The fast check of a whole column of plain values (nearly every column is one). The bounds
    are taken with min/max over the column (the recorder's summary chain checks ~300 columns a
    second, most of one or two values: per-value generators were most of their cost)."""
    types = set(map(type, col))
    if types <= _NUMBERS:
        if want not in (N, A):
            return types == _ONLY_NONE
        vals = [v for v in col if v is not None] if _NONE in types else col
        # (min/max pass over a NaN that is not first: the sum of finite values within 1e18 is finite)
        return not vals or (-MAX_NUMBER <= min(vals) and max(vals) <= MAX_NUMBER and math.isfinite(sum(vals)))
    if types <= _STRINGS:
        if want not in (S, A):
            return False
        vals = [v for v in col if v is not None] if _NONE in types else col
        return max(map(len, vals)) <= MAX_STRING and (allowed is None or all(v in allowed for v in vals))
    if types <= _BOOLS:
        return want in (B, A)
    return False


_SPECS: dict[tuple[str, str], tuple[str, tuple | None]] = {}   # (kind, field) -> (want, allowed)


def _spec(kind: str, name: str) -> tuple[str, tuple | None]:
    got = _SPECS.get((kind, name))
    if got is None:
        got = (_want(kind, name), ENUMS.get((kind, name)))
        if len(_SPECS) < 65536:   # (names come from files too: bounded)
            _SPECS[(kind, name)] = got
    return got


def _clean_column(kind: str, name: str, col: list, bad: BadValues | None) -> list:
    want, allowed = _spec(kind, name)
    if _column_ok(col, want, allowed):
        return col
    out = None
    for i, v in enumerate(col):
        t = type(v)
        # fast paths for what nearly every value is
        if v is None:
            continue
        if (t is float or t is int) and want in (N, A) and -MAX_NUMBER <= v <= MAX_NUMBER:
            continue
        if t is str and want in (S, A) and len(v) <= MAX_STRING and (allowed is None or v in allowed):
            continue
        got, why = clean_value(v, want)
        if why is None and allowed is not None and got not in allowed:
            got, why = None, "not one of " + "/".join(allowed)
        if why is None:
            continue
        if out is None:
            out = list(col)
        out[i] = got
        if bad is not None:
            bad.add(f"{kind}.{name}", why)
    return col if out is None else out


def clean_series(kind: str, key: str, ts: list, cols: dict, bad: BadValues | None = None):
    """One columnar series of a chunk (RecordingReader.read_series), checked; None to drop it
    (a key no gputop writes). Rows at impossible times are dropped."""
    if len(key) > MAX_KEY or len(kind) > MAX_KEY:
        if bad is not None:
            bad.add(f"{kind[:40]} key", f"a key of {len(key)} characters")
        return None
    return _clean_rows(kind, key, ts, cols, bad)


def clean_chunk(series: list, bad: BadValues | None = None) -> tuple[list, list]:
    """A chunk's series checked once for both users of it: (``clean_series`` of each, for the
    statistics; the series whose ``samples_of`` is ``clean_samples(samples_of(series))``, for
    the replay). Both check values and times alike and drop a key longer than ``MAX_KEY``; only
    a longer kind differs: the statistics drop it, the replay (clean_samples) keeps it."""
    stats, replay = [], []
    for kind, key, ts, cols in series:
        got = clean_series(kind, key, ts, cols, bad)
        if got is not None:
            stats.append(got)
            replay.append(got)
        elif len(key) <= MAX_KEY:
            replay.append(_clean_rows(kind, key, ts, cols, None))
    return stats, replay


def _clean_rows(kind: str, key: str, ts: list, cols: dict, bad: BadValues | None):
    # (the reader has checked that times are finite numbers)
    if ts and not (-MAX_TIME_S <= min(ts) and max(ts) <= MAX_TIME_S):
        keep = [j for j, u in enumerate(ts) if -MAX_TIME_S <= u <= MAX_TIME_S]
        if bad is not None:
            bad.add(f"{kind}.t", "a sample time beyond 1e10 s")
        ts = [ts[j] for j in keep]
        cols = {n: [c[j] for j in keep] for n, c in cols.items()}
    new = None
    for name, col in cols.items():
        got = _clean_column(kind, name, col, bad)
        if got is not col:
            if new is None:
                new = dict(cols)
            new[name] = got
    return kind, key, ts, (cols if new is None else new)


def clean_samples(samples: Iterable[Sample], bad: BadValues | None = None) -> list[Sample]:
    """Samples (RecordingReader.read_chunk) checked the same way; unchanged ones are the same
    objects. Replay calls this on every chunk it reads."""
    out = []
    for s in samples:
        if len(s.key) > MAX_KEY or not -MAX_TIME_S <= s.t <= MAX_TIME_S:
            if bad is not None:
                bad.add(f"{s.kind[:40]} key", "a key or time no gputop writes")
            continue
        new = None
        for name, v in s.data.items():
            t = type(v)
            if v is None or ((t is float or t is int) and -MAX_NUMBER <= v <= MAX_NUMBER
                             and _want(s.kind, name) in (N, A)):
                continue   # the fast path: nearly every value is a number where one belongs
            got, why = clean_value(v, _want(s.kind, name))
            allowed = ENUMS.get((s.kind, name))
            if why is None and allowed is not None and got is not None and got not in allowed:
                got, why = None, "not one of " + "/".join(allowed)
            if why is not None:
                if new is None:
                    new = dict(s.data)
                new[name] = got
                if bad is not None:
                    bad.add(f"{s.kind}.{name}", why)
        out.append(s if new is None else Sample(s.t, s.kind, s.key, new))
    return out


def _clean_dict(d: dict, schema: dict[str, str], where: str, bad: BadValues | None) -> dict:
    out = {}
    for k, v in d.items():
        got, why = clean_value(v, schema.get(k, A))
        if len(k) > MAX_KEY:
            got, why = None, f"a key of {len(k)} characters"
        if why is not None:
            if bad is not None:
                bad.add(f"{where}.{k}", why)
            if got is None:
                continue   # left out: .get() gives None, and a default where a caller has one
        out[k] = got
    return out


def clean_meta(meta: dict, bad: BadValues | None = None) -> dict:
    """The recording's metadata (RecordingReader.meta), checked: a copy without the values that
    failed (so ``meta.get(k, default)`` gives the default)."""
    out = _clean_dict({k: v for k, v in meta.items() if k != "start_wall"}, META_SCHEMA, "meta", bad)
    wall, why = clean_value(meta.get("start_wall"), N)
    if why is None and wall is not None and not 0 <= wall < MAX_WALL:
        wall, why = None, "not a wall-clock time (out of range)"
    if why is not None and bad is not None:
        bad.add("meta.start_wall", why)
    if wall is not None:
        out["start_wall"] = wall
    if isinstance(out.get("target"), dict):
        out["target"] = _clean_dict(out["target"], TARGET_SCHEMA, "meta.target", bad)
    if isinstance(out.get("sources"), dict):
        sources = {}
        for name, src in out["sources"].items():
            if isinstance(src, dict):
                sources[name] = _clean_dict(src, SOURCE_SCHEMA, f"meta.sources.{name}", bad)
            elif src is not None and bad is not None:
                bad.add(f"meta.sources.{name}", f"{_type_name(src)} where an object belongs")
        out["sources"] = sources
    return out


# ---------------------------------------------------------------------------------------------
# Output

# Bidirectional-text controls (embeddings, overrides, isolates, marks): U+202E makes a terminal
# show what follows backwards ("gnp.exe" for "exe.png"), so recorded text and a job's output
# never carry them to the screen. The one list; the Output view (ui/joblog.py) reads it too.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff" + BIDI_CONTROLS + "]")


def _escape(m: re.Match) -> str:
    c = m.group()
    if c in BIDI_CONTROLS:
        return f"\\u{ord(c):04x}"
    return " " if c in "\t\n\r" else f"\\x{ord(c):02x}" if ord(c) < 0x100 else "?"


def printable(s, limit: int = 500) -> str:
    """A recorded string as a terminal may show it: control characters (escape sequences, line
    breaks) written out as ``\\x1b``, lone surrogates as ``?``, at most ``limit`` characters."""
    s = str(s)
    if len(s) > limit:
        s = s[:limit - 1] + "…"
    return _CONTROL.sub(_escape, s)


def printable_tree(v, limit: int = 500, depth: int = 0):
    """``printable`` applied to every string (and dict key) of a JSON-able value; containers
    deeper than a report needs become None."""
    if isinstance(v, str):
        return printable(v, limit)
    if isinstance(v, dict):
        if depth > 2 * MAX_DEPTH:
            return None
        return {printable(k, limit) if isinstance(k, str) else k: printable_tree(x, limit, depth + 1)
                for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        if depth > 2 * MAX_DEPTH:
            return None
        return [printable_tree(x, limit, depth + 1) for x in v]
    return v


def json_safe(v, depth: int = 0):
    """A JSON-able value that ``json.dumps(..., allow_nan=False)`` accepts: NaN and infinities
    become null, and so do integers beyond +-1e18 and containers nested absurdly deep."""
    t = type(v)
    if t is float:
        return v if math.isfinite(v) else None
    if t is int:
        return v if -MAX_NUMBER <= v <= MAX_NUMBER else None
    if t is dict or isinstance(v, dict):
        if depth > 4 * MAX_DEPTH:
            return None
        return {(k if isinstance(k, str) else str(k)): json_safe(x, depth + 1) for k, x in v.items()}
    if t is list or isinstance(v, (list, tuple)):
        if depth > 4 * MAX_DEPTH:
            return None
        return [json_safe(x, depth + 1) for x in v]
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, int) and not isinstance(v, bool):
        return int(v) if -MAX_NUMBER <= v <= MAX_NUMBER else None
    return v
