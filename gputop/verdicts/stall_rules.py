"""The ``stalled`` verdict: the training loop stopped making progress (gputop.derive.stall says
when; this rule only names it, with the snapshot's places as evidence once it is taken).

A stall costs all of the job's time, so it is critical and explains everything else: the idle
GPU, the waits in collectives. It clears when steps resume (the detector's sample stops saying
stalled; the engine's LEAVE_S later the verdict is off).
"""

from __future__ import annotations

from gputop.derive.stall import (IDLE_GPU_PCT, IDLE_MAIN_RUNNING, STALL_IDLE_S, STALL_MIN_S,  # noqa: F401
                                 STALL_STEP_FACTOR, describe_snapshot)
from gputop.verdicts.finding import SEVERITY_CRITICAL, Finding
from gputop.verdicts.registry import verdict
from gputop.verdicts.signals import Signals

# out-of-memory errors caught in the window from which a stall is a loop failing every batch (one or
# two are a batch that did not fit, skipped, then something else stopped the loop)
STALL_OOMS = 3


@verdict(title="Stalled: no progress", severity=SEVERITY_CRITICAL, order=1,
         meaning="no step for max({STALL_MIN_S:.0f} s, {STALL_STEP_FACTOR:.0f}x median step), or main thread "
                 "and GPU idle {STALL_IDLE_S:.0f} s")
def stalled(sig: Signals) -> Finding | None:
    st = sig.facts.get("stall")
    if not isinstance(st, dict):
        return None
    on = st.get("stalled") is True
    since, now = st.get("since"), sig.now
    for_s = now - since if on and isinstance(since, (int, float)) else None
    evidence = {"reason": st.get("reason"), "stalled_s": None if for_s is None else round(for_s, 1),
                "last_step_t": st.get("last_step_t"), "median_step_s": st.get("median_step_s"),
                "threshold_s": st.get("threshold_s")}
    places = []
    snap = sig.facts.get("stall_snapshot")
    if on and isinstance(snap, dict) and snap.get("since") == since:
        for r in describe_snapshot(snap)["ranks"]:
            head = f"rank {r['rank']}" if r["rank"] is not None else f"pid {r['pid']}"
            what = f"in {r['collective']}() at " if r["collective"] else "at "
            places.append(f"{head} {what}{r['where'] or '?'}")
        evidence["where"] = places[:8]
    if st.get("reason") == "idle":
        why = (f"the main thread and the GPU have been idle or waiting for {for_s or 0:.0f} s "
               f"(main thread on the CPU < {IDLE_MAIN_RUNNING:.0f}%, GPU < {IDLE_GPU_PCT:.0f}%)")
    else:
        why = f"no training step for {for_s or 0:.0f} s (threshold {st.get('threshold_s') or STALL_MIN_S:.0f} s)"
    advice = ("the Stall view (key s) has every thread's stack of every rank at the moment it stopped: "
              "a rank in a collective waits for one that is elsewhere; a lock, a sleep or a queue wait names "
              "the line that blocks")
    ooms = sig.get("probe.ooms_in_window")
    summary = why + (": " + "; ".join(places[:3]) if places else "")
    if on and ooms is not None and ooms >= STALL_OOMS:
        # a loop that catches torch.OutOfMemoryError and goes on to the next batch, every batch
        # failing: the GPU stays busy and no step ends (H100, alloc_thrash_varlen with
        # ALLOC_ON_OOM=skip: 301 OOMs in 49 s without a step)
        evidence["ooms_in_window"] = int(ooms)
        summary += f"; {int(ooms)} CUDA out-of-memory errors raised and caught in the last {sig.window_s:.0f} s"
        advice = ("the job raises CUDA out-of-memory errors and goes on to the next batch, which fails too: "
                  "lower the batch size or sequence length, free what is held beside the model, or set "
                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation); " + advice)
    return stalled.spec.finding(
        level=1.0 if on else 0.0, lost_share=1.0 if on else 0.0, confidence=0.9, evidence=evidence,
        advice=advice, summary=summary)


def stalled_now(store, now: float) -> bool:
    """The detector says stalled now (the engine then judges an evaluation too)."""
    from gputop.catalogue import KIND_STALL
    from gputop.verdicts.signals import BUDGET_STALE_S

    st = store.latest(KIND_STALL, "job")
    return st is not None and st.t >= now - BUDGET_STALE_S and st.get("stalled") is True
