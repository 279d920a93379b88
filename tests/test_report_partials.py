"""The report's sections (Python stacks, probe, ranks, efficiency, stall) merged from the summary
frames' partials equal the sections built from every sample (derive/report_partials.py).

Real H200 recordings are re-recorded through the recorder (session/rerecord.py); the report of the
new file is built from its summary frames only and from every sample, and must be the same."""

from __future__ import annotations

import os

import pytest

from gputop import report as R
from gputop.session.recording import RecordingReader
from gputop.session.rerecord import rerecord
from gputop.verdicts.recording_summary import RecordingSummarizer
from tests.test_recording_summaries import _full_report, _same

DATA = os.path.join(os.path.dirname(__file__), "data", "h200")
REAL = os.path.join(DATA, "real")
NAMES = ("real/hf_trainer-run", "real/checkpoint_stall-pid", "issue15/stall_ranks")   # ranks + stall snapshots


def _merged(path: str):
    with RecordingReader(path) as r:
        return R._merged_frames(R._read_summaries(r))


@pytest.fixture(scope="module")
def rerecorded(tmp_path_factory):
    out = {}
    for name in NAMES:
        dst = str(tmp_path_factory.mktemp("rec") / "copy.gtrec")
        rec = rerecord(os.path.join(DATA, f"{name}.gtrec"), dst, RecordingSummarizer(), summary_s=10.0)
        assert rec.error is None and rec.summary_error is None
        out[name] = dst
    return out


@pytest.mark.parametrize("name", NAMES)
def test_sections_from_partials_equal_sections_from_samples(rerecorded, name):
    path = rerecorded[name]
    assert _merged(path) is not None, "the sections must come from the summary frames"
    fast, full = R.build_report(path), _full_report(path)
    _same(fast, full)
    assert fast["stacks"]["available"] and fast["stacks"]["threads"] and fast["stacks"]["top_frames"]["all"]
    for sec in ("probe", "efficiency") + (("ranks", "stall") if "ranks" in name else ()):
        assert sec in fast and "error" not in fast[sec], sec


def test_sections_are_built_without_reading_covered_chunks(rerecorded, monkeypatch):
    """Only the chunks after the last summary frame are read (none for a cleanly stopped file)."""
    path = rerecorded["real/hf_trainer-run"]
    read = []
    orig = RecordingReader.read_series
    monkeypatch.setattr(RecordingReader, "read_series", lambda self, ref: read.append(ref) or orig(self, ref))
    R.build_report(path)
    with RecordingReader(path) as r:
        last = r.index.summaries[-1].offset
        assert not [ref for ref in read if ref.offset < last] and len(r.index.chunks) > 5


