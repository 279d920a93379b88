"""The sample: the one data type every layer of gputop passes around.

Every signal, live or replayed, is a stream of small samples. A sample says *when* (``t``,
seconds since the session started, on the monotonic clock), *what sort of thing* (``kind``:
"gpu", "proc", "thread", ...), *which one* (``key``: "0" for GPU 0, "1234" for a PID) and the
values measured (``data``). Sources build a fresh ``data`` dict for every sample and nobody
mutates it afterwards, so samples can be shared between threads without copies.

Values are JSON scalars (None, bool, int, float, str) or small lists/dicts of them: a sample
must survive a round trip through a recording unchanged. ``None`` always means "no value" and
never stands in for zero; where a value is missing for a known reason, the source says the
reason in a ``*_info`` sample (see ``SourceHealth`` and docs/metrics.md).

This module does no I/O and imports nothing from the rest of gputop but the catalogue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

# Sample kinds and MetricSpec live in gputop/catalogue.py (one home); re-exported here because
# every layer already imports them from the model.
from gputop.catalogue import (  # noqa: F401
    KIND_EVENT, KIND_GPU, KIND_GPU_INFO, KIND_GPU_PROCS, KIND_HEALTH, KIND_PROC, KIND_PROC_INFO, KIND_SYSTEM,
    KIND_TARGET, KIND_THREAD, MetricSpec,
)

Value = Any  # None | bool | int | float | str | list | dict, JSON-compatible


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    kind: str
    key: str
    data: Mapping[str, Value]

    def get(self, name: str, default: Value = None) -> Value:
        return self.data.get(name, default)


Emit = Callable[[Sample], None]


# Health of a source, published as a KIND_HEALTH sample so it is recorded and replayed too.
HEALTH_OK = "ok"              # producing samples at its rate
HEALTH_DEGRADED = "degraded"  # producing, but some values are missing or it fell behind
HEALTH_FAILED = "failed"      # not producing; ``message`` says why and what to do
HEALTH_OFF = "off"            # not started (not wanted, or not applicable)
HEALTH_STATES = (HEALTH_OK, HEALTH_DEGRADED, HEALTH_FAILED, HEALTH_OFF)


def health_data(state: str, message: str = "", rate_hz: float | None = None, **extra: Value) -> dict:
    """The data dict of a KIND_HEALTH sample."""
    if state not in HEALTH_STATES:
        raise ValueError(f"unknown health state {state!r}")
    data: dict = {"state": state, "message": message, "rate_hz": rate_hz}
    data.update(extra)
    return data


class Source(Protocol):
    """A producer of samples. Live sources run their own threads; a replay is a Source too.

    ``start`` must return quickly (blocking set-up happens on the source's own thread) and must
    never raise for a problem of the machine (no driver, no permission): the source publishes a
    KIND_HEALTH sample that says what went wrong instead, and the rest of gputop keeps working.
    """

    name: str

    def start(self, emit: Emit) -> None: ...

    def stop(self) -> None: ...

    def describe(self) -> dict:
        """Static facts for the recording's metadata (GPU names, driver, nominal rates...)."""
        ...


def clean_float(x: Value, ndigits: int = 3) -> float | None:
    """A float fit for a sample: rounded, and None for NaN/inf (JSON has no NaN)."""
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    if math.isnan(f) or math.isinf(f):
        return None
    return round(f, ndigits)


@dataclass(slots=True)
class RateTracker:
    """Turns cumulative counters into per-second rates between consecutive readings.

    Returns None for the first reading and when a counter goes backwards (wrapped or reset),
    because a made-up zero would be a lie.
    """

    last: dict = field(default_factory=dict)

    def rate(self, name: str, value: float | None, t: float) -> float | None:
        if value is None:
            self.last.pop(name, None)
            return None
        prev = self.last.get(name)
        self.last[name] = (value, t)
        if prev is None:
            return None
        v0, t0 = prev
        dt = t - t0
        if dt <= 0 or value < v0:
            return None
        return (value - v0) / dt
