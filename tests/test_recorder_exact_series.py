"""The recorder hands its summaries the series it encoded instead of decoding the chunk again
(recording_format.encode_chunk_series): only where they are exactly what decoding gives, values
and types, and where decoding would refuse the chunk it hands nothing (so the caller decodes and
sees the refusal). Checked on every sample of every committed recording and on values that JSON
does not give back unchanged."""

from __future__ import annotations

import enum
import glob
import os

import pytest

from gputop.model import Sample
from gputop.session.recorder import CHUNK_SAMPLES
from gputop.session.recording_format import (
    CODEC_ZLIB, MAX_DEPTH, MAX_STRING, FrameDamaged, decode_payload, encode_chunk, encode_chunk_series, validate_chunk,
)
from gputop.session.recording_reader import RecordingReader

DATA = os.path.join(os.path.dirname(__file__), "data", "h200")


def _same_typed(a, b, where="") -> None:
    """Equal, and of the very same types all the way down (1 == 1.0 == True would pass ==)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_typed(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same_typed(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"


def _decoded(payload: bytes, t0: float, t1: float):
    return validate_chunk(decode_payload(CODEC_ZLIB, payload), t0, t1)


def test_series_of_every_committed_recording_are_what_decoding_gives():
    files = sorted(glob.glob(os.path.join(DATA, "**", "*.gtrec"), recursive=True))
    assert len(files) >= 20
    n_chunks = 0
    for path in files:
        with RecordingReader(path) as r:
            samples = [s for ref in r.index.good_chunks()[:20] for s in r.read_chunk(ref)]   # 20 s of each
        for i in range(0, len(samples), 500):
            piece = samples[i:i + 500]
            payload, t0, t1, series = encode_chunk_series(piece)
            assert (payload, t0, t1) == encode_chunk(piece)
            assert series is not None, f"{path}: a real chunk should need no decoding"
            # (repr tells 1 from 1.0 and True, a tuple from a list, 1 from "1"; fast on big chunks)
            assert repr(list(series)) == repr(_decoded(payload, t0, t1)), os.path.basename(path)
            n_chunks += 1
    assert n_chunks > 60


class Level(enum.IntEnum):
    HIGH = 2


class Ratio(float):
    pass


@pytest.mark.parametrize("value", [
    (1, 2),                       # a tuple comes back a list
    {1: "a"},                     # a non-str key comes back a str
    Level.HIGH,                   # an int subclass comes back a plain int
    Ratio(0.5),                   # so does a float subclass (numpy's float64 is one)
    [Ratio(0.5)],
    {"a": {"b": (1,)}},
])
def test_values_json_changes_are_decoded_again(value):
    samples = [Sample(1.0 + i / 10, "gpu", "0", {"util": 1.0, "x": value}) for i in range(5)]
    payload, t0, t1, series = encode_chunk_series(samples)
    assert series is None
    _decoded(payload, t0, t1)   # decodes fine: the caller uses this


def test_nan_is_decoded_again():
    payload, t0, t1, series = encode_chunk_series([Sample(0.5, "gpu", "0", {"dram_bw": float("nan"), "x": 1.0})])
    assert series is None
    assert _decoded(payload, t0, t1)[0][3] == {"dram_bw": [None], "x": [1.0]}


@pytest.mark.parametrize("value", [
    "x" * (MAX_STRING + 1),       # validate_chunk refuses these: so must the shortcut
    1 << 70,
    -(1 << 64),
    "deep",                       # nested past MAX_DEPTH
])
def test_what_decoding_refuses_is_never_handed_over(value):
    if value == "deep":
        value = 1
        for _ in range(MAX_DEPTH + 1):
            value = [value]
    payload, t0, t1, series = encode_chunk_series([Sample(2.0, "gpu", "0", {"v": value})])
    assert series is None
    with pytest.raises(FrameDamaged):
        _decoded(payload, t0, t1)


def test_a_compression_bomb_of_our_own_is_decoded_again():
    # a chunk of one repeated sample compresses past what decode_payload allows
    samples = [Sample(3.0, "gpu", "0", {"util": None}) for _ in range(CHUNK_SAMPLES)]
    payload, t0, t1, series = encode_chunk_series(samples)
    assert series is None
    with pytest.raises(FrameDamaged, match="compression bomb"):
        _decoded(payload, t0, t1)


def test_plain_values_and_ints_in_range_are_handed_over():
    samples = [Sample(4.0 + i / 10, "thread", "12", {"tid": 12, "cpu": 0.5 * i, "name": "w", "ok": True,
                                                       "big": (1 << 64) - 1, "neg": -(1 << 63), "none": None,
                                                       "ev": {"a": [1, 2.5, "s", None, {"b": False}]}})
               for i in range(4)]
    payload, t0, t1, series = encode_chunk_series(samples)
    assert series is not None
    _same_typed(list(series), _decoded(payload, t0, t1))
