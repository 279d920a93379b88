"""The rule that reads torch.compile's own record of its compilations (the probe's
``compile_*`` and ``recompile_*`` fields, gputop/probe/compiles.py): ``recompilation``.

A compile is warm-up the first time a function is compiled. When a guard fails afterwards (a new
input shape, a Python value that changed, a module attribute that flipped) dynamo compiles the
function again, and the loop stops for it each time: seconds per recompile under inductor on a
GPU. So the cost is the share of the window's wall time spent compiling, and it is a verdict
only when recompiles (not first compiles) happen in training, after warm-up, in more than one
probe window (one shape change recompiles every frame of a model at once: one event), and the
share counted is the recompiles' own compile time. When a function
recompiled ``recompile_limit`` times (8 by default), dynamo gives up and runs it uncompiled from
then on: no compile time any more, but the compiled speed is gone; the verdict says so.

(This module imports nothing from rules.py, which imports it to register this rule.)
"""

from __future__ import annotations

from gputop.verdicts.finding import SEVERITY_WARNING, Finding, pct, rounded
from gputop.verdicts.registry import verdict
from gputop.verdicts.signals import RECOMPILE_HORIZON_S, Signals

RECOMPILE_SHARE = 0.05      # of wall time: compiling again after warm-up
RECOMPILE_WINDOWS = 2       # probe windows (~1 s) with a recompile: one shape change recompiles every
#                             frame of a model at once, and once (automatic dynamic shapes): an event
LIMIT_LEVEL = 1.0           # a function over its recompile limit: holds (a warning), whatever the time
LIMIT_LOSS = 0.0            # ... with no measurable loss (what compiling would have won is unknown)
# host_bound's CPU time and loop_blocked's waits are the recompiles' when these account for at least
# this share of them (dynamo's own clock of each compile is the more specific account: inductor
# compiles on the main thread's CPU and waits for its compile workers)
RECOMPILES_EXPLAIN = 0.5


@verdict(title="Recompiling: torch.compile compiles the same code again", severity=SEVERITY_WARNING, order=35,
         meaning="after warm-up, torch.compile recompiles >= {RECOMPILE_SHARE:.0%} of the time, "
                 "or gave up at its limit")
def recompilation(sig: Signals) -> Finding | None:
    share = sig.get("probe.recompile_share")
    if share is None:
        return None
    recompiles = sig.get("probe.recompiles") or 0.0
    repeated = (sig.get("probe.recompile_windows") or 0.0) >= RECOMPILE_WINDOWS
    limit_total = sig.facts.get("recompile_limit_total") or 0
    top = sig.facts.get("recompile_top") if isinstance(sig.facts.get("recompile_top"), dict) else {}
    if not top.get("function") and limit_total > 0:
        # the limit was hit before this window: its function, as the probe keeps it
        limit_top = sig.facts.get("recompile_limit_top")
        top = dict(limit_top) if isinstance(limit_top, dict) else {}
    level = share / RECOMPILE_SHARE if repeated else 0.0
    # (the cost over the rule's horizon: dynamo's clock, or the recompiling steps' excess over a
    # typical step: derive/steps.py, StepPool.recompile_cost_share)
    cost = sig.get("probe.recompile_cost")
    lost = max(share, cost if cost is not None else 0.0) if repeated else LIMIT_LOSS
    if limit_total > 0:
        level = max(level, LIMIT_LEVEL)
    fn, where, reason = top.get("function"), top.get("where"), top.get("reason")
    name = f"`{fn}`" + (f" ({where})" if where else "") if fn else "a compiled function"
    why = f' The guard that failed: "{reason}".' if reason else ""
    if limit_total > 0 and not repeated:
        summary = f"{name} hit torch.compile's recompile limit: it runs uncompiled from then on"
    else:
        n, w = int(recompiles), int(sig.get("probe.recompile_windows") or 0)
        summary = (f"{pct(share)}% of the time recompiling {name}: {n} recompile{'' if n == 1 else 's'} in the "
                   f"window, in {w} probe windows of the last {RECOMPILE_HORIZON_S:.0f} s")
    advice = ("Make the guard hold: pad or bucket variable shapes to a few sizes (or mark the dimension "
              "dynamic: torch._dynamo.mark_dynamic(x, dim), or torch.compile(dynamic=True)); pass changing "
              "Python numbers as tensors; keep module attributes and train/eval mode fixed inside the "
              "compiled region. TORCH_LOGS=recompiles prints every guard failure." + why)
    if limit_total > 0:
        advice += (" Raising torch._dynamo.config.recompile_limit only moves the cost: each recompile stops "
                   "the loop again.")
    return recompilation.spec.finding(
        level=level, lost_share=lost, confidence=0.9,
        evidence={"compile_pct": pct(share), "recompiles": int(recompiles),
                  "recompile_limit_hits": int(limit_total), "function": fn, "where": where,
                  "guard_failed": reason, "window_compile_share": rounded(share, 4)},
        advice=advice, summary=summary, missing=())
