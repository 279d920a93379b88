"""The recorder hands its summaries the series it encoded instead of decoding the chunk again
(recording_format.encode_chunk_series): only where they are exactly what decoding gives, values
and types. A value past the reader's bounds, or one JSON does not give back unchanged, is made
plain and bounded before it is written, and the series handed over are what the reader then
decodes. Checked on every sample of every committed recording and on such values."""

from __future__ import annotations

import enum
import glob
import os

import pytest
import zlib

from gputop.model import Sample
from gputop.session.recorder import CHUNK_SAMPLES
from gputop.session.recording_format import (
    CODEC_JSON, CODEC_ZLIB, MAX_DEPTH, MAX_STRING, FrameDamaged, decode_payload, encode_chunk_series, validate_chunk,
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


def _decoded(payload: bytes, t0: float, t1: float, codec: bytes = CODEC_ZLIB):
    return validate_chunk(decode_payload(codec, payload), t0, t1)


def test_series_of_every_committed_recording_are_what_decoding_gives():
    files = sorted(glob.glob(os.path.join(DATA, "**", "*.gtrec"), recursive=True))
    assert len(files) >= 20
    n_chunks = 0
    for path in files:
        with RecordingReader(path) as r:
            samples = [s for ref in r.index.good_chunks()[:20] for s in r.read_chunk(ref)]   # 20 s of each
        for i in range(0, len(samples), 500):
            piece = samples[i:i + 500]
            payload, t0, t1, series, codec = encode_chunk_series(piece)
            assert codec == CODEC_ZLIB
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
def test_values_json_changes_are_written_as_json_gives_them_back(value):
    samples = [Sample(1.0 + i / 10, "gpu", "0", {"util": 1.0, "x": value}) for i in range(5)]
    payload, t0, t1, series, codec = encode_chunk_series(samples)
    # (made plain before writing: a tuple a list, a key a str, a subclass its base type)
    assert series is not None
    _same_typed(list(series), _decoded(payload, t0, t1, codec))


def test_nan_is_written_as_no_value():
    payload, t0, t1, series, codec = encode_chunk_series([Sample(0.5, "gpu", "0", {"dram_bw": float("nan"), "x": 1.0})])
    assert series is not None and series[0][3] == {"dram_bw": [None], "x": [1.0]}
    assert _decoded(payload, t0, t1, codec)[0][3] == {"dram_bw": [None], "x": [1.0]}


@pytest.mark.parametrize("value", [
    "x" * (MAX_STRING + 1),       # validate_chunk refuses these: so must the shortcut
    1 << 70,
    -(1 << 64),
    "deep",                       # nested past MAX_DEPTH
])
def test_what_the_reader_refuses_is_written_bounded_and_the_chunk_read(value):
    """A value past the reader's bounds once made the writer write a chunk its own reader refused
    whole (an audit: a 23-digit RANK in the target's environment lost every chunk of a session)."""
    if value == "deep":
        value = 1
        for _ in range(MAX_DEPTH + 1):
            value = [value]
    payload, t0, t1, series, codec = encode_chunk_series([Sample(2.0, "gpu", "0", {"v": value, "x": 1.0})])
    got = _decoded(payload, t0, t1, codec)
    assert series is not None and repr(list(series)) == repr(got)
    v = got[0][3]["v"][0]
    assert got[0][3]["x"] == [1.0]
    if isinstance(value, str):
        assert v == value[:MAX_STRING]
    elif isinstance(value, int):
        assert v is None
    else:   # the list nested past MAX_DEPTH: its deepest level is no value
        for _ in range(MAX_DEPTH):   # (a column value is at depth 1; lists to MAX_DEPTH are kept)
            assert isinstance(v, list) and len(v) == 1
            v = v[0]
        assert v is None


def test_a_chunk_that_compresses_like_a_bomb_is_written_as_plain_json():
    # a chunk of one repeated sample compresses past what decode_payload allows zlib to inflate:
    # zlib-compressed, the reader refused it as a bomb
    samples = [Sample(3.0, "gpu", "0", {"util": None}) for _ in range(CHUNK_SAMPLES)]
    payload, t0, t1, series, codec = encode_chunk_series(samples)
    with pytest.raises(FrameDamaged, match="compression bomb"):
        decode_payload(CODEC_ZLIB, zlib.compress(payload if codec == CODEC_JSON else b"", 6))
    assert codec == CODEC_JSON
    assert series is not None and len(_decoded(payload, t0, t1, codec)[0][2]) == CHUNK_SAMPLES


def test_plain_values_and_ints_in_range_are_handed_over():
    samples = [Sample(4.0 + i / 10, "thread", "12", {"tid": 12, "cpu": 0.5 * i, "name": "w", "ok": True,
                                                       "big": (1 << 64) - 1, "neg": -(1 << 63), "none": None,
                                                       "ev": {"a": [1, 2.5, "s", None, {"b": False}]}})
               for i in range(4)]
    payload, t0, t1, series, _ = encode_chunk_series(samples)
    assert series is not None
    _same_typed(list(series), _decoded(payload, t0, t1))


def test_the_recorder_summarizes_a_chunk_it_wrote_as_plain_json(tmp_path):
    """A chunk with a 100 KB one-letter string and an int time is written as plain JSON and its
    series decoded again for the summary: it was decoded as zlib, and the summaries stopped."""
    from gputop.session.recorder import Recorder, RecordingWriter
    from gputop.session.recording_reader import RecordingReader
    from gputop.verdicts.recording_summary import RecordingSummarizer

    path = tmp_path / "r.gtrec"
    rec = Recorder(RecordingWriter(str(path), {"gputop_version": "test"}), summarizer=RecordingSummarizer(),
                   summary_s=1.0)
    for sec in range(3):
        rec.on_samples([Sample(sec, "proc_info", "1", {"cmdline": ["python", "x" * 100_000]}),
                        Sample(sec + 0.5, "gpu", "0", {"util_gpu": 50.0})])
        rec.flush()
    rec.stop({"clean": True})
    assert rec.error is None and rec.summary_error is None, rec.summary_error
    with RecordingReader(str(path)) as r:
        assert r.index.summaries and not r.index.damaged
        assert any(s.kind == "proc_info" for ref in r.index.chunks for s in r.read_chunk(ref))
