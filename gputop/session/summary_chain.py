"""The whole-file replay, run incrementally while the file is written.

``gputop report`` recomputes a recording's derivations by playing the whole file through fresh
processors (session/whole_replay.py): 30 s and more for an hour. The recorder runs the same
pass as it writes, chunk by chunk, so the summary frames can carry its result and the report
merges them instead. To give the *same* samples as the replay of the finished file, it moves
exactly as ``ReplaySession._advance_to`` does, and only as far as the file is final: a later
chunk may still hold samples up to ``CHUNK_SLACK_S`` older than the newest one (late
publishers; the reader refuses chunks further out of order, and so does this), so processors
run only up to the newest chunk's end minus that slack, and at ``finish`` to the end.
"""

from __future__ import annotations

import math
from typing import Callable

from gputop.model import Sample
from gputop.session.recording_format import CHUNK_SLACK_S, MAX_CHUNK_SPAN_S, Series, samples_of
from gputop.session.replay import GAP_S, RECORDED_SUFFIX
from gputop.session.sanitize import clean_samples
from gputop.session.session import Processor, run_processor
from gputop.session.store import Bus, CallbackSubscriber, SampleStore


class IncrementalReplay:
    """Processors played over chunks as they are written; ``on_output`` gets what they publish
    (except the first, forced run's, which the whole-file replay does not collect either)."""

    def __init__(self, processors: list[Processor], on_output: Callable[[list[Sample]], None],
                 horizon_s: float = 300.0):
        self.processors = processors
        self._derived = {k for p in processors for k in p.produces}
        self.bus = Bus()
        self.store = SampleStore(horizon_s=horizon_s)   # as ReplaySession's
        self.bus.subscribe(self.store)
        self._on_output = on_output
        self._collect = False
        self.bus.subscribe(CallbackSubscriber(lambda ss: self._collect and on_output(ss)))
        self._pending: list[Sample] = []     # accepted, not yet published (time order per chunk)
        self._max_t1 = -math.inf
        self.t_start = math.inf
        self.t_end = -math.inf
        self.position: float | None = None
        self._due: dict[str, float] = {}
        self._fed_to = -math.inf
        self._last_sample_t = -math.inf

    def add_chunk(self, series: list[Series], t0: float, t1: float, clean: bool = False) -> None:
        """One chunk as written: its decoded series and its header times. ``clean``: the series
        are already checked as the replay checks them (sanitize.clean_chunk's second list)."""
        if not (math.isfinite(t0) and math.isfinite(t1) and t0 <= t1) or t1 - t0 > MAX_CHUNK_SPAN_S \
                or t0 < self._max_t1 - CHUNK_SLACK_S:
            return  # the reader refuses this chunk: so does the replay of the file
        if clean:
            derived = self._derived
            if derived:
                series = [(s[0] + RECORDED_SUFFIX, *s[1:]) if s[0] in derived else s for s in series]
            got = samples_of(series)
        else:
            got = clean_samples(samples_of(series))
            if self._derived:
                got = [Sample(s.t, s.kind + RECORDED_SUFFIX, s.key, s.data) if s.kind in self._derived else s
                       for s in got]
        self._pending.extend(got)
        self._max_t1 = max(self._max_t1, t1)
        self.t_start = min(self.t_start, t0)
        self.t_end = max(self.t_end, t1)
        self.advance()

    def advance(self, final: bool = False) -> None:
        safe = math.inf if final else self._max_t1 - CHUNK_SLACK_S
        if self.position is None:
            if not self.t_start <= safe:
                return
            self.position = self.t_start
            self._feed(self.t_start - 1.0, self.t_start)
            self._run(force=True)
            self._collect = True
        target = self.t_end if final else safe
        if target < self.position:
            return
        while self.processors:
            nxt = min(self._due.get(p.name, self.position) for p in self.processors)
            if nxt > target:
                break
            nxt = max(nxt, self.position)
            self._feed(self._fed_to, nxt)
            self.position = nxt
            if nxt > self._last_sample_t + GAP_S:
                resume = min((s.t for s in self._pending if s.t > nxt), default=None)
                if not final and (resume is None or resume > safe):
                    return  # the next sample is not final yet: go on when it is
                if resume is None:
                    resume = math.inf
                for p in self.processors:
                    self._due[p.name] = max(self._due.get(p.name, nxt), resume)
                continue
            self._run()
        self._feed(self._fed_to, target)
        self.position = target

    def finish(self) -> None:
        """The end of the file: play to its end, and let processors settle (``at_end``)."""
        if self.position is None and not math.isfinite(self.t_start):
            return
        self.advance(final=True)
        for p in self.processors:
            at_end = getattr(p, "at_end", None)
            if at_end is not None:
                self.bus.publish_many(at_end(self.store, self.position))

    def _feed(self, t_from: float, t_to: float) -> None:
        if t_to <= t_from:
            return
        batch = [s for s in self._pending if t_from < s.t <= t_to]
        if batch:
            self._pending = [s for s in self._pending if not (t_from < s.t <= t_to)]
            batch.sort(key=lambda s: s.t)
            self._last_sample_t = max(self._last_sample_t, batch[-1].t)
        self._fed_to = max(self._fed_to, t_to)
        self.bus.publish_many(batch)

    def _run(self, force: bool = False) -> None:
        now = self.position
        for p in self.processors:
            if not force and now < self._due.get(p.name, -math.inf):
                continue
            self._due[p.name] = now + p.interval_s
            self.bus.publish_many(run_processor(p, self.store, now))
