"""The job's phases: start-up, training, evaluation, checkpointing, the end.

Verdicts are about training. A job spends its first seconds importing, building its model,
loading weights and compiling, with the GPU idle, and later evaluates and writes checkpoints;
judged like training, that start-up reads as "the job is not using the GPU". So each py-spy
window of the main thread is given a phase from what its moments' frames say
(gputop.derive.frame_rules.PHASE_RULES) and from the probe's steps when there is a probe:

- a window with a backward pass or an optimizer step on the stack, or with probe steps, is
  training — checkpointing when checkpoint frames fill ``CHECKPOINT_SHARE`` of it;
- a window without them whose frames are mostly evaluation (``EVAL_SHARE``) is evaluation;
- before the first training window the job is starting up; its parts (importing, building the
  model, loading weights, compiling, starting CUDA and the DataLoader) are timed from the hints;
- any other window keeps the phase it is in (a data wait or a sleep happens in every phase),
  except that start-up needs its own frames: after ``QUIET_WINDOWS`` windows without them, or
  from the first window when gputop attached to a job past its start-up, the job is *running*
  (judged like training: a loop whose frames name no training step is still judged);
- the target's exit ends it.

A job already training when gputop attaches has no start-up.

**Warm-up.** The first stretch of each judged stretch (after start-up, after an evaluation, or
from the first window when gputop attached to a running job) is *warm-up*: cuBLAS/cuDNN set-up,
autotuning, the allocator growing and lazy module init make the first steps slower than the
rest, and neither start-up frames nor the steady loop describe them. Warm-up is shown and not
judged. It lasts until the step time has settled: the pooled step time of the last
``SETTLE_READINGS`` readings (the probe's ~1 s windows: their steps' time over their steps) is no
more than ``SETTLE_RATIO`` faster than that of the ``SETTLE_READINGS`` before. Warm-up makes steps
faster; a loop that has stopped speeding up has settled, whether its steps are level, jitter
(two DataLoader workers deliver batches in bursts: per-window medians flip between two modes
while the pooled time holds) or slow down (a stall is not a warm-up). While the probe sees the
loop inside its first step (it took a batch, ended no step and takes no other) nothing settles:
that step is cuDNN autotuning or lazy initialisation, and the GPU's busy share then says
nothing about how the steps will go (for up to ``WARMUP_MAX_S`` after the first batch:
budget_processor.FIRST_STEP_MAX_S). Training recognised after a stretch of "running" (the job's
start-up spent in code the frame tables do not know) warms up too while that first step is
pending, and that stretch is start-up. A loop with no DataLoader takes no batch the probe sees: in
the job's first warm-up it is inside its first step while its stacks are in a backward pass or an
optimizer step and the probe has ended no step. Without a probe, the upper
quartile of the GPU's busy share of each second (a second's share also drops in every stall)
within ``SETTLE_BUSY`` over ``SETTLE_BUSY_READINGS`` seconds; with no start-up frames
(compiling, lazy CUDA init, building) among them; and at most ``WARMUP_MAX_S``. After an
evaluation, two readings back at the step time training had settled at end it. A job attached
to once it has settled leaves warm-up after those few readings. The judged stretch starts at
the first of the readings that said it had settled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gputop.derive import frame_rules as fr

STARTUP, WARMUP, TRAINING, EVALUATION, CHECKPOINTING, RUNNING, ENDED = (
    "startup", "warmup", "training", "evaluation", "checkpointing", "running", "ended")
PHASES = (STARTUP, WARMUP, TRAINING, EVALUATION, CHECKPOINTING, RUNNING, ENDED)
# the phases verdicts judge: a checkpoint stall is a training cost, and a loop whose frames name
# no training step (a custom loop, a job computing on the CPU) is judged as it is
JUDGED = (TRAINING, CHECKPOINTING, RUNNING)
LABELS = {STARTUP: "start-up", WARMUP: "warm-up", TRAINING: "training", EVALUATION: "evaluation",
          CHECKPOINTING: "checkpointing", RUNNING: "running (no training step recognised)", ENDED: "ended"}
EVAL_SHARE = 0.3          # of a window's moments in evaluation frames (without training ones)
CHECKPOINT_SHARE = 0.25   # of a window's moments in checkpoint frames
STARTUP_SHARE = 0.2       # of a window's moments in start-up frames (imports, model build...) to be start-up
QUIET_WINDOWS = 2         # start-up ends after this many windows with neither start-up nor training frames
WARMUP_MAX_S = 30.0       # warm-up never lasts longer than this
SETTLE_READINGS = 2       # step-time readings (probe windows) whose pooled step time ...
SETTLE_RATIO = 0.10       # ... is no more than 10% faster than that of the ones before
SETTLE_BUSY = 0.10        # ... without a probe: the upper quartile of the GPU busy share of the
SETTLE_BUSY_READINGS = 3  # ... last 3 seconds within 10 points of that of the 3 before
READING_S = 1.0           # a reading covers about the second before its time (a probe window, a bucket)
SETTLE_SPANS = 3          # without any reading: spans of the loop without start-up frames


def look_start(phase: str | None, since, training_since) -> float | None:
    """Where a look back over the job's recent past starts at the earliest: while judged, the
    judged stretch's start (the warm-up before it is shown, not judged); in any other phase, that
    phase's start. A look reaching further would judge a phase with what came before it in it:
    the budget's window, and the thread states the rules read beside it (a Lightning job's share of
    time waiting on the GPU read 12% 4 s into training, its warm-up in the look, and 27% once the
    look held training alone). After the end, the end (the budget's window then holds nothing new;
    the thread states keep their last look: threads.states_since). None: no phase known."""
    start = training_since if phase in JUDGED else since if phase is not None else None
    return float(start) if type(start) in (int, float) else None


@dataclass
class PhaseTracker:
    phase: str | None = None       # what the job is doing now, as shown and judged (warm-up included)
    since: float | None = None
    raw: str | None = None         # the phase by frames and steps alone (warm-up is part of a judged one)
    raw_since: float | None = None
    warm_since: float | None = None  # the current warm-up began then (None: not warming up)
    settle: list = field(default_factory=list)   # [(t, "step" | "busy", value)] of this warm-up
    warm_spans: int = 0            # spans of this warm-up without start-up frames
    settled_ref: dict = field(default_factory=dict)   # kind -> the step time (or busy share) last settled at
    startup_t0: float | None = None
    startup_parts: Counter = field(default_factory=Counter)   # start-up part -> seconds
    startup_s: float | None = None
    training_since: float | None = None  # start of the current judged stretch
    # set when training began after a "running" stretch that turned out to be start-up (the
    # budget processor moves that stretch's budget to start-up and clears it)
    running_was_startup: bool = False
    quiet: int = 0                       # start-up windows in a row without start-up frames
    changes: list = field(default_factory=list)                # [(t, phase)]

    def window(self, t0: float, t1: float, hints: Counter, n: int, dt: float, probe_steps: int,
               startup_if_quiet: bool = False, readings: list | None = None,
               first_step_pending: bool = False) -> str | None:
        """Update with one py-spy window [t0, t1] of ``n`` moments; returns the new phase when
        it changed, else None. ``readings``: [(t, "step" | "busy", value[, weight])] of the step
        time in the window (the probe's mean step of each of its windows, weighted by its steps,
        else the span's GPU busy share), which say when a warm-up has settled.
        ``first_step_pending``: the probe sees the loop inside its first step (no reading says
        anything yet)."""
        if self.raw == ENDED:
            return None   # windows settled after the exit do not bring the job back
        train = hints.get(fr.TRAIN, 0) > 0 or probe_steps > 0
        starting = (n > 0 and sum(hints.get(p, 0) for p in fr.STARTUP_PARTS) / n >= STARTUP_SHARE) or startup_if_quiet
        if train:
            new = CHECKPOINTING if n and hints.get(fr.CHECKPOINT, 0) / n >= CHECKPOINT_SHARE else TRAINING
        elif n and hints.get(fr.EVAL, 0) / n >= EVAL_SHARE:
            new = EVALUATION
            self.quiet = 0
        elif n and hints.get(fr.CHECKPOINT, 0) / n >= CHECKPOINT_SHARE and self.raw in JUDGED:
            new = CHECKPOINTING
        elif self.raw is None:
            new = STARTUP if starting else RUNNING   # attached to a job past its start-up
        elif self.raw == STARTUP:
            self.quiet = 0 if starting else self.quiet + 1
            new = RUNNING if self.quiet >= QUIET_WINDOWS else STARTUP
        elif self.raw == EVALUATION:
            # an evaluation that ends without training frames after it (a loop the frame tables
            # do not know) must not keep the job unjudged forever
            self.quiet += 1
            new = RUNNING if self.quiet >= QUIET_WINDOWS else EVALUATION
        elif self.raw == CHECKPOINTING:
            new = TRAINING
        else:
            new = self.raw
        if new == STARTUP or self.raw in (None, STARTUP):
            if self.raw is None and new == STARTUP:
                self.startup_t0 = 0.0   # the session's start: what came before is start-up too
            if new == STARTUP:
                for part in fr.STARTUP_PARTS:
                    if hints.get(part):
                        self.startup_parts[part] += hints[part] * dt
                other = n - sum(hints.get(p, 0) for p in fr.STARTUP_PARTS)
                self.startup_parts["other"] += max(0, other) * dt
        # training recognised after a stretch of "running" while the probe sees the loop inside its
        # first step starts a warm-up too: the job spent its start-up on work the frame tables do
        # not know (building its data), and that first step is cuDNN autotuning and lazy init (a
        # ResNet-50's took 17.5 s on an H100). A job gputop attached to mid-training, whose first
        # windows showed no step, has ended steps already and is not made to warm up twice.
        after_running = new == TRAINING and self.raw == RUNNING and first_step_pending
        entering = new in JUDGED and (self.raw not in JUDGED or after_running)
        if after_running and self.startup_t0 is not None and all(p != TRAINING for _t, p in self.changes):
            # the job's first training step, after a start-up that ended in code the frame tables
            # do not know: that "running" stretch was start-up, not training to judge
            self.startup_s = max(0.0, t0 - self.startup_t0)
            self.running_was_startup = True
        self._set_raw(new, t0)
        if entering:
            # (already warming up while "running": the warm-up goes on, its WARMUP_MAX_S from its start)
            self.warm_since = t0 if self.warm_since is None else self.warm_since
            self.settle, self.warm_spans = [], 0
        if self.warm_since is not None and new in JUDGED:
            if first_step_pending or (n and any(hints.get(p, 0) for p in (fr.COMPILE, fr.CUDA_INIT, fr.BUILD))):
                # still compiling or initialising, or inside the first step: nothing here says how steps go
                self.settle, self.warm_spans = [], 0
            else:
                self.warm_spans += 1
                self.settle.extend(readings or ())
            settled = self._settled(t1)
            if settled is not None:
                self.warm_since = None
                return self._show(new, settled)
            return self._show(WARMUP, self.warm_since)
        if new not in JUDGED:
            self.warm_since = None
        return self._show(new, t0)

    def _settled(self, t: float) -> float | None:
        """When the settled stretch began, once the warm-up is over (the step time has settled:
        from the first of the readings that say so; or it has lasted WARMUP_MAX_S: now); None
        while it goes on."""
        if t - self.warm_since >= WARMUP_MAX_S:
            self._remember_level()
            return t
        for kind, tol in (("step", SETTLE_RATIO), ("busy", SETTLE_BUSY)):
            seen = {}
            for r in self.settle:
                rt, k, v = r[0], r[1], r[2]
                if k == kind and v is not None and (kind == "busy" or v > 0):
                    seen[rt] = (v, _weight(r))   # (a probe window near two spans is one reading)
            times = sorted(seen)
            vals = [seen[k] for k in times]
            if not vals:
                continue
            relative = kind == "step"
            level = _pooled if relative else _upper_quartile
            ref = self.settled_ref.get(kind)
            if ref is not None and len(vals) >= 2:
                # after an evaluation: back at the step time training had settled at (else it is
                # judged as a first warm-up: the job may have changed, a longer sequence)
                now = level(vals[-2:])
                if abs(now - ref) <= (tol * ref if relative else tol):
                    return max(self.warm_since, times[-2] - READING_S)
            n = SETTLE_READINGS if relative else SETTLE_BUSY_READINGS
            if len(vals) < 2 * n:
                return None
            # settled: the steps of the last readings are no faster than those before, by more
            # than tol (a warm-up speeds the steps up; a level, jittery or slowing loop has
            # settled). A second's GPU busy share also drops in every stall (a checkpoint, a
            # blocking call): its busier seconds (the upper quartile), level within tol, say how
            # fast the steps go
            last, before = level(vals[-n:]), level(vals[-2 * n:-n])
            if (last >= before * (1.0 - tol)) if relative else abs(last - before) <= tol:
                self.settled_ref[kind] = last
                return max(self.warm_since, times[-n] - READING_S)
            return None
        # without a probe's steps or GPU readings nothing says how the steps go: spans of the
        # loop without start-up frames, counted
        return t if self.warm_spans >= SETTLE_SPANS else None

    def _remember_level(self) -> None:
        """The level a warm-up ended at (also at its ceiling), for the next one after an evaluation."""
        for kind, level in (("step", _pooled), ("busy", _upper_quartile)):
            vals = [(r[2], _weight(r)) for r in self.settle if r[1] == kind and r[2] is not None]
            if len(vals) >= 2:
                self.settled_ref[kind] = level(vals[-2:])

    def ended(self, t: float) -> str | None:
        self.warm_since = None
        self._set_raw(ENDED, t)
        return self._show(ENDED, t)

    def _set_raw(self, new: str, t: float) -> None:
        if new == self.raw:
            return
        if self.raw == STARTUP and self.startup_t0 is not None:
            self.startup_s = max(0.0, t - self.startup_t0)
        self.raw, self.raw_since = new, t

    def _show(self, new: str, t: float) -> str | None:
        if new == self.phase:
            return None
        if (new in JUDGED and self.phase not in JUDGED) or (new == TRAINING and self.phase == RUNNING):
            self.training_since = t   # the judged stretch starts once warm-up is over
        self.phase, self.since = new, t
        self.changes.append((round(t, 2), new))
        return new

    def startup(self, now: float | None = None) -> dict | None:
        """{"seconds", "parts": {part label: seconds}} of the start-up, or None without one.
        Seconds before the first stack sample (or not named by any frame) count as "other"."""
        if self.startup_t0 is None:
            return None
        total = self.startup_s if self.startup_s is not None else (
            max(0.0, now - self.startup_t0) if now is not None else None)
        if total is None:
            return None
        named = {p: s for p, s in self.startup_parts.items() if p != "other" and s > 0}
        parts = {fr.STARTUP_LABELS[p]: round(s, 1) for p, s in sorted(named.items(), key=lambda kv: -kv[1])}
        parts[fr.STARTUP_LABELS["other"]] = round(max(0.0, total - sum(named.values())), 1)
        return {"seconds": round(total, 1), "parts": parts}

    def describe_startup(self, now: float | None = None) -> str | None:
        """"start-up 14.0 s: importing 6.0 s, building the model 8.0 s"."""
        st = self.startup(now)
        if not st:
            return None
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in st["parts"].items() if v >= 0.1)
        return f"start-up {st['seconds']:.1f} s" + (f": {parts}" if parts else "")


def _weight(reading: tuple) -> float:
    """A reading's weight: its steps (a probe window's), else 1."""
    w = reading[3] if len(reading) > 3 else None
    return float(w) if type(w) in (int, float) and w > 0 else 1.0


def _pooled(vals: list) -> float:
    """The pooled step time of (mean step, steps) readings: their steps' time over their steps."""
    return sum(v * w for v, w in vals) / sum(w for _v, w in vals)


def _upper_quartile(vals: list) -> float:
    vals = sorted(v for v, _w in vals)
    return vals[min(len(vals) - 1, (3 * len(vals)) // 4)]
