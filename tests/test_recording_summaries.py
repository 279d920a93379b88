"""Summary frames (format 1.1): the report merged from them is the report read from every sample.

Real H200 recordings are re-recorded through the recorder itself (session/rerecord.py), which
writes summary frames; the report of the new file is built twice, from its summaries and from
every sample (the whole-file replay), and must be the same report. Cut-short and damaged files
must still give the report that reading their samples gives.
"""

from __future__ import annotations

import math
import os
import random

import pytest

from gputop import report as R
from gputop.derive.record_stats import RELATIVE_ERROR, FieldStats, StatsPartial
from gputop.derive.stats import percentile
from gputop.session.recording import FORMAT_MINOR, RecordingReader
from gputop.session.rerecord import rerecord
from gputop.verdicts.recording_summary import RecordingSummarizer

REAL = os.path.join(os.path.dirname(__file__), "data", "h200", "real")


def _full_report(path: str) -> dict:
    """The report built without the summary frames: every sample read, verdicts replayed."""
    orig = R._read_summaries
    R._read_summaries = lambda reader: None
    try:
        return R.build_report(path)
    finally:
        R._read_summaries = orig


def _used_summaries(path: str) -> R._Summaries | None:
    with RecordingReader(path) as r:
        return R._read_summaries(r)


def _same(a, b, where="report"):
    if isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        # sums merged minute by minute may differ from one sum in the last bit
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def rerecorded(tmp_path_factory):
    out = {}
    for name in ("hf_trainer-run", "checkpoint_stall-pid"):
        dst = str(tmp_path_factory.mktemp("rec") / f"{name}.gtrec")
        rec = rerecord(os.path.join(REAL, f"{name}.gtrec"), dst, RecordingSummarizer())
        assert rec.error is None and rec.summary_error is None
        out[name] = dst
    return out


@pytest.mark.parametrize("name", ["hf_trainer-run", "checkpoint_stall-pid"])
def test_summary_report_equals_full_replay_report(rerecorded, name):
    path = rerecorded[name]
    with RecordingReader(path) as r:
        assert r.format_version == (1, FORMAT_MINOR) and r.index.summaries
    got = _used_summaries(path)
    assert got is not None and got.final is not None, "the fast path must be the one taken"
    fast = R.build_report(path)
    _same(fast, _full_report(path))
    assert fast.get("verdicts") is not None and "budget" in fast
    # ... and the same statistics as the original file's (format 1.0, read from every sample).
    # (Not the same verdicts to the last bit: the copy's times are the original's rounded to
    # 0.1 ms, so the processors run 0.04 ms apart and may see a boundary sample differently.)
    orig = R.build_report(os.path.join(REAL, f"{name}.gtrec"), recompute_verdicts=False)
    _same({k: fast[k] for k in ("gpus", "host", "sources")}, {k: orig[k] for k in ("gpus", "host", "sources")})
    assert fast["session"]["samples"] == orig["session"]["samples"]


