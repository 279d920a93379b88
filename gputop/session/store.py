"""The bus and the store: where samples go once a source has made them.

The ``Bus`` hands every published sample to its subscribers (the store, the recorder, the
derivations). The ``SampleStore`` keeps a bounded, recent window of samples per (kind, key) for
whoever draws or derives; it is what the UI reads at its tick. It cannot tell live from replay.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Protocol

from gputop.model import Sample


class Subscriber(Protocol):
    def on_samples(self, samples: list[Sample]) -> None: ...

    def on_reset(self) -> None:
        """Time jumped (a replay seek): forget what came before."""
        ...


class Bus:
    """Fan-out of samples to subscribers. Publishing is thread-safe and never blocks on I/O:
    subscribers that do I/O (the recorder) queue the samples and work on their own thread."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            self._subscribers = [*self._subscribers, subscriber]

    def publish(self, sample: Sample) -> None:
        self.publish_many([sample])

    def publish_many(self, samples: list[Sample]) -> None:
        if not samples:
            return
        for sub in self._subscribers:  # a snapshot: subscribe() replaces the list
            sub.on_samples(samples)

    def reset(self) -> None:
        for sub in self._subscribers:
            sub.on_reset()


class SampleStore:
    """Recent samples per (kind, key), bounded by a time horizon so memory stays flat.

    ``horizon_s`` bounds every series to the newest ``horizon_s`` seconds of its own samples;
    ``max_keys`` per kind bounds churn (for example short-lived processes): the series that has
    been silent longest is dropped first.
    """

    def __init__(self, horizon_s: float = 300.0, max_keys_per_kind: int = 512) -> None:
        self.horizon_s = horizon_s
        self.max_keys_per_kind = max_keys_per_kind
        self._series: dict[str, dict[str, deque[Sample]]] = {}
        self._lock = threading.Lock()
        self._now = 0.0
        self._generation = 0  # bumps on every change; lets readers skip work when nothing moved

    # -- subscriber side ----------------------------------------------------------------
    def on_samples(self, samples: list[Sample]) -> None:
        with self._lock:
            for s in samples:
                by_key = self._series.get(s.kind)
                if by_key is None:
                    by_key = self._series[s.kind] = {}
                dq = by_key.get(s.key)
                if dq is None:
                    if len(by_key) >= self.max_keys_per_kind:
                        stalest = min(by_key, key=lambda k: by_key[k][-1].t if by_key[k] else -1)
                        del by_key[stalest]
                    dq = by_key[s.key] = deque()
                if dq and s.t < dq[-1].t:
                    # Out of order (two threads raced): keep the series sorted.
                    items = sorted([*dq, s], key=lambda x: x.t)
                    dq.clear()
                    dq.extend(items)
                else:
                    dq.append(s)
                limit = s.t - self.horizon_s
                while dq and dq[0].t < limit:
                    dq.popleft()
                if s.t > self._now:
                    self._now = s.t
            self._generation += 1

    def on_reset(self) -> None:
        with self._lock:
            self._series.clear()
            self._now = 0.0
            self._generation += 1

    # -- reader side ----------------------------------------------------------------------
    @property
    def now(self) -> float:
        """The newest sample time seen (session seconds)."""
        return self._now

    @property
    def generation(self) -> int:
        return self._generation

    def kinds(self) -> list[str]:
        with self._lock:
            return [k for k, v in self._series.items() if v]

    def keys(self, kind: str) -> list[str]:
        with self._lock:
            return [k for k, dq in self._series.get(kind, {}).items() if dq]

    def latest(self, kind: str, key: str) -> Sample | None:
        with self._lock:
            dq = self._series.get(kind, {}).get(key)
            return dq[-1] if dq else None

    def latest_of_kind(self, kind: str) -> dict[str, Sample]:
        with self._lock:
            return {k: dq[-1] for k, dq in self._series.get(kind, {}).items() if dq}

    @staticmethod
    def _tail(dq: deque, since: float) -> list[Sample]:
        # Walk back from the newest sample: a 10 s window of a 300 s series costs 10 s of work.
        got = []
        for s in reversed(dq):
            if s.t < since:
                break
            got.append(s)
        got.reverse()
        return got

    def series(self, kind: str, key: str, since: float | None = None) -> list[Sample]:
        with self._lock:
            dq = self._series.get(kind, {}).get(key)
            if not dq:
                return []
            if since is None:
                return list(dq)
            return self._tail(dq, since)

    def window(self, kind: str, since: float) -> dict[str, list[Sample]]:
        """All series of one kind from ``since`` on, by key."""
        with self._lock:
            out = {}
            for k, dq in self._series.get(kind, {}).items():
                got = self._tail(dq, since)
                if got:
                    out[k] = got
            return out

    def latest_value(self, kind: str, key: str, name: str, max_age_s: float = 1.0):
        """The newest non-None value of one field, if it is at most ``max_age_s`` older than the
        newest sample of that series. Fields that are measured less often than their series is
        sampled (GPM counters: every 0.5 s, on about 1 in 5 of the 10 Hz samples) need this."""
        with self._lock:
            dq = self._series.get(kind, {}).get(key)
            if not dq:
                return None
            newest = dq[-1].t
            for s in reversed(dq):
                if newest - s.t > max_age_s:
                    return None
                v = s.data.get(name)
                if v is not None:
                    return v
            return None

    def values(self, kind: str, key: str, name: str, since: float | None = None) -> list[tuple[float, object]]:
        """(t, value) pairs of one field, skipping samples where it is None."""
        return [(s.t, v) for s in self.series(kind, key, since) if (v := s.data.get(name)) is not None]


class CallbackSubscriber:
    """Adapts a plain function to the Subscriber protocol (handy for tests and tools)."""

    def __init__(self, fn: Callable[[list[Sample]], None], reset: Callable[[], None] | None = None):
        self._fn, self._reset = fn, reset

    def on_samples(self, samples: list[Sample]) -> None:
        self._fn(samples)

    def on_reset(self) -> None:
        if self._reset:
            self._reset()
