"""Replay mechanics: the clock, seeking, speed limits, processors re-run, a growing file.

These tests use a recording written by the real writer with simple counter samples: what is
tested is the replay clock, not the meaning of the numbers.
"""

from __future__ import annotations

import threading

import pytest

from gputop.model import Sample
from gputop.session.recording import RecordingWriter
from gputop.session.replay import RECORDED_SUFFIX, ReplaySession
from gputop.session.store import CallbackSubscriber
from gputop.session.whole_replay import replay_whole


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _write(path, seconds=120, end=True):
    w = RecordingWriter(str(path), {"target": {"pid": 42}})
    for sec in range(seconds):
        batch = [Sample(sec + i / 10, "gpu", "0", {"i": sec * 10 + i}) for i in range(10)]
        batch.append(Sample(sec + 0.5, "verdict", "x", {"from_file": sec}))
        w.write_samples(batch)
    if end:
        w.close({"clean": True})
    return w


class CountingProcessor:
    name = "counter"
    produces = ("verdict",)
    interval_s = 1.0

    def __init__(self):
        self.calls = []
        self.resets = 0

    def process(self, store, now):
        self.calls.append(now)
        last = store.latest("gpu", "0")
        return [Sample(now, "verdict", "x", {"recomputed": last.data["i"] if last else None})]

    def reset(self):
        self.resets += 1


def test_plays_at_speed_and_stops_at_end(tmp_path):
    _write(tmp_path / "r.gtrec")
    clock = FakeClock()
    s = ReplaySession(str(tmp_path / "r.gtrec"), clock=clock)
    assert s.position == s.t_start == 0.0
    s.tick()                  # first tick only starts the clock
    clock.t += 2.0
    s.tick()
    assert s.position == pytest.approx(2.0)
    assert s.store.latest("gpu", "0").data["i"] == 20
    s.set_speed(16)
    clock.t += 10
    s.tick()
    assert s.position == s.t_end  # clamped at the end
    assert not s.playing          # a finished recording stops at its end
    s.set_speed(100)
    assert s.speed == 16
    s.set_speed(0.01)
    assert s.speed == 0.25


def test_faster_slower_walk_the_speed_ladder(tmp_path):
    _write(tmp_path / "r.gtrec", seconds=5)
    s = ReplaySession(str(tmp_path / "r.gtrec"))
    seen = []
    for _ in range(8):
        s.faster()
        seen.append(s.speed)
    assert seen == [2, 4, 8, 16, 16, 16, 16, 16]
    for _ in range(9):
        s.slower()
    assert s.speed == 0.25


def test_seek_back_rebuilds_the_store_and_resets_processors(tmp_path):
    _write(tmp_path / "r.gtrec")
    proc = CountingProcessor()
    s = ReplaySession(str(tmp_path / "r.gtrec"), processors=[proc], start_playing=False)
    s.seek(90)
    assert s.store.latest("gpu", "0").data["i"] == 900
    oldest = s.store.series("gpu", "0")[0]
    assert oldest.t >= 90 - s.seek_window_s
    resets = proc.resets
    s.seek_relative(-60)
    assert s.position == 30
    assert proc.resets == resets + 1
    assert s.store.latest("gpu", "0").data["i"] == 300
    assert all(x.t <= 30 for x in s.store.series("gpu", "0"))
    s.seek(-5)
    assert s.position == s.t_start
    s.seek(10_000)
    assert s.position == s.t_end


def test_processors_rerun_and_recorded_kinds_are_kept_apart(tmp_path):
    _write(tmp_path / "r.gtrec", seconds=20)
    proc = CountingProcessor()
    s = ReplaySession(str(tmp_path / "r.gtrec"), processors=[proc], start_playing=False)
    s.seek(10)
    recomputed = s.store.latest("verdict", "x")
    recorded = s.store.latest("verdict" + RECORDED_SUFFIX, "x")
    assert recomputed.data == {"recomputed": 100}
    assert recorded.data == {"from_file": 9}


def test_processors_see_the_same_windows_at_any_speed(tmp_path):
    _write(tmp_path / "r.gtrec", seconds=30)
    runs = []
    for speed, step in ((1.0, 0.1), (16.0, 0.5)):
        clock = FakeClock()
        proc = CountingProcessor()
        s = ReplaySession(str(tmp_path / "r.gtrec"), processors=[proc], clock=clock)
        s.set_speed(speed)
        s.tick()
        while s.playing:
            clock.t += step
            s.tick()
        runs.append([round(c, 6) for c in proc.calls])
    assert runs[0] == runs[1]
    assert len(runs[0]) >= 29


def test_step_pauses_and_moves_one_second(tmp_path):
    _write(tmp_path / "r.gtrec", seconds=10)
    s = ReplaySession(str(tmp_path / "r.gtrec"))
    assert s.playing
    s.step()
    assert not s.playing and s.position == 1.0
    s.step(-1.0)
    assert s.position == 0.0


def test_follows_a_file_still_being_written(tmp_path):
    path = tmp_path / "live.gtrec"
    w = RecordingWriter(str(path), {"a": 1})
    w.write_samples([Sample(0.0, "gpu", "0", {"i": 0}), Sample(1.0, "gpu", "0", {"i": 1})])
    clock = FakeClock()
    s = ReplaySession(str(path), clock=clock)
    assert s.growing
    s.tick()
    clock.t += 5
    s.tick()
    assert s.position == 1.0 and s.playing  # waits at the end of a growing file
    w.write_samples([Sample(2.0, "gpu", "0", {"i": 2}), Sample(3.0, "gpu", "0", {"i": 3})])
    clock.t += 5
    s.tick()
    assert s.t_end == 3.0
    clock.t += 5
    s.tick()
    assert s.store.latest("gpu", "0").data["i"] == 3
    w.close()
    clock.t += 1
    s.tick()
    assert not s.growing


