"""The recording file's bytes: constants, what a file may cost, encoding, decoding, validation.

recording.py has the layout and the reasons for it; recording_reader.py reads files,
recorder.py writes them. Everything here is pure (no file, no thread).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass, field

from gputop.model import Sample

MAGIC = b"\x89GTREC\r\n"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1   # 1.1 added summary frames (S); a 1.0 reader skips them
_FILE_HEADER = struct.Struct("<8sHHI")
_FRAME_HEADER = struct.Struct("<2sccIIdd")
FRAME_MARK = b"GF"
FRAME_META, FRAME_CHUNK, FRAME_END, FRAME_SUMMARY = b"M", b"C", b"E", b"S"
FRAME_TYPES = (FRAME_META, FRAME_CHUNK, FRAME_END, FRAME_SUMMARY)
CODEC_JSON, CODEC_ZLIB = b"\x00", b"\x01"
CODECS = (CODEC_JSON, CODEC_ZLIB)

# What one file may cost. Recordings come from other people, so every count the file states or
# implies is bounded before it is allocated or looped over. The honest figures are the largest
# seen in the 27 committed recordings (8-GPU H200 sessions included); each limit leaves a wide
# margin over them and is far below what would hurt a 2-core laptop.
MAX_FRAME_BYTES = 16 * 1024 * 1024      # a frame's payload; an honest chunk is under 60 KB
MAX_DECODED_BYTES = 32 * 1024 * 1024    # a frame's payload once inflated; honest under 60 KB
MAX_INFLATION = 50                      # inflated / compressed per frame: honest JSON is under 10x,
MIN_INFLATION_ALLOWANCE = 4 * 1024      # a zlib bomb is ~1000x (small frames may inflate to this)
MAX_VALUES_PER_CHUNK = 500_000          # JSON values in one chunk (honest: under 10 000), so a
                                        # chunk of `[]` cannot build millions of objects
MAX_VALUES_PER_BYTE = 32                # ... and per compressed byte (honest: under 2)
MIN_VALUES_ALLOWANCE = 2_000            # small frames may hold this many whatever their size
MAX_VALUES_PER_FILE_BYTE = 8            # values in all chunks per byte of file (honest: under 2),
MIN_VALUES_PER_FILE = 1_000_000         # so reading a file costs time in proportion to its size
MAX_SAMPLES_PER_CHUNK = 100_000         # one second of samples; honest: under 200
MAX_DEPTH = 6                           # nesting of a value (honest: a list of strings, depth 1)
SUMMARY_DEPTH = -2 * MAX_DEPTH          # a summary's values start this deep: they nest twice as deep
MAX_STRING = 64 * 1024                  # one string (honest: a command line, a stack frame)
MAX_FRAMES_PER_FILE = 1 << 20           # one chunk a second: 12 days of recording
MAX_DAMAGED_PARTS = 1000                # more damaged places than this: the file is beyond repair
MAX_CHUNK_SPAN_S = 60.0                 # t1 - t0 of one chunk: one flush (1 s) plus late samples
CHUNK_SLACK_S = 10.0   # how far out of time order a chunk's first sample may be (late publishers)
TIME_TOLERANCE_S = 1e-3                 # header times vs sample times (samples are rounded to 0.1 ms)


class RecordingError(Exception):
    """A recording cannot be read. The message is one line for the user: what and what to do."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    offset: int      # of the frame header
    length: int      # payload length
    t0: float
    t1: float


@dataclass(frozen=True, slots=True)
class Damage:
    """A damaged part of a file that the reader skipped. ``t0``/``t1`` bound the time it covered
    (from the good chunks on either side) where known."""
    offset: int          # first byte lost
    length: int          # bytes lost
    what: str            # "chunk", "metadata", "end", "frame" (type unknown), "file header"
    reason: str          # one short phrase: "fails its checksum", "not valid JSON", ...
    t0: float | None = None
    t1: float | None = None

    def as_dict(self) -> dict:
        return {"offset": self.offset, "length": self.length, "what": self.what, "reason": self.reason,
                "t0": self.t0, "t1": self.t1}