def test_cut_short_file_merges_partials_and_its_tail(rerecorded, tmp_path):
    src = rerecorded["real/hf_trainer-run"]
    with RecordingReader(src) as r:
        chunks = r.index.chunks
    data = open(src, "rb").read()
    dst = tmp_path / "cut.gtrec"
    dst.write_bytes(data[:chunks[len(chunks) * 3 // 4].offset + 40])
    merged = _merged(str(dst))
    assert merged is not None
    rep = R.build_report(str(dst))
    assert rep["session"]["truncated"]
    _same(rep, _full_report(str(dst)))


def test_damaged_partial_falls_back_to_the_samples(rerecorded, tmp_path):
    """A partial no recorder writes (a hostile file with a valid frame) never reaches a section:
    that section is built from the samples, and the report is still the one of every sample."""
    class Hostile(RecordingSummarizer):
        def take(self):
            out = super().take()
            out["sections"]["parts"]["stacks"]["threads"] = [["not", "a", "thread"]]
            out["sections"]["parts"]["efficiency"]["gpu"] = {"0": [[1.0], [2.0]]}
            return out

    dst = str(tmp_path / "hostile.gtrec")
    rerecord(os.path.join(REAL, "hf_trainer-run.gtrec"), dst, Hostile(), summary_s=10.0)
    rep = R.build_report(dst)
    _same(rep, _full_report(dst))
    assert rep["stacks"]["available"] and "error" not in rep["efficiency"]


def test_frames_without_sections_are_read_as_before(tmp_path):
    """A format-1.1 file written before summary frames had ``sections``: its statistics and
    verdicts still come from the frames, the sections from every sample."""
    class Older(RecordingSummarizer):
        def take(self):
            out = super().take()
            del out["sections"]
            return out

    dst = str(tmp_path / "older.gtrec")
    rerecord(os.path.join(REAL, "checkpoint_stall-pid.gtrec"), dst, Older())
    with RecordingReader(dst) as r:
        got = R._read_summaries(r)
    assert got is not None and got.final is not None and got.sections is None and _merged(dst) is None
    _same(R.build_report(dst), _full_report(dst))


def test_frames_of_another_layout_are_read_from_the_samples(tmp_path):
    """Frames of layout 1 (names written out, before the string tables) or any other layout
    than the reader's are not merged: the sections come from every sample, and are the same."""
    class Layout1(RecordingSummarizer):
        def take(self):
            out = super().take()
            out["sections"]["v"] = 1
            return out

    dst = str(tmp_path / "layout1.gtrec")
    rerecord(os.path.join(REAL, "demo.gtrec"), dst, Layout1(), summary_s=10.0)
    assert _merged(dst) is None
    _same(R.build_report(dst), _full_report(dst))


def test_string_table_index_out_of_range_falls_back(tmp_path):
    """A hot-frame or thread row naming a string the table does not hold is refused (the section
    is built from the samples), never an IndexError or a wrong name."""
    class BadIndex(RecordingSummarizer):
        def take(self):
            out = super().take()
            stacks = out["sections"]["parts"]["stacks"]
            if stacks["hot"][1]:
                stacks["hot"][1][0] = len(stacks["s"])
            for row in stacks["threads"]:
                if row[7]:
                    row[7][0] = -1
            return out

    dst = str(tmp_path / "badindex.gtrec")
    rerecord(os.path.join(REAL, "demo.gtrec"), dst, BadIndex(), summary_s=10.0)
    merged = _merged(dst)
    stacks = next(s for s in R.SECTIONS if s.name == "stacks")
    with pytest.raises(ValueError):
        merged.build(stacks, {})
    rep = R.build_report(dst)
    _same(rep, _full_report(dst))
    assert rep["stacks"]["available"] and rep["stacks"]["top_frames"]["all"]


def test_summary_value_check_is_the_chunk_check():
    """check_summary's list-at-a-time check (recording_format._tree_ok) says what the value-by-
    value check says: too long strings and keys, ints past 64 bits, too deep, non-JSON types."""
    import random

    from gputop.session import recording_format as F

    rng = random.Random(3)
    scalars = [1.5, None, True, 3, -(1 << 63), 1 << 64, (1 << 64) - 1, -(1 << 63) - 1, "x",
               "y" * (F.MAX_STRING + 1), "z" * F.MAX_STRING, 10 ** 40, (1,), object()]

    def gen(d):
        r = rng.random()
        if d > 9 or r < 0.4:
            return rng.choice(scalars)
        if r < 0.7:
            return [gen(d + 1) for _ in range(rng.randint(0, 4))]
        keys = ["a", "b", "k" * (F.MAX_STRING + 1), 7]
        return {rng.choice(keys) if rng.random() < 0.1 else rng.choice(keys[:2]): gen(d + 1)
                for _ in range(rng.randint(0, 3))}

    verdicts = set()
    for _ in range(5000):
        v = gen(rng.randint(0, 6))
        for depth in (0, -2 * F.MAX_DEPTH, 3):
            got = F._tree_ok(v, depth)
            assert got == F._check_value(v, depth), v
            verdicts.add(got)
    assert verdicts == {True, False}
    with pytest.raises(F.FrameDamaged):
        F.check_summary({"sections": {"s": ["n" * (F.MAX_STRING + 1)]}})
    with pytest.raises(F.FrameDamaged):
        deep = [1]
        for _ in range(3 * F.MAX_DEPTH):
            deep = [deep]
        F.check_summary({"stats": deep})


@pytest.mark.parametrize("span", [[1.0], [], [0.0, 1e308], "x"])
def test_a_damaged_span_falls_back_to_the_samples(tmp_path, span):
    """A stacks partial whose time span is short, empty, out of bounds or not a list: the section
    is built from the samples (it was an IndexError, reported as the section's error)."""
    class BadSpan(RecordingSummarizer):
        def take(self):
            out = super().take()
            out["sections"]["parts"]["stacks"]["t"] = span
            return out

    dst = str(tmp_path / "badspan.gtrec")
    rerecord(os.path.join(REAL, "demo.gtrec"), dst, BadSpan(), summary_s=10.0)
    rep = R.build_report(dst)
    _same(rep, _full_report(dst))
    assert rep["stacks"]["available"] and "error" not in rep["stacks"]
