"""Replay: a recording played back through the same bus and store as a live session.

The replay clock moves only when ``tick`` is called (the UI's timer, or a test), so a replay is
deterministic: the same calls give the same store. Processors (verdicts...) run again on the
raw samples, so better rules improve old recordings; what the recording itself holds of their
kinds is kept under ``<kind>@recorded``.

Replay moves by the samples' own times: a stretch of more than ``GAP_S`` without samples (a
paused source, a damaged part, a file whose times jump by years) is jumped over, so what a
replay costs follows what the file holds, never what its headers claim. A damaged part of the
file is a gap too, and ``notice`` says so in one line.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import OrderedDict

from gputop.model import Sample
from gputop.session.recording import CHUNK_SLACK_S, ChunkRef, RecordingError, RecordingReader, damage_line
from gputop.session.sanitize import clean_meta, clean_samples
from gputop.session.session import Processor, run_processor
from gputop.session.store import Bus, SampleStore

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
RECORDED_SUFFIX = "@recorded"
GAP_S = 60.0   # no sample for this long: processors have seen the silence; resume at the next sample
PLAY_THROUGH_S = 10.0   # a forward seek this short plays through (processors run at every due
                        # time); a longer one jumps like a seek back: each played second costs a
                        # run of every processor, and seeking anywhere must take under a second
SEEK_WARMUP_S = 30.0    # ...but a jump lands this far before its target and plays the rest: the
                        # verdicts need their enter times and pooled windows (10-20 s) of history,
                        # so what a seek shows is what playing through would have shown


class ReplaySession:
    def __init__(self, path: str, processors: list[Processor] | None = None, horizon_s: float = 300.0,
                 seek_window_s: float = 120.0, start_playing: bool = True,
                 clock=time.monotonic) -> None:
        self.reader = RecordingReader(path)
        self.meta = clean_meta(self.reader.meta)   # wrong types become n/a here, once (sanitize.py)
        self.processors = list(processors or [])
        self._derived_kinds = {k for p in self.processors for k in p.produces}
        self.bus = Bus()
        self.store = SampleStore(horizon_s=horizon_s)
        self.bus.subscribe(self.store)
        self.seek_window_s = seek_window_s
        self.playback = self  # the UI looks for .playback; this object is its own controls
        self._clock = clock
        self._last_tick: float | None = None
        self._cache: OrderedDict[int, list[Sample]] = OrderedDict()
        self._fed_to = float("-inf")
        self._last_sample_t = float("-inf")   # of the samples published so far
        self._error: str | None = None        # a per-file bound hit while playing: playback stops there
        self._due: dict[str, float] = {}
        self.speed = 1.0
        self.playing = start_playing
        self.recording_path = None  # a replay writes nothing
        self.replay_path = path     # what it plays
        self.recording_error = None
        self.position = self.t_start
        self._feed(self.t_start - 1.0, self.position)
        self._run_processors(force=True)

    # -- Playback surface ------------------------------------------------------------------
    @property
    def t_start(self) -> float:
        return self.reader.index.t_start

    @property
    def t_end(self) -> float:
        return self.reader.index.t_end

    @property
    def growing(self) -> bool:
        """True while the file may still be written (no clean end frame yet)."""
        return self.reader.index.end is None

    def now(self) -> float:
        return self.position

    @property
    def damaged(self) -> list:
        """The parts of the file the reader skipped (``Damage``), in file order."""
        return list(self.reader.index.damaged)

    @property
    def notice(self) -> str | None:
        """One line for the replay bar: why playback stopped early, or what was skipped."""
        return self._error or damage_line(self.reader.index)

    def toggle(self) -> None:
        self.playing = not self.playing
        self._last_tick = None

    def set_speed(self, speed: float) -> None:
        self.speed = min(max(speed, SPEEDS[0]), SPEEDS[-1])

    def faster(self) -> None:
        self.set_speed(next((s for s in SPEEDS if s > self.speed), SPEEDS[-1]))

    def slower(self) -> None:
        self.set_speed(next((s for s in reversed(SPEEDS) if s < self.speed), SPEEDS[0]))

    def seek(self, t: float) -> None:
        t = min(max(t, self.t_start), self.t_end)
        if t >= self.position and t - self.position <= min(self.seek_window_s, PLAY_THROUGH_S):
            self._advance_to(t)  # forward and close: just play through
            return
        land = self._landing(t)
        self.position = land
        self.bus.reset()
        for p in self.processors:
            p.reset()
        self._due.clear()
        self._fed_to = float("-inf")
        self._last_sample_t = float("-inf")
        # the history a seek gives is seek_window_s before the target, warm-up included: reading
        # and checking the chunks is half of what a far seek costs
        self._feed(min(land, t - self.seek_window_s), land)
        self._run_processors(force=True)
        if t > land:
            self._advance_to(t)

    def _landing(self, t: float) -> float:
        """Where a jump to ``t`` lands: ``SEEK_WARMUP_S`` or a little more before it, at a time
        every processor runs at when the file is played from its start (its grid from
        ``t_start``), so the windows it computes from there on are those playing through
        computes, not ones up to an interval away. (Known limits: after a silence longer than
        GAP_S, playing through restarts the processors' schedule at the resume, which this grid
        does not follow; and the stall detector, which reads 120 s of probe windows, gets the
        seek_window_s before the target, so ~90 s of them at the landing.)"""
        if not self.processors:
            return t
        land = t - SEEK_WARMUP_S
        if land <= self.t_start:
            return self.t_start
        step = max(p.interval_s for p in self.processors)
        if step > 0 and all(p.interval_s > 0 and math.isclose(step / p.interval_s, round(step / p.interval_s))
                            for p in self.processors):
            land = self.t_start + math.floor((land - self.t_start) / step) * step
        return land

    def seek_relative(self, dt: float) -> None:
        self.seek(self.position + dt)

    def step(self, dt: float = 1.0) -> None:
        self.playing = False
        self.seek_relative(dt)

    def play_to(self, t: float) -> None:
        """Play forward to ``t`` at once (no clock): every processor runs at each time it is
        due, exactly as in real-time playback. The report uses it to recompute derivations."""
        self._advance_to(min(max(t, self.position), self.t_end))

    # -- Session surface -------------------------------------------------------------------
    def tick(self) -> None:
        now = self._clock()
        last, self._last_tick = self._last_tick, now
        if self.growing and self._error is None:
            try:
                self.reader.refresh()
            except RecordingError as e:
                self._stop_on(e)
        if not self.playing or last is None:
            return
        target = self.position + (now - last) * self.speed
        if target > self._last_sample_t + GAP_S:
            nxt = self.next_sample_after(self.position)
            if nxt is not None and nxt > target:
                target = nxt  # jump a long silence instead of playing it
        if target >= self.t_end:
            target = self.t_end
            if not self.growing:
                self.playing = False  # stop at the end of a finished recording
        self._advance_to(target)

    def stop(self, end: dict | None = None) -> None:
        self.reader.close()

    def describe_sources(self) -> dict:
        return dict(self.meta.get("sources") or {})

    @property
    def derived_kinds(self) -> frozenset[str]:
        """The sample kinds this session's processors compute (recorded ones are ``@recorded``)."""
        return frozenset(self._derived_kinds)

    def replay_whole_file(self, processors: list[Processor], kinds=None, *, progress=None, cancel=None):
        """The whole file played through fresh ``processors`` at full speed, apart from this
        replay (session/whole_replay.py); a damaged file gives what was read and the error."""
        from gputop.session.whole_replay import replay_whole  # it builds a ReplaySession: import here

        return replay_whole(self.replay_path, processors, kinds, progress=progress, cancel=cancel, errors="keep")

    def next_sample_after(self, t: float) -> float | None:
        """The time of the first sample after ``t`` (None if there is none)."""
        r = self.reader
        r.chunks_between(t, t)  # keeps the reader's list of chunk start times current
        chunks, bad = r.index.chunks, r.index.bad_chunks
        best = None
        for ref in chunks[bisect.bisect_left(r._t0s, t - CHUNK_SLACK_S):]:
            # The index keeps every chunk's t0 within the slack of all earlier t1: nothing later
            # can hold an earlier sample.
            if best is not None and ref.t0 - CHUNK_SLACK_S > best:
                break
            if ref.t1 <= t or ref.offset in bad:
                continue
            later = [s.t for s in self._chunk(ref) if s.t > t]
            if later:
                best = min(later) if best is None else min(best, min(later))
        return best

    @property
    def last_sample_t(self) -> float:
        """The time of the latest sample published so far."""
        return self._last_sample_t

    # -- internals -------------------------------------------------------------------------
    def _stop_on(self, e: RecordingError) -> None:
        self._error = f"playback stopped: {e}"
        self.playing = False

    def _advance_to(self, t: float) -> None:
        """Move forward to ``t``, stopping at every time a processor is due, so derivations
        see the same sequence of windows at 16x as at 1x (hysteresis depends on it)."""
        if t < self.position:
            return
        while self.processors:
            nxt = min(self._due.get(p.name, self.position) for p in self.processors)
            if nxt > t:
                break
            nxt = max(nxt, self.position)
            self._feed(self._fed_to, nxt)
            self.position = nxt
            if nxt > self._last_sample_t + GAP_S:
                # A long silence: the processors have seen GAP_S of it; they resume at the next
                # sample, so a file whose times jump costs nothing for the jump.
                resume = self.next_sample_after(nxt)
                if resume is None:
                    resume = nxt + GAP_S if self.growing else math.inf
                for p in self.processors:
                    self._due[p.name] = max(self._due.get(p.name, nxt), resume)
                continue
            self._run_processors()
        self._feed(self._fed_to, t)
        self.position = t

    def _chunk(self, ref: ChunkRef) -> list[Sample]:
        got = self._cache.get(ref.offset)
        if got is None:
            try:
                got = clean_samples(self.reader.read_chunk(ref))
            except RecordingError as e:  # a per-file bound: say it, play nothing further
                self._stop_on(e)
                self.reader.index.bad_chunks.add(ref.offset)
                return []
            if self._derived_kinds:
                got = [Sample(s.t, s.kind + RECORDED_SUFFIX, s.key, s.data) if s.kind in self._derived_kinds else s
                       for s in got]
            self._cache[ref.offset] = got
            while len(self._cache) > 64:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(ref.offset)
        return got

    def _feed(self, t_from: float, t_to: float) -> None:
        """Publish samples with t_from < t <= t_to, in time order."""
        if t_to <= t_from:
            return
        batch: list[Sample] = []
        # The end of a finished file includes all of it: files written before chunk spans were
        # the rounded times' (recording_format.encode_chunk_series) hold samples up to 5e-5 s
        # past their last chunk's t1, the session's last (a rank's exit).
        upto = math.inf if t_to >= self.t_end and not self.growing else t_to
        for ref in self.reader.chunks_between(t_from, t_to):
            batch.extend(s for s in self._chunk(ref) if t_from < s.t <= upto)
        batch.sort(key=lambda s: s.t)
        if batch:
            self._last_sample_t = max(self._last_sample_t, batch[-1].t)
        self._fed_to = max(self._fed_to, t_to)
        self.bus.publish_many(batch)

    def _run_processors(self, force: bool = False) -> None:
        now = self.position
        for p in self.processors:
            if not force and now < self._due.get(p.name, float("-inf")):
                continue
            self._due[p.name] = now + p.interval_s
            self.bus.publish_many(run_processor(p, self.store, now))
