"""Intermittent stalls: stretches when the GPU sat idle, found in the moments' timeline, with
their cause, their duration and how often they come back.

A window mean hides a loop that runs flat out for 1.5 s and then stops for 1.5 s; its timeline
does not. A *stall* is a run of moments in which the GPU was at most ``STALL_BUSY`` busy,
allowing gaps up to ``MAX_GAP_S`` (py-spy restarts between its windows), lasting at least
``MIN_STALL_S``. Stalls that recur at a steady interval are *periodic*: "stops 1.5 s every
3.0 s in torch.save (serialization.py:...)".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import median

from gputop.derive.budget import Moment, parts_of

STALL_BUSY = 0.25       # GPU busy fraction at or below which a moment counts as stalled
MAX_GAP_S = 0.35        # moments further apart than this have a stretch without samples between them
BRIDGE_S = 1.0          # ... which one stall spans when it is stalled on both sides
MIN_STALL_S = 0.25      # shorter idle stretches are the ordinary gaps between steps
MIN_REPEATS = 3         # stalls needed before a period is named
REGULAR_SPREAD = 0.25   # periodic: most intervals within 25% of their median
CONTINUOUS_SHARE = 0.8  # stalls filling this much of the sampled time are one state, not stalls


@dataclass(frozen=True)
class Stall:
    t0: float
    t1: float
    cause: str
    frame: str | None
    clipped: bool = False   # it touches a stretch without samples: its true length is unknown
    sampled_s: float | None = None   # the time its moments stand for (its length less the bridged gaps)

    @property
    def duration_s(self) -> float:
        return self.t1 - self.t0


def _cause(run: list[Moment]) -> tuple[str, str | None]:
    causes: Counter = Counter()
    frames: Counter = Counter()
    for m in run:
        for c, share in parts_of(m).items():
            causes[c] += share
        if m.naming.frame:
            frames[m.naming.frame] += 1
    return (causes.most_common(1)[0][0] if causes else "unknown"), (frames.most_common(1)[0][0] if frames else None)


def find_stalls(moments: list[Moment]) -> list[Stall]:
    """The stalls in time order. py-spy restarts between its windows, leaving stretches of up
    to ``BRIDGE_S`` without samples: a stall on both sides of one is one stall; a stall that
    begins or ends at such a stretch (or at the edge of the moments) is ``clipped``."""
    out: list[Stall] = []
    run: list[Moment] = []
    clipped_start = False
    timed = [m for m in moments if m.busy is not None]
    for i, m in enumerate(timed):
        gap_before = i == 0 or m.t - timed[i - 1].t > MAX_GAP_S
        if m.busy <= STALL_BUSY:
            if run and m.t - run[-1].t > BRIDGE_S:
                _close(out, run, clipped_start, True)
                run = []
            if not run:
                clipped_start = gap_before
            run.append(m)
        elif run:
            _close(out, run, clipped_start, gap_before)
            run = []
    if run:
        _close(out, run, clipped_start, True)
    return out


def _close(out: list[Stall], run: list[Moment], clipped_start: bool, clipped_end: bool) -> None:
    t0, t1 = run[0].t - run[0].dt / 2, run[-1].t + run[-1].dt / 2
    if t1 - t0 >= MIN_STALL_S:
        cause, frame = _cause(run)
        out.append(Stall(t0, t1, cause, frame, clipped_start or clipped_end, sum(m.dt for m in run)))


def describe(stalls: list[Stall], span_s: float, sampled_s: float | None = None) -> dict | None:
    """The stalls of a window in a few numbers: how many, their median length, the median
    interval between their starts (when regular: ``periodic``), the share of time they took,
    and the commonest cause and frame. ``sampled_s``: the time the moments stand for (the
    window less the stretches between py-spy's windows)."""
    if not stalls:
        return None
    whole = [s.duration_s for s in stalls if not s.clipped]
    durations = whole if len(whole) >= 2 else [s.duration_s for s in stalls]
    share = min(1.0, sum(durations) / span_s) if span_s > 0 else None
    # Idle nearly all the time it was seen: not intermittent, and no period or length to name.
    # Judged on the sampled time, not the window: py-spy starts each window anew, and on a heavy
    # process (Lightning on the H200) it sees nothing for 1.3-1.8 s of each 5 s one, longer than
    # BRIDGE_S, so a GPU idle all along read as one stall per window, "stops 3.5 s every 4.6 s"
    # (the windows' own period), with only ~75% of the window in stalls.
    # (both sides in sampled time: a stall's length also spans the gaps it bridges)
    stalled_s = sum(s.duration_s if s.sampled_s is None else s.sampled_s for s in stalls)
    seen = min(1.0, stalled_s / sampled_s) if sampled_s else share
    out = {"count": len(stalls), "duration_s": round(median(durations), 2),
           "share": round(share, 3) if share is not None else None,
           "period_s": None, "periodic": False,
           "continuous": seen is not None and seen >= CONTINUOUS_SHARE}
    causes = Counter(s.cause for s in stalls)
    out["cause"] = causes.most_common(1)[0][0]
    frames = Counter(s.frame for s in stalls if s.frame and s.cause == out["cause"])
    out["frame"] = frames.most_common(1)[0][0] if frames else None
    if len(stalls) >= MIN_REPEATS:
        # the interval between the middles of consecutive stalls: a clipped start or end moves
        # a middle by half the missing part, a start by all of it
        mids = [(s.t0 + s.t1) / 2 for s in stalls]
        gaps = [b - a for a, b in zip(mids, mids[1:])]
        med = median(gaps)
        out["period_s"] = round(med, 2)
        near = sum(1 for g in gaps if abs(g - med) <= REGULAR_SPREAD * med)
        out["periodic"] = med > 0 and near >= 0.6 * len(gaps)
    return out