@dataclass
class RecordingIndex:
    meta: dict = field(default_factory=dict)
    chunks: list[ChunkRef] = field(default_factory=list)
    end: dict | None = None            # the E frame's data when the session stopped cleanly
    truncated: bool = False            # the file ends inside a frame (killed, or still being written)
    # unreadable bytes after the last good frame that are not a frame cut short: junk, frames of
    # no known type, a damaged end frame (None: none, or the file was cut inside a frame)
    tail: "Damage | None" = None
    has_meta: bool = False
    scanned_to: int = 0                # offset after the last complete frame
    damaged: list[Damage] = field(default_factory=list)   # parts skipped, in file order
    bad_chunks: set[int] = field(default_factory=set)     # offsets of chunks found damaged when read
    summaries: list[ChunkRef] = field(default_factory=list)  # S frames, in file order (times 0, 0)

    def good_chunks(self) -> list[ChunkRef]:
        return [c for c in self.chunks if c.offset not in self.bad_chunks] if self.bad_chunks else self.chunks

    @property
    def t_start(self) -> float:
        return min((c.t0 for c in self.good_chunks()), default=0.0)

    @property
    def t_end(self) -> float:
        return max((c.t1 for c in self.good_chunks()), default=0.0)


# ---------------------------------------------------------------------------------------------
# Encoding


def _finite(v):
    """Replace NaN/inf (which JSON cannot hold) by None, recursively."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    return v


def _bounded(v, depth: int = 0):
    """``v`` as the reader takes it (``_check_value(v, depth)``): NaN/inf, an int past 64 bits and
    a container nested past MAX_DEPTH become None, a string past MAX_STRING is cut, a tuple is a
    list and a key a string. A writer that wrote them as they are made chunks its own reader
    refused whole (a RANK of 23 digits in the target's environment lost every chunk)."""
    if v is None or type(v) is bool:
        return v
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, int) and not isinstance(v, bool):
        return int(v) if -(1 << 63) <= v < (1 << 64) else None
    if isinstance(v, str):
        return str(v[:MAX_STRING])
    if depth > MAX_DEPTH:
        return None
    if isinstance(v, (list, tuple)):
        return [_bounded(x, depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k)[:MAX_STRING]: _bounded(x, depth + 1) for k, x in v.items()}
    return None   # (not a JSON value: json.dumps would refuse the chunk)


def encode_chunk_series(samples: list[Sample]) -> tuple[bytes, float, float, list[Series] | None, bytes]:
    """Samples -> (payload, t0, t1, series, codec): columnar per (kind, key), which compresses
    about 5-10x better; the payload's codec (``packed``); and the chunk's series exactly as
    ``validate_chunk(decode_payload(...))`` gives them back, where that is shown cheaply here
    (None where not: decode the payload; and where decoding would refuse the chunk -- one too
    big -- so that the caller sees the same refusal). Values past the reader's bounds are written
    bounded (``_bounded``): the reader takes every chunk its own writer wrote."""
    groups: dict[tuple[str, str], tuple[list, dict]] = {}
    for s in samples:
        g = groups.get((s.kind, s.key))
        if g is None:
            g = groups[(s.kind, s.key)] = ([], {})
        ts, cols = g
        n = len(ts)
        ts.append(round(s.t, 4))
        for name, v in s.data.items():
            col = cols.get(name)
            if col is None:
                col = cols[name] = [None] * n
            col.append(v)
        for col in cols.values():
            if len(col) < n + 1:
                col.append(None)
    series = [[kind, key, ts, cols] for (kind, key), (ts, cols) in groups.items()]
    # the chunk's span is that of the times it holds (rounded): a header t1 below its newest
    # rounded-up time hid a session's last samples from a replay that seeks to its end
    t0 = min(min(ts) for ts, _ in groups.values())
    t1 = max(max(ts) for ts, _ in groups.values())
    try:
        raw = json.dumps({"series": series}, separators=(",", ":"), allow_nan=False).encode()
        codec, payload = packed(raw)
        decoded = _as_decoded(series, raw, len(payload), t0, t1)
    except (ValueError, TypeError):   # NaN/inf, or a value JSON has no form for
        decoded = None
    if decoded is None:
        # (rare: a value past the reader's bounds, NaN/inf; or a chunk too big, which stays so)
        series = [[_bounded(kind), _bounded(key), ts, {str(name)[:MAX_STRING]: [_bounded(v, 1) for v in col]
                                                       for name, col in cols.items()}]
                  for kind, key, ts, cols in series]
        raw = json.dumps({"series": series}, separators=(",", ":"), allow_nan=False).encode()
        codec, payload = packed(raw)
        decoded = _as_decoded(series, raw, len(payload), t0, t1)
    return payload, t0, t1, decoded, codec