def test_cut_short_file_reports_as_its_samples(rerecorded, tmp_path):
    """gputop killed: no final summary; the minute summaries still give the statistics of what
    they cover, the rest is read, and the verdicts are replayed: the same report as the full."""
    src = str(tmp_path / "every10s.gtrec")
    rerecord(os.path.join(REAL, "hf_trainer-run.gtrec"), src, RecordingSummarizer(), summary_s=10.0)
    with RecordingReader(src) as r:
        assert len(r.index.summaries) >= 4
        chunks = r.index.chunks
    data = open(src, "rb").read()
    cut = chunks[len(chunks) * 3 // 4].offset + 40   # inside a chunk frame
    dst = tmp_path / "cut.gtrec"
    dst.write_bytes(data[:cut])
    got = _used_summaries(str(dst))
    assert got is not None and got.final is None and got.stats.n_samples > 0
    rep = R.build_report(str(dst))
    assert rep["session"]["truncated"]
    _same(rep, _full_report(str(dst)))


def test_damaged_summary_is_skipped_and_samples_read(rerecorded, tmp_path):
    src = rerecorded["checkpoint_stall-pid"]
    with RecordingReader(src) as r:
        s = r.index.summaries[-1]
    data = bytearray(open(src, "rb").read())
    data[s.offset + 40] ^= 0x55
    dst = tmp_path / "damaged.gtrec"
    dst.write_bytes(bytes(data))
    with RecordingReader(str(dst)) as r:
        assert any(d.what == "summary" for d in r.index.damaged)
        assert R._read_summaries(r) is None
    rep = R.build_report(str(dst))
    assert rep["session"]["damage"] and "summary" in rep["session"]["damage"]
    _same(rep, _full_report(str(dst)))


def test_a_failing_summarizer_never_stops_the_recording(tmp_path):
    class Broken(RecordingSummarizer):
        def add(self, series, t0, t1):
            raise RuntimeError("boom")

    dst = str(tmp_path / "x.gtrec")
    rec = rerecord(os.path.join(REAL, "demo.gtrec"), dst, Broken())
    assert rec.error is None and "boom" in rec.summary_error
    with RecordingReader(dst) as r:
        assert not r.index.summaries and r.index.end is not None and r.index.chunks
    original = R.build_report(os.path.join(REAL, "demo.gtrec"), recompute_verdicts=False)
    assert R.build_report(dst, recompute_verdicts=False)["session"]["samples"] == original["session"]["samples"]


def test_histogram_percentiles_within_stated_error():
    rng = random.Random(3)
    for values in ([rng.lognormvariate(3, 2) for _ in range(5000)], [rng.uniform(-50, 50) for _ in range(999)],
                   [0.0] * 10 + [rng.uniform(0, 1) for _ in range(90)], [42.0] * 7, [1e12, 3.5e12, 2e12]):
        st = FieldStats()
        st.add_column(values)
        xs = sorted(values)
        for q in (50, 95):
            exact = percentile(xs, q)
            assert abs(st.percentile(q) - exact) <= RELATIVE_ERROR * max(abs(exact), abs(xs[0]), abs(xs[-1]), 1e-9) * 2
        assert st.summary()["max"] == round(xs[-1], 3) and st.summary()["n"] == len(xs)


def test_partials_merge_like_one_and_refuse_bad_json():
    rng = random.Random(5)
    vals = [rng.uniform(0, 100) for _ in range(300)]
    one, parts = StatsPartial(), StatsPartial()
    one.add("gpu", "0", list(range(300)), {"sm": vals})
    for i in range(0, 300, 70):
        p = StatsPartial()
        p.add("gpu", "0", list(range(i, min(i + 70, 300))), {"sm": vals[i:i + 70]})
        parts.merge(StatsPartial.from_json(p.to_json()))
    assert parts.values[("gpu", "0")]["sm"].summary() == one.values[("gpu", "0")]["sm"].summary()
    bad = one.to_json()
    bad["fields"][0][3][4] = [1, 10 ** 30]          # a count no recorder writes
    with pytest.raises(ValueError):
        StatsPartial.from_json(bad)


def test_a_calm_host_ticks_weight_survives_a_summary_frame_and_a_bad_one_is_refused():
    """The target tree's calm tick weights (their own list, ``tick_weights``) go through a summary
    frame's JSON and merge; a frame of the code before them (no list) still reads, each tick 1;
    a weight no recorder writes refuses the frame (the report then reads the samples instead)."""
    p = StatsPartial()
    p.add("proc", "7", [1.0, 3.0], {"cpu_pct": [10.0, 20.0], "rss": [1.0, 2.0], "calm_factor": [None, 2]})
    got = StatsPartial.from_json(p.to_json())
    assert got.tick_weights == {3.0: 2} and got.tree_ticks == p.tree_ticks
    old = p.to_json()
    del old["tick_weights"]
    assert StatsPartial.from_json(old).tick_weights == {}
    for bad in ([[3.0, 0]], [[3.0, 10 ** 6]], [[3.0, 2.5]], [[3.0]], "x"):
        frame = p.to_json()
        frame["tick_weights"] = bad
        with pytest.raises(ValueError):
            StatsPartial.from_json(frame)
