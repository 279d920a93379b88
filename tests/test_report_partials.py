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