def _payload_ok(raw: bytes, n_payload: int) -> bool:
    """What decode_payload checks of an inflated payload (its size, its count of values)."""
    allowed = min(MAX_DECODED_BYTES, max(MIN_INFLATION_ALLOWANCE, MAX_INFLATION * n_payload))
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    return len(raw) < allowed and \
        values <= min(MAX_VALUES_PER_CHUNK, max(MIN_VALUES_ALLOWANCE, MAX_VALUES_PER_BYTE * n_payload))


def _as_decoded(series: list, raw: bytes, n_payload: int, t0: float, t1: float) -> list[Series] | None:
    """The encoder's own series where decoding ``raw`` gives equal values of the same types and
    ``validate_chunk`` passes them, else None. JSON gives back exactly the objects of exact types
    None, bool, int, float (finite: ``allow_nan=False`` took them; ``repr`` round-trips),
    str, list and dict with str keys; a tuple, a subclass (numpy, enums) or another key would
    come back changed, so any of them means None. The checks are validate_chunk's, on these."""
    if not _payload_ok(raw, n_payload):
        return None
    out: list[Series] = []
    n_samples = 0
    lo, hi = math.inf, -math.inf
    values: list = []   # every value of the chunk: checked at once (most series hold one sample)
    for kind, key, ts, cols in series:
        if type(kind) is not str or type(key) is not str or len(kind) > MAX_STRING or len(key) > MAX_STRING:
            return None
        n_samples += len(ts)
        if n_samples > MAX_SAMPLES_PER_CHUNK or set(map(type, ts)) != {float}:
            return None
        lo, hi = min(lo, min(ts)), max(hi, max(ts))
        for name, col in cols.items():
            if type(name) is not str or len(name) > MAX_STRING:
                return None
            values += col
        out.append((kind, key, ts, cols))
    if n_samples and (abs(lo - t0) > TIME_TOLERANCE_S or abs(hi - t1) > TIME_TOLERANCE_S):
        return None
    return out if _plain_list(values, 0) else None


def _plain_list(v: list, depth: int) -> bool:
    """``_check_value`` of each item of what decoding ``v`` gives (items at ``depth`` + 1), or
    False where that is not ``v`` itself. Scalars inline: this runs on every value written."""
    types = set(map(type, v))
    if types <= _FAST_TYPES:
        return True
    for x in v:
        t = type(x)
        if t is float or x is None or t is bool:
            continue
        if t is str:
            if len(x) > MAX_STRING:
                return False
        elif t is int:
            if not -(1 << 63) <= x < (1 << 64):
                return False
        elif t is list or t is dict:
            if not _plain(x, depth + 1):
                return False
        else:
            return False
    return True


def _plain(v, depth: int) -> bool:
    """``_check_value(decoded v, depth)``, or False where decoding ``v`` does not give ``v``."""
    t = type(v)
    if t is float or t is bool or v is None:
        return True
    if t is str:
        return len(v) <= MAX_STRING
    if t is int:
        return -(1 << 63) <= v < (1 << 64)
    if depth > MAX_DEPTH:
        return False
    if t is list:
        return _plain_list(v, depth)
    if t is dict:
        return all(type(k) is str and len(k) <= MAX_STRING for k in v) and _plain_list(list(v.values()), depth)
    return False


def frame_bytes(ftype: bytes, payload: bytes, codec: bytes = CODEC_ZLIB, t0: float = 0.0, t1: float = 0.0) -> bytes:
    crc = zlib.crc32(struct.pack("<dd", t0, t1) + payload)
    return _FRAME_HEADER.pack(FRAME_MARK, ftype, codec, len(payload), crc, t0, t1) + payload


def json_frame(ftype: bytes, obj: dict) -> bytes:
    """A frame of ``obj`` as it is (NaN/inf as null): ``meta_frame`` and ``summary_frame`` bound it
    as the reader does."""
    return frame_bytes(ftype, zlib.compress(json.dumps(_finite(obj), allow_nan=False).encode(), 6))


def packed(raw: bytes) -> tuple[bytes, bytes]:
    """(codec, payload) for a frame's JSON: zlib, unless the reader would take its inflation for a
    bomb (a long run of one character: a 100 KB command-line argument of one letter), then the
    JSON as it is."""
    z = zlib.compress(raw, 6)
    return (CODEC_ZLIB, z) if _payload_ok(raw, len(z)) else (CODEC_JSON, raw)


