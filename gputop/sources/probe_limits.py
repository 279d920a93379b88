"""Bounds on what one probe connection may cost gputop (gputop/sources/probe_client.py uses them).

Whoever runs the watched job can put anything on its probe socket, and gputop may run as root
(issue 13): so bytes read per second, messages and samples per second and time order are bounded
per connection, and what was refused is counted for the ``probe`` health. docs/probe.md
("Limits") gives the numbers for users.
"""

from __future__ import annotations

# Bounds on what one probe connection may cost (a real probe sends ~3 messages and ~3 KiB a second).
MAX_MESSAGE_BYTES = 256 << 10   # one line; a real one is a few KiB (hello's argv is the longest)
READ_BYTES_PER_S = 256 << 10    # sustained; beyond it the socket is not read for a while
READ_BURST_BYTES = 1 << 20
MESSAGES_PER_S = 20.0           # parsed messages handled; the excess is dropped
MESSAGE_BURST = 60.0
SAMPLES_PER_S = 8.0             # samples (and events) made from a probe's messages
SAMPLE_BURST = 24.0
MAX_LAG_S = 60.0                # a probe time older than this (session clock) is clamped to it
DROPS_RECENT_S = 30.0           # health is degraded this long after a probe's messages were dropped


class Bucket:
    """A token bucket: ``rate`` per second, at most ``burst`` saved up."""

    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def refill(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return self.tokens

    def take(self, n: float, now: float) -> bool:
        if self.refill(now) < n:
            return False
        self.tokens -= n
        return True


class Drops:
    """What gputop refused from one probe (kept after it detaches, for health)."""

    __slots__ = ("rate", "order", "clamped", "paused", "at")

    def __init__(self) -> None:
        self.rate = self.order = self.clamped = self.paused = 0
        self.at = -1e9   # monotonic time of the last one

    def total(self) -> int:
        return self.rate + self.order

    def describe(self) -> str:
        parts = []
        if self.rate:
            parts.append(f"dropped {self.rate} message(s) over {MESSAGES_PER_S:g} messages or "
                         f"{SAMPLES_PER_S:g} samples a second")
        if self.order:
            parts.append(f"dropped {self.order} message(s) stamped earlier than the one before")
        if self.clamped:
            parts.append(f"clamped {self.clamped} time stamp(s) in the future or over {MAX_LAG_S:g} s old")
        if self.paused:
            parts.append(f"stopped reading {self.paused} time(s) (over {READ_BYTES_PER_S >> 10} KiB/s)")
        return ", ".join(parts)
