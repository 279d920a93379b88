"""A stall snapshot read from a file someone sent is data, never trusted: wrong types, missing
parts and hostile strings give n/a and words, never a traceback (describe_snapshot, the report's
section, the Stall view's lines), and a recording round-trips a real-shaped snapshot exactly."""

from __future__ import annotations

import pytest

from gputop.catalogue import KIND_STALL_SNAPSHOT
from gputop.derive.stall import describe_snapshot, report_lines, report_section, snapshot_lines
from gputop.model import Sample
from gputop.session.recording import RecordingReader, RecordingWriter
from gputop.sources.stall_snapshot import parse_dump

GOOD = {"t": 16.5, "since": 14.2, "reason": "no_step", "last_step_t": 14.2, "median_step_s": 0.02, "dump_ms": 90.0,
        "gpus": {"0": {"util_gpu": 0, "sm_active": 0.0, "mem_used": 3 * 2**30, "mem_total": 141 * 2**30}},
        "ranks": [{"pid": 7, "rank": 0, "last_step_t": 14.2, "error": None, "dump_ms": 80.0},
                  {"pid": 8, "rank": 1, "last_step_t": 14.1, "error": "py-spy dump failed: denied", "dump_ms": 3.0}],
        "threads": [{"pid": 7, "tid": 7, "name": "MainThread", "active": False, "owns_gil": False, "main": True,
                     "frames": [["all_reduce", "torch/distributed/distributed_c10d.py", 2500,
                                 "/x/site-packages/torch/distributed/distributed_c10d.py"],
                                ["step", "train.py", 88, "/home/u/train.py"]]}]}


def test_a_good_snapshot_in_words():
    lines = snapshot_lines(GOOD)
    assert lines[0] == "stalled at 0:16, no progress since 0:14 (no step)"
    assert "GPU 0: no kernel running (util 0%), SM active 0%, memory 3.0 GiB of 141 GiB" in lines
    assert "rank 0 (pid 7): in all_reduce() at step (train.py:88) since 0:14 (its last step)" in lines
    assert "rank 1 (pid 8): no stacks: py-spy dump failed: denied" in lines


@pytest.mark.parametrize("bad", [
    {}, {"ranks": "x"}, {"ranks": [1, None, {"pid": [1]}], "threads": {"a": 1}},
    {"threads": [{"pid": 7, "frames": [1, [None], ["a"], [1, 2, 3, 4]]}], "ranks": [{"pid": 7, "rank": "zero"}]},
    {"gpus": [1], "t": "soon", "since": float("inf"), "median_step_s": "fast", "last_step_t": True},
    {"gpus": {"0": {"util_gpu": "x", "mem_used": None}}, "ranks": [{"pid": 7}],
     "threads": [{"pid": 7, "main": "yes", "frames": [["\x1b[2J", "\x00", -1, 5]]}]},
])
def test_damaged_snapshots_are_read_without_a_traceback(bad):
    d = describe_snapshot(bad)
    assert isinstance(d["ranks"], list)
    lines = snapshot_lines(bad)
    assert lines and all(isinstance(x, str) for x in lines)
    sec = report_section([Sample(1.0, KIND_STALL_SNAPSHOT, "job", bad)])
    assert sec["count"] == 1 and report_lines(sec)


def test_py_spy_output_that_is_not_a_thread_list_is_refused_in_words():
    for out in ("{}", "[1, 2]", "null"):
        try:
            assert parse_dump(out, 1) == []
        except ValueError as e:
            assert "list of threads" in str(e)
    with pytest.raises(ValueError):
        parse_dump("not json", 1)


def test_a_recording_round_trips_the_snapshot(tmp_path):
    path = tmp_path / "s.gtrec"
    w = RecordingWriter(str(path), {"gputop_version": "test"})
    w.write_samples([Sample(16.5, KIND_STALL_SNAPSHOT, "job", GOOD)])
    w.close({"clean": True})
    r = RecordingReader(str(path))
    got = [s for ref in r.index.chunks for s in r.read_chunk(ref)]
    assert [(s.kind, s.key, s.data) for s in got] == [(KIND_STALL_SNAPSHOT, "job", GOOD)]