def test_a_failing_processor_becomes_a_health_sample_not_a_crash(tmp_path):
    _write(tmp_path / "r.gtrec", seconds=5)

    class Broken(CountingProcessor):
        name = "broken"

        def process(self, store, now):
            raise ZeroDivisionError("a bug in a rule")

    s = ReplaySession(str(tmp_path / "r.gtrec"), processors=[Broken()], start_playing=False)
    s.seek(3.0)
    h = s.store.latest("health", "broken")
    assert h.data["state"] == "failed" and "ZeroDivisionError: a bug in a rule" in h.data["message"]


# -- the whole-file replay (gputop/session/whole_replay.py) -----------------------------------------

def _one_play_to_the_end(path, processor):
    """The whole file in one ``play_to``: what the service must give, whatever its steps."""
    got = []
    s = ReplaySession(str(path), processors=[processor], start_playing=False, seek_window_s=0.0)
    s.bus.subscribe(CallbackSubscriber(lambda ss: got.extend(x for x in ss if x.kind.startswith("verdict"))))
    s.play_to(s.t_end)
    s.stop()
    return got


def test_whole_replay_gives_the_processors_output_with_progress(tmp_path):
    path = tmp_path / "r.gtrec"
    _write(path, seconds=30)
    fractions = []
    got = replay_whole(str(path), [CountingProcessor()], progress=fractions.append, step_s=1.0)
    expected = _one_play_to_the_end(path, CountingProcessor())
    assert got.of_kind("verdict") == [x for x in expected if x.kind == "verdict"]
    assert got.recorded("verdict") == []  # only the kinds asked for (default: what the processors produce)
    assert not got.cancelled and got.error is None and got.covers_to == got.t_end
    assert (got.t_start, got.t_end) == (0.0, pytest.approx(29.9))
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) == 30


def test_whole_replay_keeps_recorded_kinds_when_asked(tmp_path):
    path = tmp_path / "r.gtrec"
    _write(path, seconds=10)
    got = replay_whole(str(path), [CountingProcessor()], kinds=("verdict", "verdict" + RECORDED_SUFFIX))
    assert [x.data["from_file"] for x in got.recorded("verdict")] == list(range(10))
    assert all("recomputed" in x.data for x in got.of_kind("verdict"))


def test_whole_replay_stops_when_cancelled(tmp_path):
    path = tmp_path / "r.gtrec"
    _write(path, seconds=60)
    cancel = threading.Event()

    def progress(fraction):
        if fraction >= 0.25:
            cancel.set()

    proc = CountingProcessor()
    got = replay_whole(str(path), [proc], progress=progress, cancel=cancel, step_s=1.0)
    assert got.cancelled and got.covers_to == pytest.approx(15.0)
    assert max(proc.calls) <= 15.0


def test_whole_replay_of_a_damaged_file_raises_or_keeps_the_error(tmp_path):
    path = tmp_path / "bad.gtrec"
    path.write_bytes(b"not a recording at all")
    with pytest.raises(Exception):
        replay_whole(str(path), [CountingProcessor()])
    got = replay_whole(str(path), [CountingProcessor()], errors="keep")
    assert got.error and got.samples == [] and got.covers_to is None


def test_a_replay_offers_the_whole_file_and_says_what_it_computes(tmp_path):
    path = tmp_path / "r.gtrec"
    _write(path, seconds=10)
    s = ReplaySession(str(path), processors=[CountingProcessor()], start_playing=False)
    assert s.replay_path == str(path) and s.derived_kinds == {"verdict"}
    got = s.replay_whole_file([CountingProcessor()])
    assert got.of_kind("verdict") and s.position == s.t_start  # the replay on screen did not move


def test_a_seek_to_the_end_shows_the_last_sample_whose_time_rounds_up(tmp_path):
    """A file stores times to 1e-4 s. Its last sample at 18.38006 s is stored as 18.3801, past
    the exact time the chunk's header gave as its end, so a replay at the end never saw it: a
    torchrun job's ranks showed "running" at the end of its replay, though the file held their
    exits (a flaky test, about one run in three). The header now gives the stored times' span,
    and the end of a finished file includes all of it (older files too)."""
    import zlib
    import json
    from gputop.session.recording_format import CODEC_ZLIB, FRAME_CHUNK, frame_bytes

    path = tmp_path / "end.gtrec"
    w = RecordingWriter(str(path), {})
    w.write_samples([Sample(t / 10, "rank", "7", {"state": "running"}) for t in range(180)])
    w.write_samples([Sample(18.38006, "rank", "7", {"state": "exited"})])
    w.close({"clean": True})
    old = tmp_path / "old.gtrec"   # as a gputop of before wrote it: the header's t1 is exact
    w = RecordingWriter(str(old), {})
    w.write_samples([Sample(t / 10, "rank", "7", {"state": "running"}) for t in range(180)])
    payload = zlib.compress(json.dumps({"series": [["rank", "7", [18.3801], {"state": ["exited"]}]]}).encode())
    w._write(frame_bytes(FRAME_CHUNK, payload, CODEC_ZLIB, 18.38006, 18.38006))
    w.close({"clean": True})
    for p in (path, old):
        session = ReplaySession(str(p), processors=[CountingProcessor()], start_playing=False)
        try:
            session.seek(session.t_end)
            assert session.store.latest_of_kind("rank")["7"].data["state"] == "exited", p.name
            session.seek(9.0)   # and from far away, the other way of seeking
            session.seek(session.t_end)
            assert session.store.latest_of_kind("rank")["7"].data["state"] == "exited", p.name
        finally:
            session.stop()
