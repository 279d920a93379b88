"""The GPU's kernel time per step, from a short CUDA kernel trace (opt-in: ``GPUTOP_KERNEL_SAMPLE=1``).

Why: util.gpu counts a kernel's GPU-side launch time as busy, so on a loop of many tiny kernels
it reads 1.4-1.6 times their own time (docs/benchmarks.md, "Fifth session of 2026-12-06"), and
``launch_bound``'s gain -- what a CUDA graph would win -- comes out short. A CUPTI trace of the
job's kernels (torch.profiler's kineto, CUDA activity only) measures their time: on an H100 it
put the ResNet-50 batch-1 loop at 0.82-0.86 ms of kernels a step, within 10% of the step its
CUDA graph reached.

What it costs, measured there (``benchmarks/kernel_busy.py``): while a trace runs, a
launch-bound job launches a third to half as fast (CUPTI records each launch); stopping and
reading it takes 0.3-1.4 s in the job's process (one CUDA-graph job lost ~1.3 s of steps per
trace); and unless CUPTI is finalized when the trace stops, the job stays 17-51% slower
afterwards. So: off unless the job's environment asks for it (``GPUTOP_KERNEL_SAMPLE=1``),
``TEARDOWN_CUPTI=1`` set for kineto when it does (``install`` sets it before torch loads, unless
the job set it), one trace (step boundary to step boundary, ``WINDOW_S`` and ``MIN_STEPS`` at
least, ``MAX_WINDOW_S`` at most, then the next boundary within ``END_WAIT_S``) once training has
settled (``START_STEPS`` steps and ``START_S`` seconds after a monitor attached), again every
``EVERY_S`` (however often monitors come and go); never while another profiler is on, never once
torch.compile is in use, never on CUDA before 12.6 (CUPTI re-initialised after a teardown
crashes where CUDA graphs are used, torch says), never without a monitor. A trace starts on a
step boundary seen within ``BOUNDARY_WAIT_S`` and counts only if it ends on one; a start or stop
that raises switches the profiler off (``_disable_if_on``).

The trace is started and stopped on the probe thread (CUPTI records every thread's kernels); the
training thread is never called. The message (``kernel`` in each window, gputop/probe/window.py)
carries the latest sample: the kernels' time back to back (``floor_ns``: their union, with the
GPU's own gap between two counted) divided by the steps the job made in the trace, its age, or
why there is none.

Imports: the standard library only (torch is handed in by torch_hooks).
"""

from __future__ import annotations

import os
import time

ENV = "GPUTOP_KERNEL_SAMPLE"
WINDOW_S = 0.3          # one trace at least this long ...
MIN_STEPS = 10          # ... and over at least this many steps (a step's edge is 1/10 of the count) ...
MAX_WINDOW_S = 2.0      # ... but no longer than this ...
END_WAIT_S = 1.0        # ... but for the next step boundary, at most this much longer
POLL_S = 0.005          # how often the probe thread looks at the step counter meanwhile
BOUNDARY_WAIT_S = 1.0   # no step boundary this long before a trace: none this time
START_STEPS = 20        # ... once the job has made this many steps since a monitor attached
START_S = 8.0           # ... and this long since then (warm-up: autotuning, allocator growth)
EVERY_S = 600.0         # and again this often
MIN_CUDA = (12, 6)      # CUPTI teardown and re-init with CUDA graphs crash before this (torch's profiler)
COPY_PREFIXES = ("Memcpy", "Memset")   # a trace's copy and memset records: not kernels
MAX_EVENTS = 200_000    # a trace's events read at most (~0.1-0.2 s of the GIL in Python; ten launch-bound
                        # steps are a few thousand)
MIN_COUNTED_STEPS = 2   # a trace over fewer steps is not counted (its edges weigh on a lone step)
PAUSE_RETRY_S = 30.0    # a trace that found no step boundary (a pause) is tried again this soon
CAPTURE_QUIET_S = 60.0  # no trace this soon after the job captured a CUDA graph itself ...
CAPTURE_WAIT_S = 30.0   # ... and a trace's stop waits this long at most for a capture begun during it ...
CAPTURE_GAP_S = 2.0     # ... and this long after one ends (another may follow at once)
PAUSE_RETRIES = 3       # tries in a row tried again PAUSE_RETRY_S later (then EVERY_S)


