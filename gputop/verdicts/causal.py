"""What a cause cost: the GPU time it kept idle, and what removing it would give.

A verdict that names a cause is a claim about lost GPU time (issue 29). Its rule sees a signal
(a GIL wait, a data wait, syncs); whether that signal *cost* anything is what the time budget
says: the share of the window's wall time the GPU idled while the main thread was in that wait.
A wait that does not leave the GPU idle is off the critical path. So, for every cause-naming
finding, the engine (verdicts/engine.py) asks here:

- ``causal_loss``: its lost share is the budget's share of its category where the budget has
  GPU counters (``CATEGORY_OF``), never more than the GPU's idle share; the rule's own figure
  stands where there is no budget.
- ``gpu_busy``: the window's GPU busy share (the budget's, else util.gpu). At ``BUSY_GATE`` or
  more no cause is a verdict: what the rule saw becomes a note ("... the GPU stays busy 93%: not
  on the critical path").
- ``fix_gain``: removing a lost share ``s`` of the step's wall time makes steps ``1/(1-s)`` as
  fast, and no fix makes a step shorter than the GPU's own work in it: ``s <= 1 - busy`` (but for
  recompilation, whose cost is timed in steps and whose GPU time -- autotuning -- goes with it).
- ``session_loss``: over the whole session, a budget cause's loss is the training budget's share
  of its category, the figure the report prints beside it.

One home for these numbers: the verdict's ``gain`` and evidence (``fix_gain_pct``), the UI, the
report, ``--json`` and the exporter all read ``fix_gain``'s figure, worded by ``gain_text``.
"""

from __future__ import annotations

from gputop.verdicts.signals import Signals

BUSY_GATE = 0.90          # GPU busy share at or above which no cause is a verdict (a note instead)
# a lost share is never taken as more than this, so the gain stays finite (at most 100x); the corpus's
# fixes measured up to 124x (compile_varlen), 32x (recsys_cpu_embedding) and 24x
# (offload_adamw_cpu), which a cap at 0.95 (20x) could not say
MAX_LOSS = 0.99

# the budget category whose GPU-idle share a verdict's cause is (derive/budget.py)
# (not sync_stall: while the main thread waits in a sync the GPU is busy; what a sync costs is
# the launch gap after it: its rule takes the idle while the thread waits or runs host code, the
# budget's sync + cpu shares, capped by the GPU's idle share)
CATEGORY_OF = {"input_bound": "data", "gil_contention": "gil",
               "communication_bound": "collective", "cpu_oversubscribed": "cpu_wait", "host_bound": "cpu",
               "io_stall": "io", "loop_blocked": "blocked"}
# causes judged without the budget's categories (the GPU's own view), capped by its idle share
# (not recompilation: its cost is timed in steps, the recompiling steps' excess over a typical one,
# and the GPU's busy time in a recompile -- inductor autotuning the new kernels on it -- goes with
# the recompile)
CAPPED_BY_IDLE = ("h2d_copy_bound", "launch_bound", "sync_stall", "host_memory_pressure", "cpu_throttled",
                  "optimizer_offload", "allocator_thrash")
# causes whose fix removes the copies too (the optimizer kept on the GPU): their cap is the
# compute engine's idle share, the GPU's idle share plus the time it only copied (gpu.copy_only:
# util.gpu counts the copy engines busy)
COPIES_GO = ("optimizer_offload",)
# verdicts never gated by the GPU's busy share: a stopped loop, ranks compared with each other,
# and another process's kernels on the GPU (they are what keeps it busy)
NOT_GATED = ("stalled", "straggler_rank", "gpu_shared")
# a stopped loop is not a share of the step's time that a fix wins back: it has no gain, and it
# is primary at once (the job itself changed), whatever was primary before
URGENT = ("stalled",)
# skipped optimizer steps run at full speed and are thrown away: fixing them gains learning, not
# steps/s, so they have no steps/s gain (their lost share, the share skipped, ranks them); nor
# are they gated by the GPU's busy share (a thrown-away step is lost however busy the GPU was)
NO_GAIN = ("skipped_steps",)
# under this share of wall time, a cost the probe timed on the GPU is none: the cause's wait
# overlaps the GPU's work (a loop waiting 30% of each step for a batch its prefetch already
# overlaps, while the GPU spans the whole step: input_bound with no cost, a note, not a verdict)
MIN_TIMED_LOSS = 0.02