def _frame(ftype: bytes, obj: dict, depth: int) -> bytes:
    """``obj``'s frame, its values bounded as the reader checks them from ``depth``: as it is where
    it passes (the common case: a list-at-a-time check, ~5x cheaper than bounding a summary)."""
    try:
        raw = json.dumps(obj, allow_nan=False).encode() if _tree_ok(obj, depth) else None
    except (ValueError, TypeError):   # NaN/inf, or a value JSON has no form for
        raw = None
    if raw is None:
        raw = json.dumps(_bounded(obj, depth), allow_nan=False).encode()
    codec, payload = packed(raw)
    return frame_bytes(ftype, payload, codec)


def meta_frame(meta: dict, ftype: bytes = FRAME_META) -> bytes:
    """The metadata frame (or the end frame: ``FRAME_END``), bounded as check_meta reads them."""
    return _frame(ftype, meta, 0)


def summary_frame(summary: dict) -> bytes:
    return _frame(FRAME_SUMMARY, summary, SUMMARY_DEPTH)   # (check_summary's bounds)


def crc_ok(payload: bytes, crc: int, t0: float, t1: float) -> bool:
    return zlib.crc32(struct.pack("<dd", t0, t1) + payload) == crc


# ---------------------------------------------------------------------------------------------
# Decoding


class FrameDamaged(Exception):
    """One frame cannot be used (its own content is bad); the reader skips it. ``str`` is a phrase."""


def decode_payload(codec: bytes, payload: bytes):
    """Inflate and parse a frame's payload, bounded: the inflated size (absolute and against the
    compressed size) and the number of JSON values are checked before ``json.loads`` builds
    anything, so a small frame cannot become gigabytes of objects."""
    allowed = min(MAX_DECODED_BYTES, max(MIN_INFLATION_ALLOWANCE, MAX_INFLATION * len(payload)))
    if codec == CODEC_ZLIB:
        d = zlib.decompressobj()
        try:
            raw = d.decompress(payload, allowed)
        except zlib.error:
            raise FrameDamaged("compressed data is damaged") from None
        if d.unconsumed_tail:
            raise FrameDamaged(f"inflates past {allowed >> 10} KiB (a compression bomb?)")
    elif codec == CODEC_JSON:
        raw = payload
    else:
        raise FrameDamaged(f"unknown codec {codec!r}")
    # Every JSON value is the first in its container or follows a comma: this bounds how many
    # objects parsing can make, in C and without parsing.
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    if values > min(MAX_VALUES_PER_CHUNK, max(MIN_VALUES_ALLOWANCE, MAX_VALUES_PER_BYTE * len(payload))):
        raise FrameDamaged(f"holds {values} values, more than a recording writes")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FrameDamaged("not valid JSON") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed in a recording")


_SCALARS = (type(None), bool, int, float, str)