def wanted(env=None) -> bool:
    """Whether the job's environment asks for kernel samples ("1", or "true"/"yes"/"on": a user
    who wrote one of those meant it)."""
    return (os.environ if env is None else env).get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def prepare_env(env=None) -> None:
    """Before torch loads: let kineto finalize CUPTI when a trace stops (or the job stays slower
    afterwards), unless the job chose otherwise."""
    env = os.environ if env is None else env
    if wanted(env):
        env.setdefault("TEARDOWN_CUPTI", "1")


def union_ns(spans: list[tuple[int, int]]) -> int:
    """The length of the union of [start, end) intervals, in their unit."""
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


# The GPU's own gap between two kernels that follow each other at once (a CUDA graph's replay):
# measured on an H100 (seventh session of 2026-12-06, benchmarks/kernel_busy.py), the gaps
# between a graph's kernels were 0.38-0.54 us (p10-p90; 98% under 1 us) in a ResNet-50 at batch 1
# and a 24-layer MLP, where a Python loop launching the same ResNet left 4.2-31 us (p10-p90; none
# under 2 us). So a gap under GPU_GAP_MERGE_NS is the GPU's, not the host's; and the kernels a
# loop launches from Python, replayed back to back, would take their time plus GPU_GAP_NS each.
GPU_GAP_MERGE_NS = 1_000
GPU_GAP_NS = 420


def floor_ns(spans: list[tuple[int, int]]) -> int:
    """The GPU time the kernels of ``spans`` take back to back: the union of their intervals,
    the gaps under ``GPU_GAP_MERGE_NS`` counted (the GPU's own), and ``GPU_GAP_NS`` for each
    longer gap (a gap the host left, which a CUDA graph of the same kernels closes to the GPU's
    own). What a launch-bound step would take with its launches gone: a graph's replay ran
    0.95 ms a step against 0.78 ms of kernels by their union (ResNet-50 at batch 1, H100), and
    its floor by this count 0.90 ms."""
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None:
            total, end = e - s, e
        elif s > end:
            gap = s - end
            total += (gap if gap < GPU_GAP_MERGE_NS else GPU_GAP_NS) + e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _cuda_too_old(torch) -> str | None:
    v = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        major, minor = (int(x) for x in str(v).split(".")[:2])
    except ValueError:
        return f"CUDA {v!r}: no version to check"
    if (major, minor) < MIN_CUDA:
        return f"CUDA {v} is older than 12.6: CUPTI re-initialised after a trace crashes where CUDA graphs are used"
    return None


def _profiler_on(torch) -> bool:
    """Whether a profiler is on in the job: torch's module flag (set by any thread's profile) or
    this thread's state (``_profiler_enabled`` reads only the calling thread's; two profilers at
    once crashed a process)."""
    prof = getattr(getattr(torch, "autograd", None), "profiler", None)
    if getattr(prof, "_is_profiler_enabled", False):
        return True
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except Exception:
        return False


def _disable_if_on(torch) -> None:
    """After a failed start or stop: never leave CUPTI tracing the job."""
    try:
        if torch._C._autograd._profiler_enabled():
            torch.autograd.profiler._disable_profiler()
            # (and torch's module flag our profile set on entering: its exit never ran)
            reset = getattr(torch.autograd.profiler, "_set_is_profiler_enabled", None)
            if reset is not None:
                reset(False)
    except Exception:
        pass


def _span(e) -> tuple[int, int] | None:
    """A kineto event's [start, end) in ns (``*_us`` on torch that has no ``*_ns``)."""
    try:
        if hasattr(e, "start_ns"):
            start, dur = e.start_ns(), e.duration_ns()
        else:
            start, dur = e.start_us() * 1000, e.duration_us() * 1000
    except Exception:
        return None
    return (start, start + dur) if dur >= 0 else None


def _captured_lately(hooks) -> bool:
    """A CUDA graph capture under way, or one within ``CAPTURE_QUIET_S`` (torch_hooks notes them)."""
    if getattr(hooks, "captures_open", 0):
        return True
    last = getattr(hooks, "last_capture_t", None)
    return last is not None and time.monotonic() - last < CAPTURE_QUIET_S


