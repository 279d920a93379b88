"""The rules that read the time budget (gputop.derive.budget): the causes of lost GPU time
that the catalogue of textbook bottlenecks has no name for, found on real training code.

- ``host_bound``: the GPU waits while the main thread computes on the CPU in named code (CPU
  tensor ops, metrics, a framework's per-step Python);
- ``io_stall``: the loop blocks in file I/O (torch.save, safetensors, numpy, logging), also
  when it does so only every N seconds;
- ``loop_blocked``: the loop sleeps or waits off the CPU (a lock, a socket, a synchronous
  upload) while the GPU has nothing to do.

Each one's lost share *is* its budget share: the primary verdict is the largest lost share.
When the budget's stalls come back at a steady interval, the evidence names period and length.

(This module imports nothing from rules.py, which imports it to register these rules.)
"""

from __future__ import annotations

from gputop.derive.budget import BLOCKED, CPU, FRAMEWORKS, IO, MODEL
from gputop.verdicts.finding import SEVERITY_WARNING, Finding, pct, rounded
from gputop.verdicts.registry import verdict
from gputop.verdicts.signals import Signals

HOST_BOUND_SHARE = 0.20     # of wall time: the GPU idle while the main thread runs CPU code
IO_STALL_SHARE = 0.05       # of wall time: the GPU idle while the main thread does file I/O
LOOP_BLOCKED_SHARE = 0.15   # of wall time: the GPU idle while the main thread sleeps or waits
FRAMEWORK_CPU_SHARE = 0.40  # of the CPU time: then it is the framework's per-step code
MODEL_CPU_SHARE = 0.40      # of the CPU time: then it is the model launching its kernels
FRAMEWORK_SECOND_SHARE = 0.25  # ... and a framework's share beside it that is worth naming too
HOST_BOUND_MIN_SM = 0.05    # % SM active that says kernels ran, where util.gpu is missing


_pct, _r = pct, rounded
def _win(budget: dict) -> str:
    w = budget.get("window_s")
    return f"{w:.0f} s" if isinstance(w, (int, float)) else "window"


def _frames(budget: dict, cat: str, n: int = 3) -> list:
    return ((budget.get("frames") or {}).get(cat) or [])[:n]


def _top_frame(budget: dict, cat: str) -> str | None:
    """The frame that names the cause: the job's own code first, else whoever's it is."""
    frames = _frames(budget, cat, 8)
    for f in frames:
        if isinstance(f, list) and len(f) >= 3 and f[2] == "user":
            return f[0]
    return frames[0][0] if frames and isinstance(frames[0], list) else None


def _stall_text(budget: dict, cat: str) -> tuple[str, dict]:
    """("stops 1.5 s every 3.0 s in push_metrics (x.py:9)", evidence) when the budget's stalls are
    this cause's and come back regularly; ("", {}) otherwise."""
    st = budget.get("stalls")
    if not isinstance(st, dict) or st.get("cause") != cat or not st.get("count") or st.get("continuous"):
        return "", {}
    ev = {"stall_s": st.get("duration_s"), "stall_every_s": st.get("period_s") if st.get("periodic") else None,
          "stalls": st.get("count")}
    where = f" in {st['frame']}" if st.get("frame") else ""
    if st.get("periodic") and st.get("period_s"):
        return f"stops {st['duration_s']:.1f} s every {st['period_s']:.1f} s{where}", ev
    if st["count"] >= 2:
        return f"{st['count']} stalls of ~{st['duration_s']:.1f} s{where}", ev
    return "", ev


NO_GPU_BASIS = "no GPU counters: judged on the loop's time"


def _judged(budget) -> str | None:
    """How a budget can judge: "gpu" (the GPU's idle time, the usual), "loop" (no GPU counters
    -- NVML missing or denied, or a job on the CPU: the shares are of the main thread's own time,
    from its stacks), or None (no budget, or one of GPU samples alone with nothing to name)."""
    if not isinstance(budget, dict):
        return None
    if budget.get("gpu_source") is not None:
        return "gpu"
    return "loop" if budget.get("from") == "stacks" else None


