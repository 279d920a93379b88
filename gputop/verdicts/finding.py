"""What a verdict rule says: a finding, with its evidence and advice."""

from __future__ import annotations

from dataclasses import dataclass, field

def pct(x, nd: int = 0):
    """A 0-1 share as a percentage for evidence (None stays None: no value, not zero)."""
    return None if x is None else round(100.0 * x, nd)


def rounded(x, nd: int = 1):
    """A number for evidence, rounded (None stays None)."""
    return None if x is None else round(x, nd)


SEVERITY_INFO = "info"
SEVERITY_WARNING = "warning"
SEVERITY_CRITICAL = "critical"
SEVERITIES = (SEVERITY_INFO, SEVERITY_WARNING, SEVERITY_CRITICAL)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One rule's judgement of the current window.

    ``level`` is the rule's main measure divided by its threshold: >= 1 means "holds". The
    engine's hysteresis turns a verdict on after it holds for a while and off only when the
    level falls clearly below 1, so verdicts do not flap around their threshold.
    ``lost_share`` estimates the share of step time (0-1) this cause costs; it ranks
    verdicts for the primary one. ``confidence`` (0-1) drops when the rule had to work
    without some of its sources, and ``missing`` says which.
    """

    id: str
    title: str
    severity: str
    level: float
    lost_share: float
    confidence: float
    evidence: dict          # name -> number/str, the numbers that triggered it
    advice: str
    summary: str            # one line: the finding with its key number(s)
    missing: tuple[str, ...] = field(default=())
    # the speed-up removing the cause would give (0.25: +25% steps/s; verdicts/causal.py), set by
    # the engine for a cause-naming verdict; None for one that describes the GPU's state
    gain: float | None = None


@dataclass
class VerdictState:
    """The engine's memory of one verdict id between evaluations (hysteresis)."""

    active: bool = False
    since: float | None = None          # session time it turned on
    holding_since: float | None = None  # the level has been >= 1 since then (not yet active)
    failing_since: float | None = None  # the level has been below the leave ratio since then
    first_seen: float | None = None
    last: Finding | None = None