def gpu_busy(sig: Signals) -> float | None:
    """The judged window's GPU busy share (0-1) for the job: the time budget's, else util.gpu's
    mean; on a GPU shared with other processes (gpu_procs.others), the job's part of it (their
    kernels take turns: the others' time keeps the GPU busy, not the job's work), so a wait of
    the job's is not hidden by another job's kernels."""
    b = sig.get("budget.gpu_busy")
    if b is None:
        util = sig.get("gpu.util_gpu")
        b = None if util is None else util / 100.0
    mine, others = sig.get("gpu.target_sm_pct"), sig.get("gpu.others_sm_pct")
    if b is not None and mine is not None and others and mine + others > 0:
        b *= mine / (mine + others)
    return b


# causes whose idle share is the kernels' where the probe traced them (probe.kernel_busy, opt-in):
# a CUDA graph removes the launches and keeps the kernels, so their time is the floor of the step
# (an H100: ResNet-50 at batch 1, 0.82-0.86 ms of kernels a step, its graph 0.92-0.93 ms; util.gpu
# read 1.4-1.6 times the kernels' time on such loops)
KERNEL_TIMED = ("launch_bound",)
# causes whose cost util.gpu counts as busy: the driver's own work on the GPU (gpu.driver_only, util.gpu
# over GPM's engine activity with PCIe quiet). The allocator's cudaFree/cudaMalloc of its segments is
# that work: a nanoGPT loop with empty_cache() every step read util.gpu 98%, GR active 72% over steady
# training (H100, the first run, +42% by its fix)
DRIVER_TIMED = ("allocator_thrash",)


def busy_for(vid: str, sig: Signals) -> float | None:
    """The GPU busy share a cause is judged against (its idle cap, and the BUSY_GATE): the
    kernels' share of the step where the probe traced them, for ``KERNEL_TIMED`` causes; the
    window's less the driver's own work, for ``DRIVER_TIMED`` ones; else the window's
    (``gpu_busy``). One home: the gate's note and the evidence say the same figure."""
    if vid in KERNEL_TIMED and sig.get("probe.kernel_busy") is not None:
        return sig.get("probe.kernel_busy")
    busy = gpu_busy(sig)
    driver = sig.get("gpu.driver_only") if vid in DRIVER_TIMED else None
    if busy is not None and driver:
        return max(0.0, busy - driver)
    return busy


# causes whose cost the probe times on the GPU itself (its signal), over the budget's estimate
PROBE_TIMED = {"input_bound": "probe.data_idle_share"}
# causes that fall on some steps only (a checkpoint every N steps, a debug dump every few): their
# cost is at least the steps' excess over the median step (derive/steps.py StepPool.slow_step_excess),
# which holds all they cost -- the writes, the device-to-host copies before them and the relaunch
# after them -- where the budget holds only the file I/O. The budget's share stands where it is
# larger (a write on every step is in the median). The third unseen set's debug dump (H100): file
# I/O 24% of its window, the steps' excess 64%, its fix +174% (a loss of 63%)
SLOW_STEPS = ("io_stall",)
# ... but only where the file I/O explains a real part of that excess: slow steps also come from an
# evaluation between two steps, a recompile, an epoch's DataLoader restart, and those are not the
# writes' (as recompilation asks dynamo's clock to explain half its excess). The dump: file I/O 29%
# of training against an excess of 64% (0.45), 24% of its window (0.37)
EXCESS_IO_EXPLAINED = 0.3


def slow_steps_loss(vid: str, share: float, excess, idle) -> float | None:
    """The steps' excess a ``SLOW_STEPS`` cause takes over its budget ``share``: None where it is
    not one, there is no excess, no GPU idle share to cap it (no GPU counters), or its own share
    explains under ``EXCESS_IO_EXPLAINED`` of the excess."""
    if vid not in SLOW_STEPS or not isinstance(excess, (int, float)) or idle is None:
        return None
    if excess <= share or share < EXCESS_IO_EXPLAINED * excess:
        return None
    return excess


def timed_loss(vid: str, sig: Signals) -> float | None:
    """The cost the probe timed on the GPU itself for this cause, where it has one: for
    input_bound, the share of step time the GPU idled while the loop waited for its batch."""
    name = PROBE_TIMED.get(vid)
    return sig.get(name) if name else None


