"""Whole-file replay: a recording played through processors at full speed, front to back.

``gputop report`` recomputes a file's verdicts this way, and the UI's verdict timeline covers a
whole replayed file this way (the replay on screen keeps only 300 s, and a seek back clears
it). The pass has its own reader, bus, store and processors, so it shares nothing with a replay
on screen and may run on any thread. It plays ``step_s`` at a time; between steps it reports
the fraction done and checks ``cancel``. The processors stop at every time they are due, as in
real-time playback, so the steps do not change what they produce.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from gputop.model import Sample
from gputop.session.replay import GAP_S, RECORDED_SUFFIX, ReplaySession
from gputop.session.recording import RecordingError
from gputop.session.session import Processor
from gputop.session.store import CallbackSubscriber


class Cancel(Protocol):
    """What ``cancel`` must offer: a ``threading.Event`` does."""

    def is_set(self) -> bool: ...


@dataclass
class WholeReplay:
    """What a whole-file pass gave: the samples of the kinds asked for, in the order published."""

    samples: list[Sample] = field(default_factory=list)
    t_start: float = 0.0
    t_end: float = 0.0
    covers_to: float | None = None   # how far it played (short of t_end when cancelled or failed)
    cancelled: bool = False
    error: str | None = None         # set only with ``errors="keep"``: why the pass stopped early
    notice: str | None = None        # what the reader skipped (damaged parts), in one line
    seconds: float = 0.0             # how long the pass took

    def of_kind(self, kind: str) -> list[Sample]:
        """Samples of ``kind`` as this pass's processors produced them."""
        return [s for s in self.samples if s.kind == kind]

    def recorded(self, kind: str) -> list[Sample]:
        """Samples of ``kind`` as the file holds them (what the recording session's own
        processors produced; a replay keeps them under ``<kind>@recorded``)."""
        return self.of_kind(recorded_kind(kind))


def recorded_kind(kind: str) -> str:
    """The name a replay gives a recorded sample of a kind its processors produce again."""
    return kind + RECORDED_SUFFIX


def replay_whole(path: str, processors: list[Processor], kinds: Iterable[str] | None = None, *,
                 progress: Callable[[float], None] | None = None, cancel: Cancel | None = None,
                 step_s: float = 1.0, errors: str = "raise") -> WholeReplay:
    """Play the recording at ``path`` from start to end through ``processors`` (fresh ones: they
    are run and left in their end state) and keep the published samples whose kind is in
    ``kinds`` (default: the kinds the processors produce).

    ``progress(fraction)`` is called after each step of ``step_s`` seconds of recording (from
    the calling thread); ``cancel.is_set()`` is checked before each step, and a set one ends the
    pass with ``cancelled=True`` and what was collected so far. ``errors="raise"`` lets a
    damaged file's error out (the report refuses such a file); ``errors="keep"`` returns what
    was collected with ``error`` saying what went wrong (the UI shows both)."""
    started = time.perf_counter()
    wanted = set(kinds) if kinds is not None else {k for p in processors for k in p.produces}
    out = WholeReplay()
    session = None
    try:
        session = ReplaySession(path, processors=processors, start_playing=False, seek_window_s=0.0)
        session.bus.subscribe(CallbackSubscriber(lambda ss: out.samples.extend(s for s in ss if s.kind in wanted)))
        t0, t1 = session.t_start, session.t_end
        out.t_start, out.t_end = t0, t1
        t = t0
        while t < t1:
            if cancel is not None and cancel.is_set():
                out.cancelled = True
                break
            nxt = min(t + step_s, t1)
            if nxt > session.last_sample_t + GAP_S:
                # A long silence: go straight to the next sample (by samples, not header seconds).
                resume = session.next_sample_after(t)
                nxt = t1 if resume is None else min(max(nxt, resume), t1)
            t = nxt
            session.play_to(t)
            if progress is not None:
                progress((t - t0) / max(t1 - t0, 1e-9))
        if not out.cancelled and session._error is None:
            # the end of the file: a processor that holds back what is not final yet (the time
            # budget waits for the samples after a window) settles the rest now
            for p in processors:
                at_end = getattr(p, "at_end", None)
                if at_end is not None:
                    session.bus.publish_many(at_end(session.store, t))
        out.covers_to = t
        out.notice = session.notice
        if session._error is not None:
            if errors != "keep":
                raise RecordingError(session._error.removeprefix("playback stopped: "))
            out.error = session._error
    except Exception as e:
        if errors != "keep":
            raise
        out.error = f"{type(e).__name__}: {e}"
    finally:
        if session is not None:
            session.stop()
        out.seconds = time.perf_counter() - started
    return out
