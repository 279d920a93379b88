"""Sessions: the one thing the UI and the headless runner talk to.

A session owns a bus and a store, runs its sources, and runs *processors* (derivations such as
thread states and verdicts) whose output samples go back onto the bus, so they are recorded like
anything else. ``LiveSession`` runs sources on their own threads and processors on a derive
thread; ``ReplaySession`` (replay.py) feeds recorded samples by a movable clock and runs the
same processors synchronously. The UI only sees the ``Session`` surface below.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from typing import Protocol

import gputop
from gputop.model import KIND_HEALTH, Sample, Source, health_data
from gputop.sources.base import Heartbeat, name_os_thread, name_os_threads
from gputop.session.recording import FORMAT_MAJOR, FORMAT_MINOR, Recorder
from gputop.session.store import Bus, SampleStore


DERIVE_FIRST_WAIT_S = 0.1   # the derive thread's first look, as the sources start
DERIVE_MIN_WAIT_S = 0.01    # never a busy loop, whatever a processor's interval
DERIVE_MAX_WAIT_S = 1.0
RECORDER_HEALTH_S = 1.0     # how often the recorder's drops are looked at


class Processor(Protocol):
    """A derivation over the store, run periodically. Pure apart from its own carried state
    (hysteresis, previous values); ``reset`` drops that state when a replay seeks."""

    name: str
    produces: tuple[str, ...]   # the sample kinds it emits (replay renames recorded ones)
    interval_s: float

    def process(self, store: SampleStore, now: float) -> list[Sample]: ...

    def reset(self) -> None: ...


class Playback(Protocol):
    """Controls only a replay has. The UI shows a position bar when a session has them."""

    position: float
    t_start: float
    t_end: float
    speed: float
    playing: bool
    growing: bool

    def toggle(self) -> None: ...
    def seek(self, t: float) -> None: ...
    def seek_relative(self, dt: float) -> None: ...
    def step(self, dt: float = 1.0) -> None: ...
    def set_speed(self, speed: float) -> None: ...


def run_processor(p: Processor, store: SampleStore, now: float) -> list[Sample]:
    """One processor run; a bug in a derivation becomes a failed health sample, never a crash of
    the session (live, replay or report)."""
    try:
        return p.process(store, now)
    except Exception as e:
        return [Sample(now, KIND_HEALTH, p.name, health_data("failed", f"{type(e).__name__}: {e}"))]


class SessionClock:
    """Session time: seconds on the monotonic clock since the session started."""

    def __init__(self) -> None:
        self.start_monotonic = time.monotonic()
        self.start_wall = time.time()

    def now(self) -> float:
        return time.monotonic() - self.start_monotonic


def base_meta(clock: SessionClock, argv: list[str] | None = None) -> dict:
    """What every recording says about itself, before the sources add their facts."""
    return {
        "gputop_version": gputop.__version__,
        "format": f"{FORMAT_MAJOR}.{FORMAT_MINOR}",
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "start_wall": clock.start_wall,
        "argv": list(argv or []),
        "gputop_pid": os.getpid(),
    }


class LiveSession:
    """Sources on their own threads -> bus -> store (+ recorder); processors on a derive thread."""

    playback: Playback | None = None

    def __init__(self, sources: list[Source], clock: SessionClock, meta: dict,
                 recorder: Recorder | None = None, processors: list[Processor] | None = None,
                 horizon_s: float = 300.0) -> None:
        self.sources = list(sources)
        self.clock = clock
        self.meta = dict(meta)
        self.recorder = recorder
        self.processors = list(processors or [])
        self.bus = Bus()
        self.store = SampleStore(horizon_s=horizon_s)
        self.bus.subscribe(self.store)
        if recorder is not None:
            self.bus.subscribe(recorder)
        for src in self.sources:   # a source that reacts to samples (the stall snapshot) listens
            if callable(getattr(src, "on_samples", None)):
                self.bus.subscribe(src)
        self._stop = threading.Event()
        self._derive_thread: threading.Thread | None = None
        self.started = False

    # -- Session surface --------------------------------------------------------------------
    replay_path: str | None = None  # a live session plays no file

    @property
    def derived_kinds(self) -> frozenset[str]:
        """The sample kinds this session's processors compute."""
        return frozenset(k for p in self.processors for k in p.produces)

    @property
    def recording_path(self) -> str | None:
        return self.recorder.path if self.recorder else None

    @property
    def recording_error(self) -> str | None:
        return self.recorder.error if self.recorder else None

    def now(self) -> float:
        return self.clock.now()

    def tick(self) -> None:
        """Called by the UI at its refresh rate; a live session has nothing to advance."""

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self.recorder is not None:
            self.recorder.start()
        for src in self.sources:
            try:
                src.start(self.bus.publish)
            except Exception as e:  # a source must not take the session down with it
                self.bus.publish(Sample(self.clock.now(), KIND_HEALTH, src.name,
                                        health_data("failed", f"could not start: {e}")))
        if self.processors or self.recorder is not None:
            self._derive_thread = threading.Thread(target=self._derive_loop, name="gputop-derive", daemon=True)
            self._derive_thread.start()
        self.started = True

    def describe_sources(self) -> dict:
        out = {}
        for src in self.sources:
            try:
                out[src.name] = src.describe()
            except Exception as e:
                out[src.name] = {"error": str(e)}
        return out

    def update_meta(self, extra: dict) -> None:
        self.meta.update(extra)
        if self.recorder is not None:
            self.recorder.update_meta(extra)

    def _derive_loop(self) -> None:
        name_os_thread("gputop-derive")
        named: set[int] = set()
        name_next = 0.0
        due = {p.name: 0.0 for p in self.processors}
        recorder_health = Heartbeat()
        recorder_next = 0.0
        wait = DERIVE_FIRST_WAIT_S
        # It wakes when a processor is due or the recorder's health is to be looked at, not at a
        # fixed 10 Hz: most wake-ups of a polling loop find nothing to do, and cost CPU anyway.
        while not self._stop.wait(wait):
            now = self.clock.now()
            if now >= name_next:  # threads that started since (NVML's slow loop, a probe's)
                name_next = now + 5.0
                name_os_threads(named)
            if self.recorder is not None and now >= recorder_next:
                recorder_next = now + RECORDER_HEALTH_S
                # the recorder never blocks a source; when the disk falls behind it drops samples
                # and says so here, live (the UI's Sources view, Prometheus) as well as in the file
                h = self.recorder.health()
                said = (h.get("state"), h.get("dropped_samples"))
                if recorder_health.due(said, now):
                    recorder_health.mark(said, now)
                    self.bus.publish(Sample(now, KIND_HEALTH, "recorder", h))
            for p in self.processors:
                if now < due[p.name]:
                    continue
                due[p.name] = now + p.interval_s
                self.bus.publish_many(run_processor(p, self.store, now))
            soonest = min([*due.values(), name_next] + ([recorder_next] if self.recorder is not None else []))
            wait = min(DERIVE_MAX_WAIT_S, max(DERIVE_MIN_WAIT_S, soonest - self.clock.now()))

    def stop(self, end: dict | None = None) -> None:
        self._stop.set()
        for src in self.sources:
            try:
                src.stop()
            except Exception:
                pass
        if self._derive_thread is not None:
            self._derive_thread.join(timeout=5)
        if self.recorder is not None:
            self.update_meta({"sources": self.describe_sources()})
            self.recorder.stop({"end_t": self.clock.now(), "clean": True, **(end or {})})