def _idle_words(basis: str) -> str:
    return "GPU idle" if basis == "gpu" else "the loop spends"


def _evidence(sig: Signals, budget: dict, cat: str) -> dict:
    return {f"{cat}_share_pct": _pct(sig.get(f"budget.{cat}")), "gpu_busy_pct": _pct(sig.get("budget.gpu_busy")),
            "gpu_from": budget.get("gpu_source"), "window_s": budget.get("window_s"),
            "top_frames": [f"{f[0]} {f[1] * 100:.0f}%" for f in _frames(budget, cat) if isinstance(f, list)] or None}


@verdict(title="Host-bound: the GPU waits for Python/CPU code", severity=SEVERITY_WARNING, order=95,
         meaning="GPU idle >= {HOST_BOUND_SHARE:.0%} of the time while the loop runs Python/CPU code")
def host_bound(sig: Signals) -> Finding | None:
    share, budget = sig.get(f"budget.{CPU}"), sig.facts.get("budget")
    # (GPU counters only: on a job without them, CPU code is the work itself, not a wait)
    if share is None or _judged(budget) != "gpu":
        return None
    util, sm = sig.get("gpu.util_gpu"), sig.get("gpu.sm_active")
    # The GPU must be in use: no kernel at all (util.gpu 0, as for a process that only holds a
    # context) is gpu_idle's case — the work is not on the GPU, not waiting for the host.
    in_use = (util is not None and util > 0.0) or (sm is not None and sm >= HOST_BOUND_MIN_SM)
    owners = budget.get("cpu_owners") or {}
    framework = {k: v for k, v in owners.items() if k in FRAMEWORKS}
    fw_share = sum(framework.values())
    where = _top_frame(budget, CPU)
    model_share = owners.get(MODEL) or 0.0
    names = ", ".join(sorted(framework, key=lambda k: -framework[k]))
    if model_share >= MODEL_CPU_SHARE and model_share >= fw_share:
        advice = (f"{model_share * 100:.0f}% of that CPU time is the model's own forward and backward launching "
                  "kernels (model code): the kernels are too small for the GPU, so the CPU cannot queue them fast "
                  "enough. Capture the step in CUDA graphs (torch.compile(mode='reduce-overhead'), "
                  "torch.cuda.make_graphed_callables), fuse small ops (torch.compile), use fused/foreach "
                  "optimizers, or give each kernel more work (a larger batch).")
        if fw_share >= FRAMEWORK_SECOND_SHARE:
            advice += (f" The framework's own per-step code ({names}: hooks, logging, the optimizer closure) takes "
                       f"another {fw_share * 100:.0f}%: log less often (log_every_n_steps / logging_steps).")
    elif fw_share >= FRAMEWORK_CPU_SHARE:
        advice = (f"Most of that CPU time is the framework's own per-step code ({names}: hooks, logging, the "
                  "optimizer closure): give each step more GPU work (a larger batch, or gradient accumulation "
                  "with a larger micro-batch), log less often (log_every_n_steps / logging_steps), and capture "
                  "the step with torch.compile or CUDA graphs.")
    else:
        advice = ("Move the CPU work out of the training loop: augmentation, tokenising and decoding into "
                  "DataLoader workers (num_workers), tensor work onto the GPU; compute metrics on the GPU and "
                  "read them every N steps; raise the batch size so the fixed per-step cost counts less.")
    if where:
        advice = f"The hottest code is {where}. " + advice
    stall, sev = _stall_text(budget, CPU)
    summary = f"GPU idle {share * 100:.0f}% of the last {_win(budget)} while the main thread runs CPU code" + (
        f", mostly {where}" if where else "") + (f"; {stall}" if stall else "")
    ev = {**_evidence(sig, budget, CPU), "cpu_owners_pct": {k: _pct(v) for k, v in owners.items()} or None, **sev}
    ev["framework_cpu_pct"] = _pct(fw_share)
    ev["model_cpu_pct"] = _pct(model_share)
    return host_bound.spec.finding(level=share / HOST_BOUND_SHARE if in_use else 0.0, lost_share=share, confidence=0.8,
                                   evidence=ev, advice=advice, summary=summary)