def causal_loss(vid: str, rule_loss: float, sig: Signals) -> float:
    """The share of wall time a cause kept the GPU idle (see the module's docstring)."""
    busy = gpu_busy(sig)
    idle = None if busy is None else max(0.0, 1.0 - busy)
    cat = CATEGORY_OF.get(vid)
    loss = rule_loss
    budget = sig.facts.get("budget") if isinstance(sig.facts.get("budget"), dict) else {}
    # (a window of GPU samples alone has no categories: its idle time is "not attributable")
    budget_share = sig.get(f"budget.{cat}") if cat and budget.get("from") == "stacks" else None
    if cat is not None and budget_share is not None and busy is not None:
        # (with the probe, the budget's data share is already the GPU's idle time before each batch
        # arrived, at step resolution: derive/moments.py, _calibrate)
        loss = budget_share
    excess = slow_steps_loss(vid, loss, sig.get("probe.slow_step_excess"), idle)
    if excess is not None:
        loss = excess
    probe_idle = timed_loss(vid, sig)
    if probe_idle is not None:
        # the probe times that idle itself, step by step (its CUDA events), where the budget
        # estimates it from ~20 samples a second: at an 84% share two points are 50 points of
        # gain (tv_resnet_workers0: the budget's 86% predicted 7.2x, the probe's 84% 6.3x, the
        # fix measured 6.1x)
        loss = probe_idle
    own_busy = busy_for(vid, sig) if vid in KERNEL_TIMED + DRIVER_TIMED else None
    if own_busy is not None:
        # the kernels' own time, from the probe's trace (util.gpu counts their launch time too), or
        # the GPU's busy time less the driver's own work (util.gpu counts it busy: DRIVER_TIMED)
        idle = 1.0 - own_busy
    if idle is not None and vid in COPIES_GO:
        idle = min(1.0, idle + (sig.get("gpu.copy_only") or 0.0))
    if idle is not None and (cat is not None or vid in CAPPED_BY_IDLE):
        loss = min(loss, idle)
    return max(0.0, min(MAX_LOSS, loss))


def session_basis(vid: str, shares: dict, slow_step_excess: float | None = None) -> str:
    """Which measure set ``session_loss``: "steps" (the steps' excess, for a ``SLOW_STEPS`` cause),
    "idle" (the GPU's idle share capped the excess) or "budget"."""
    share, busy = shares.get(CATEGORY_OF.get(vid, "")), shares.get("gpu_busy")
    if not isinstance(share, (int, float)) or not isinstance(busy, (int, float)):
        return "budget"
    excess = slow_steps_loss(vid, share, slow_step_excess, 1.0 - busy)
    if excess is None:
        return "budget"
    return "steps" if excess <= 1.0 - busy else ("idle" if share < 1.0 - busy else "budget")


def session_loss(vid: str, shares: dict, slow_step_excess: float | None = None) -> float | None:
    """A cause's lost share over the whole judged session, where the time budget measures it: the
    training budget's share of its category (``CATEGORY_OF``), never more than the GPU's idle
    share -- the figure the report's time budget prints beside the verdict ("file I/O 53%"), so
    the report's gain and its budget say one number. The mean of the live windows' losses while
    the verdict held counts each second of a periodic cost in every window that overlaps it and
    leaves out the stretches before it held (trainer_save_steps: 57% while held, 53% of training,
    49% by its fix). For ``SLOW_STEPS`` causes, the session's ``slow_step_excess`` where it is
    larger (as ``causal_loss``). None for a cause the budget does not measure (the probe times
    input_bound's; launch_bound, copies, syncs come from the GPU's own view)."""
    cat = CATEGORY_OF.get(vid)
    if cat is None or vid in PROBE_TIMED:
        return None
    share, busy = shares.get(cat), shares.get("gpu_busy")
    if not isinstance(share, (int, float)):
        return None
    idle = 1.0 - busy if isinstance(busy, (int, float)) else None
    excess = slow_steps_loss(vid, share, slow_step_excess, idle)
    if excess is not None:
        share = excess
    return max(0.0, min(MAX_LOSS, share, 1.0 if idle is None else idle))


def fix_gain(loss: float) -> float:
    """The speed-up (a fraction of steps/s: 0.25 is +25%) that removing a lost share gives."""
    s = max(0.0, min(MAX_LOSS, loss))
    return s / (1.0 - s)


def gain_text(gain: float) -> str:
    """"fixing this: up to +25% steps/s" (from +100%: "up to 3.0x steps/s")."""
    if gain >= 1.0:
        return f"fixing this: up to {1.0 + gain:.1f}x steps/s"
    return f"fixing this: up to +{gain * 100:.0f}% steps/s"
