"""How long the py-spy window in flight is, and the windows that must hold one.

py-spy's samples arrive only when its window ends, so a processor that reads stacks over the last
N seconds sees none when N is shorter than a window (plus the fold and a derive tick). The stacks
source's health says the window in flight (``window_s``): 2 s in the warm-up, 5 s steady, 20 s
while calm (sources/calm.py: CALM_WINDOW_S), the agent's 20 s. The budget's window and the thread
states' horizon are widened from it (here) and, for the agent's fixed long windows, once at start
(agent/job.py: widen_windows).

Just before a window lands, these windows hold only what lies beyond the window in flight (the
slack, the budget's seconds of stacks); while calm py-spy samples at a quarter of the full rate,
so both are CALM_STRETCH times longer then: at worst half the full rate's samples (as many as
the calm 10 Hz of before gave), and the kernel sampler's calm 12.5 Hz pools ~375 ticks over the
30 s horizon (sources/calm.py).
"""

from __future__ import annotations

import math

from gputop.catalogue import KIND_STACKS, SOURCE_STACKS
from gputop.model import KIND_HEALTH
from gputop.sources.calm import CALM_WINDOW_S

BUDGET_STACKS_S = 10.0   # seconds of stacks the budget's window always holds
THREADS_SLACK_S = 5.0    # a thread state's horizon: one py-spy window, its fold and a derive tick
CALM_STRETCH = 2         # while calm: THREADS_SLACK_S and BUDGET_STACKS_S this many times longer,
                         # and the budget and the thread states computed this many times less often
NO_HEALTH_WINDOW_S = 2.0  # a recording without the stacks source's health: its first windows


def stacks_window_s(store) -> float:
    """The stacks source's window in flight (its health says; a window's own ``dur_s`` is the span
    it sampled, shorter when py-spy fell behind or the window was cut), 2 s for a recording without
    it. Its samples arrive when it ends, so the newest of them is up to that much older than the
    window's end, and the next window ends about that much later."""
    h = store.latest(KIND_HEALTH, SOURCE_STACKS)
    w = h.get("window_s") if h is not None else None
    if isinstance(w, bool) or not isinstance(w, (int, float)) or w != w:
        return NO_HEALTH_WINDOW_S
    return min(max(float(w), 1.0), 600.0)


def stacks_calm(store) -> bool:
    """The stack source samples at its calm rates now (its health's ``calm``)."""
    h = store.latest(KIND_HEALTH, SOURCE_STACKS)
    return h is not None and h.get("calm") is True


def threads_horizon_s(store, horizon_s: float) -> float:
    """The thread states' horizon: ``horizon_s`` or, with a longer window in flight, one window and
    THREADS_SLACK_S; while the stack source is calm, at least a calm window and twice the slack
    (30 s) whatever the window in flight, so that a children's window (every ~22 s while calm)
    stays inside and the calm rates pool enough samples (module docstring)."""
    if stacks_calm(store):
        slack = THREADS_SLACK_S * CALM_STRETCH
        return max(horizon_s, stacks_window_s(store) + slack, CALM_WINDOW_S + slack)
    return max(horizon_s, stacks_window_s(store) + THREADS_SLACK_S)


def threads_since(store, now: float, horizon_s: float) -> float:
    """Where the thread states' look starts: ``threads_horizon_s`` before ``now``, or, where
    py-spy's newest window ended before that (its next window is late, as on a loaded box), at that
    window's end, so that it is still held; a window in flight further at most. A newest window
    older than that (py-spy stopped) leaves the look as it was. The kernel sampler's ticks are
    read over the same look, so that a thread's shares come from one span of time."""
    since = now - threads_horizon_s(store, horizon_s)
    newest = max((s.t for s in store.latest_of_kind(KIND_STACKS).values()), default=None)
    if newest is None or newest >= since or newest < since - stacks_window_s(store):
        return since
    return newest


def budget_window_s(store, window_s: float) -> float:
    """The budget's window: ``window_s`` or one window in flight and BUDGET_STACKS_S of stacks
    (twice that while the stack source is calm: module docstring)."""
    stacks_s = BUDGET_STACKS_S * (CALM_STRETCH if stacks_calm(store) else 1)
    return max(window_s, stacks_window_s(store) + stacks_s)


def budget_since(store, pid: str | None, now: float, window_s: float) -> float:
    """Where the budget's window starts: ``budget_window_s`` before ``now``, or earlier where that
    look would hold less than BUDGET_STACKS_S (twice that while calm) before the end of py-spy's
    newest window of ``pid``, so that it holds them. On a loaded box the next window lands seconds
    late (py-spy's spawn, its fold, a late derive tick): beside two CPU hogs the agent's look (20 s
    in flight + 10 s) once held 1 s of stacks just before a window landed
    (tests/test_agent_stacks.py). While calm this is the usual case: the 20 s windows (+-10%) and
    the children's short one after each end a little later than the look assumes. It reaches back
    one more window in flight or those seconds of stacks, whichever is longer, at most; a newest
    window older than that (py-spy stopped) leaves the look as it was, not widened over no stacks."""
    since = now - budget_window_s(store, window_s)
    newest = store.latest(KIND_STACKS, pid) if pid is not None else None
    if newest is None:
        return since
    stacks_s = BUDGET_STACKS_S * (CALM_STRETCH if stacks_calm(store) else 1)
    floor = since - max(stacks_window_s(store), stacks_s)
    if newest.t < floor:
        return since
    return min(since, max(newest.t - stacks_s, floor))


def works_now(store, now: float, every_s: float, last_t: float | None) -> bool:
    """Whether a processor run every ``every_s`` (the budget, the thread states) does its work at
    ``now``: always, except while the stack source is calm, when it works every CALM_STRETCH-th
    time. The calm inputs change slowly (a py-spy window every 20 s, over windows of 30-40 s), and
    these two were half of the processors' cost, which the live session and the recorder's
    summary chain both pay (issue 14). Which runs work is a function of the time: those on a grid
    of CALM_STRETCH x ``every_s`` in session time, so that a replay's jump (whose processors start
    afresh on the same 1 s grid) works at the same times as playing through; ``last_t`` (the last
    run that worked) only adds a run where the live derive thread's ticks, which drift against
    that grid, skipped one (never more than CALM_STRETCH runs between two that work)."""
    if not stacks_calm(store):
        return True
    period = every_s * CALM_STRETCH
    if math.floor(now / period) != math.floor((now - every_s) / period):
        return True
    return last_t is not None and now - last_t >= period - every_s / 2