@verdict(title="I/O stall: the loop waits for file I/O (checkpoints, logs)", severity=SEVERITY_WARNING,
         order=65, meaning="GPU idle >= {IO_STALL_SHARE:.0%} of the time in file I/O (torch.save, safetensors, logs)")
def io_stall(sig: Signals) -> Finding | None:
    share, budget = sig.get(f"budget.{IO}"), sig.facts.get("budget")
    basis = _judged(budget)
    if share is None or basis is None:
        return None
    where = _top_frame(budget, IO)
    stall, sev = _stall_text(budget, IO)
    psi = sig.get("host.psi_io_some_pct")
    summary = f"{_idle_words(basis)} {share * 100:.0f}% of the last {_win(budget)} in file I/O" + (
        f" ({where})" if where else "") + (f"; {stall}" if stall else "") + (
        f" ({NO_GPU_BASIS})" if basis == "loop" else "")
    advice = ("Take file I/O off the training loop's critical path: save checkpoints asynchronously "
              "(torch.distributed.checkpoint.async_save, or copy the state to the host and write it from a "
              "thread), less often, or to faster local storage; log to files every N steps, not every step.")
    return io_stall.spec.finding(level=share / IO_STALL_SHARE, lost_share=share, confidence=0.8 if basis == "gpu" else 0.6,
                                 evidence={**_evidence(sig, budget, IO), "psi_io_some_pct": _r(psi), **sev,
                                           "judged_on": basis,
                                           # the cost's other measure (verdicts/causal.py SLOW_STEPS)
                                           "slow_step_excess_pct": _pct(sig.get("probe.slow_step_excess"))},
                                 advice=advice, summary=summary)


@verdict(title="Loop blocked: sleeps, locks or network calls keep the GPU waiting", severity=SEVERITY_WARNING,
         order=67, meaning="GPU idle >= {LOOP_BLOCKED_SHARE:.0%} of the time in blocking calls (sleep, lock, queue, socket)")
def loop_blocked(sig: Signals) -> Finding | None:
    share, budget = sig.get(f"budget.{BLOCKED}"), sig.facts.get("budget")
    basis = _judged(budget)
    if share is None or basis is None:
        return None
    # judged on the waits the frames name (sleep, lock, queue, socket): off-CPU time the kernel
    # sees inside torch ops or page faults is real, but another verdict names its cause
    named = budget.get("blocked_in_calls")
    named = named if isinstance(named, (int, float)) else 0.0
    where = _top_frame(budget, BLOCKED)
    stall, sev = _stall_text(budget, BLOCKED)
    summary = f"{_idle_words(basis)} {share * 100:.0f}% of the last {_win(budget)} in blocking calls" + (
        f" in {where}" if where else "") + (f"; {stall}" if stall else "") + (
        f" ({NO_GPU_BASIS})" if basis == "loop" else "")
    advice = ("The training loop waits on something other than the GPU or its data: move synchronous "
              "calls (metric uploads, RPCs, waiting on a lock or a queue) to a background thread, or make "
              "them less frequent; remove sleeps from the loop.")
    if where:
        advice = f"It waits in {where}. " + advice
    # ranked by the share it judges (the named calls), not by the kernel's off-CPU guess
    return loop_blocked.spec.finding(level=named / LOOP_BLOCKED_SHARE, lost_share=min(share, named),
                                     confidence=0.75 if basis == "gpu" else 0.6,
                                     evidence={**_evidence(sig, budget, BLOCKED), "in_blocking_calls_pct": _pct(named),
                                               **sev, "judged_on": basis}, advice=advice,
                                     summary=summary)