def _check_value(v, depth: int = 0) -> bool:
    if isinstance(v, _SCALARS):
        if isinstance(v, str):
            return len(v) <= MAX_STRING
        # json.loads makes ints of any size (a 4000-digit int would break str() and arithmetic)
        return not isinstance(v, int) or isinstance(v, bool) or -(1 << 63) <= v < (1 << 64)
    if depth > MAX_DEPTH:
        return False
    if isinstance(v, list):
        return all(_check_value(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and len(k) <= MAX_STRING and _check_value(x, depth + 1) for k, x in v.items())
    return False


_INT_MIN, _INT_MAX = -(1 << 63), 1 << 64
_JSON_SCALARS = frozenset({float, bool, type(None), str, int})
_STR_TYPE, _INT_TYPE, _CONTAINERS = {str}, {int}, frozenset({list, dict})


def _tree_ok(v, depth: int = 0) -> bool:
    """``_check_value(v, depth)``, a container's items checked a list at a time (by the set of
    their types, the longest string, the extreme ints) rather than one call each: a summary
    frame is a few hundred kB of JSON, mostly lists of numbers and strings. Lists of one type
    (columns of numbers, of names) take the shortest path; it is the report's largest cost
    after parsing the JSON (tests/test_report_partials.py checks it against ``_check_value``)."""
    t = type(v)
    if t is list:
        items = v
    elif t is dict:
        if v and (set(map(type, v)) != _STR_TYPE or max(map(len, v)) > MAX_STRING):
            return False
        items = v.values()
    else:
        return _check_value(v, depth)
    if depth > MAX_DEPTH:
        return False
    if not items:
        return True
    types = set(map(type, items))
    if types <= _FAST_TYPES:
        return True
    if types == _STR_TYPE:
        return max(map(len, items)) <= MAX_STRING
    if types == _INT_TYPE:
        return min(items) >= _INT_MIN and max(items) < _INT_MAX
    if str in types and max(len(x) for x in items if type(x) is str) > MAX_STRING:
        return False
    if int in types:
        ints = [x for x in items if type(x) is int]
        if min(ints) < _INT_MIN or max(ints) >= _INT_MAX:
            return False
    rest = types - _JSON_SCALARS
    if not rest:
        return True
    if not rest <= _CONTAINERS:
        return False   # not what JSON parses to
    depth += 1
    for x in items:
        tx = type(x)
        if (tx is list or tx is dict) and not _tree_ok(x, depth):
            return False
    return True


def check_summary(obj) -> dict:
    """A summary frame's payload: an object; its parts are checked by whoever reads them
    (derive/record_stats.py), values bounded in size and depth like a chunk's."""
    if not isinstance(obj, dict) or not _tree_ok(obj, SUMMARY_DEPTH):
        raise FrameDamaged("summary is not an object of bounded size and depth")
    return obj


def check_meta(obj) -> None:
    if not isinstance(obj, dict) or not _check_value(obj):
        raise FrameDamaged("metadata is not an object of bounded size and depth")


Series = tuple  # (kind: str, key: str, ts: list[float], cols: dict[str, list])


def validate_chunk(obj, t0: float | None = None, t1: float | None = None) -> list[Series]:
    """Check a decoded chunk's structure, bounds and (given the header's) times; return its
    columnar series. Raises FrameDamaged with a phrase."""
    if not isinstance(obj, dict) or not isinstance(obj.get("series"), list):
        raise FrameDamaged("unexpected structure")
    out: list[Series] = []
    n_samples = 0
    lo, hi = math.inf, -math.inf
    for entry in obj["series"]:
        if not (isinstance(entry, list) and len(entry) == 4):
            raise FrameDamaged("unexpected structure")
        kind, key, ts, cols = entry
        if not (isinstance(kind, str) and isinstance(key, str) and isinstance(ts, list) and isinstance(cols, dict)):
            raise FrameDamaged("unexpected structure")
        if len(kind) > MAX_STRING or len(key) > MAX_STRING:
            raise FrameDamaged("a name is too long")
        n = len(ts)
        n_samples += n
        if n_samples > MAX_SAMPLES_PER_CHUNK:
            raise FrameDamaged(f"holds more than {MAX_SAMPLES_PER_CHUNK} samples")
        if ts:
            # (checked a list at a time: JSON gives no NaN, but ints of any size, which float()
            # cannot take, and 1e999 as inf)
            if not set(map(type, ts)) <= _TIME_TYPES:
                raise FrameDamaged("a sample time is not a number")
            t_lo, t_hi = min(ts), max(ts)
            if not (_INT_MIN <= t_lo and t_hi < _INT_MAX and math.isfinite(t_lo) and math.isfinite(t_hi)):
                raise FrameDamaged("a sample time is not a number")
            lo, hi = min(lo, t_lo), max(hi, t_hi)
        for name, col in cols.items():
            if not isinstance(name, str) or not isinstance(col, list) or len(col) != n:
                raise FrameDamaged("unexpected structure")
            # (a column is a list of values each at depth 1: _tree_ok checks it a list at a time,
            # a third of what reading a recording cost when each value was a call)
            if len(name) > MAX_STRING or not _tree_ok(col):
                raise FrameDamaged("a value is too long or too deeply nested")
        out.append((kind, key, ts, cols))
    if t0 is not None and n_samples:
        # The header's times are what the index seeks by: they must be the samples' own.
        if abs(lo - t0) > TIME_TOLERANCE_S or abs(hi - t1) > TIME_TOLERANCE_S:
            raise FrameDamaged("its header times do not match its samples")
    return out


_FAST_TYPES = frozenset({type(None), bool, float})   # scalars that need no further check
_TIME_TYPES = frozenset({int, float})


def samples_of(series: list[Series]) -> list[Sample]:
    """Columnar series -> samples sorted by time."""
    out: list[Sample] = []
    for kind, key, ts, cols in series:
        names = list(cols)
        columns = [cols[c] for c in names]
        for i in range(len(ts)):
            out.append(Sample(float(ts[i]), kind, key, {name: col[i] for name, col in zip(names, columns)}))
    out.sort(key=lambda s: s.t)
    return out