def wait_window(p, stop, t_on: float) -> bool:
    """With the trace on since ``t_on``: wait for ``MIN_STEPS`` steps and ``WINDOW_S``, or for
    ``MAX_WINDOW_S``, then for the next step boundary, ``END_WAIT_S`` past ``MAX_WINDOW_S`` at
    most (a step of up to ~3 s still ends on one: a GPT-2 step under Accelerate takes 0.29 s, so
    ten of them outlast ``MAX_WINDOW_S``, and a trace cut off there would never count). True
    when it ended on a boundary (no partial step's kernels counted)."""
    steps0 = p.step_total
    while not stop.is_set():
        time.sleep(POLL_S)
        n, now_s = p.step_total - steps0, time.monotonic() - t_on
        if (n >= MIN_STEPS and now_s >= WINDOW_S) or now_s >= MAX_WINDOW_S:
            break
    last, deadline = p.step_total, t_on + MAX_WINDOW_S + END_WAIT_S
    while p.step_total == last and time.monotonic() < deadline and not stop.is_set():
        time.sleep(POLL_S)
    return p.step_total != last


class KernelSampler:
    """One per probe, driven from the probe thread's tick."""

    def __init__(self, probe) -> None:
        self.p = probe
        self.on = wanted()
        self.off = None if self.on else f"off: set {ENV}=1 in the job's environment to sample the kernels' time"
        self.result: dict | None = None     # the latest sample
        self.next_at: float | None = None   # when the next trace may start (monotonic)
        self.start_steps: int | None = None
        self.last_at: float | None = None   # the last trace taken: at most one every EVERY_S, monitors or not
        self.pause_misses = 0               # tries in a row that found no step boundary

    def tick(self, now: float) -> None:
        p = self.p
        if not self.on:
            return
        if not p.monitoring:
            self.next_at = self.start_steps = None   # (a new monitor: training settles again first ...)
            return
        if not p.cuda_events_on:   # (CUDA in use and the probe thread bound to the job's device)
            if self.result is None:
                self.off = ("no training step seen: the trace's kernels are counted per step (an optimizer "
                            "step, or gputop.probe.step() in a loop without one)" if not p.step_total
                            else "the probe's CUDA timing is off (the Steps view's hooks say why)")
            return
        if self.next_at is None:
            # (... and a monitor that reconnects gets no trace sooner than EVERY_S after the last)
            self.next_at = max(now + START_S, (self.last_at or -EVERY_S) + EVERY_S)
            self.start_steps = p.step_total + START_STEPS
            return
        if now < self.next_at or p.step_total < self.start_steps:
            return
        self.next_at = now + EVERY_S
        try:
            self._sample(now)
        except Exception as e:
            self.on = False
            self.off = f"failed: {type(e).__name__}: {e}"
            p.hook_failed("kernel_sample", e)

    def _sample(self, now: float) -> None:
        torch = self.p.torch
        p = self.p
        why = _cuda_too_old(torch)
        if why is None and _profiler_on(torch):
            why = "another profiler is on in the job (two at once crashed a process)"
        hooks = p.torch_hooks
        if why is None and getattr(hooks, "compile_count", 0):
            # (its CUDA graphs may be recorded again at any step, and stopping a trace synchronizes
            # the device from this thread: a capture in progress would break)
            why = "torch.compile is in use: its CUDA graphs may be recorded again at any step"
        if why is None and _captured_lately(hooks):
            why = (f"the job captured a CUDA graph in the last {CAPTURE_QUIET_S:.0f} s (another may follow, and a "
                   "trace's stop synchronizes the device, which a capture does not survive)")
            self.next_at = now + CAPTURE_QUIET_S   # (tried again after a quiet minute, not in EVERY_S)
        if why is not None:
            # (and the last sample goes: it measured kernels from before this -- other code, or
            # other graphs -- which the verdicts would read as today's)
            self.off, self.result = why, None
            return
        stop = p._stop
        # from just after a step boundary to just after another, MIN_STEPS or more later: the
        # kernels traced are those of whole steps, but for the trace's start-up and the poll
        t0 = time.monotonic()
        first = p.step_total
        while p.step_total == first and time.monotonic() - t0 < BOUNDARY_WAIT_S and not stop.is_set():
            time.sleep(POLL_S)
        if p.step_total == first or stop.is_set():
            self.off = (f"no step boundary within {BOUNDARY_WAIT_S:.0f} s: no trace this time (a pause in "
                        "stepping, or steps longer than that)")
            # (a checkpoint or an evaluation: tried again soon, not in EVERY_S -- a job that saves
            # every 2 s met its save on the H100 and would have waited 10 min; but steps longer
            # than the wait miss it every time: after PAUSE_RETRIES misses, EVERY_S again)
            self.pause_misses += 1
            if self.pause_misses <= PAUSE_RETRIES:
                self.next_at = now + PAUSE_RETRY_S
            return
        self.pause_misses = 0
        if _captured_lately(hooks):   # (one may have begun at that boundary, as captures do)
            self.off, self.result = "a CUDA graph capture began: no trace now", None
            self.next_at = now + CAPTURE_QUIET_S
            return
        prof = torch.autograd.profiler.profile(use_kineto=True, use_cpu=False, use_device="cuda")
        ended = False
        self.last_at = now
        try:
            prof.__enter__()
            steps0, t_on = p.step_total, time.monotonic()
            ended = wait_window(p, stop, t_on)
            steps = p.step_total - steps0
            t1 = time.monotonic()
            # a capture the job began meanwhile: stop only once it has ended, and CAPTURE_GAP_S
            # after (make_graphed_callables captures a forward then a backward, with a sync between
            # them): the stop synchronizes; after CAPTURE_WAIT_S it stops anyway (a capture that long
            # is not a capture torch makes), which such a capture might not survive
            while time.monotonic() - t1 < CAPTURE_WAIT_S and (getattr(hooks, "captures_open", 0) or (
                    getattr(hooks, "last_capture_t", None) or float("-inf")) > time.monotonic() - CAPTURE_GAP_S):
                time.sleep(POLL_S)
            prof.__exit__(None, None, None)
        finally:
            _disable_if_on(torch)   # (a start or a stop that raised: CUPTI must not stay on)
        if (getattr(hooks, "last_capture_t", None) or float("-inf")) >= t_on:
            self.off = "the job captured a CUDA graph during the trace (its kernels are recorded, not run): not counted"
            self.result, self.next_at = None, now + CAPTURE_QUIET_S
            return
        if ended and steps < MIN_COUNTED_STEPS:
            # (the trace's edges -- CUPTI's start-up, the stop's synchronize -- weigh on a lone step)
            self.off = f"the trace held {steps} step (a step longer than {MAX_WINDOW_S:.0f} s): not counted"
            return
        if not ended:
            self.off = (f"the trace did not end on a step boundary within {MAX_WINDOW_S + END_WAIT_S:.0f} s "
                        "(a step that long, or a pause): not counted")
            return
        by_device: dict = {}
        cuda = torch.autograd.DeviceType.CUDA
        events = prof.kineto_results.events()
        if len(events) > MAX_EVENTS:
            # (reading them holds the GIL in the job's process: a trace this large is not read)
            self.off = f"the trace held {len(events)} events, more than {MAX_EVENTS}: not read"
            return
        for e in events:
            if e.device_type() != cuda or e.name().startswith(COPY_PREFIXES):
                continue
            span = _span(e)
            if span is not None:
                idx = getattr(e, "device_index", None)
                by_device.setdefault(idx() if callable(idx) else None, []).append(span)
        # the job's device's kernels (another GPU of the process runs its own timeline); all of
        # them where the trace numbers devices otherwise than torch does
        spans = by_device.get(p.cuda_device) or [x for v in by_device.values() for x in v]
        if steps < 1 or not spans:
            self.off = f"the trace saw {steps} steps and {len(spans)} kernels in {t1 - t_on:.2f} s"
            return
        self.off = None
        self.result = {"ms_per_step": floor_ns(spans) / 1e6 / steps, "steps": steps, "kernels": len(spans),
                       "window_s": round(t1 - t_on, 3), "at": now, "cost_s": round(time.monotonic() - t_on, 3)}

    def message(self, now: float) -> dict:
        """The window's ``kernel`` field: the latest sample (its age in seconds), or why none."""
        r = self.result
        if r is None:
            return {"off": self.off}
        return {"ms_per_step": round(r["ms_per_step"], 4), "steps": r["steps"], "kernels": r["kernels"],
                "window_s": r["window_s"], "cost_s": r["cost_s"], "age_s": round(now - r["at"], 1), "off": None}
