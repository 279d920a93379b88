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
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gputop.derive import frame_rules as fr

STARTUP, TRAINING, EVALUATION, CHECKPOINTING, RUNNING, ENDED = (
    "startup", "training", "evaluation", "checkpointing", "running", "ended")
PHASES = (STARTUP, TRAINING, EVALUATION, CHECKPOINTING, RUNNING, ENDED)
# the phases verdicts judge: a checkpoint stall is a training cost, and a loop whose frames name
# no training step (a custom loop, a job computing on the CPU) is judged as it is
JUDGED = (TRAINING, CHECKPOINTING, RUNNING)
LABELS = {STARTUP: "start-up", TRAINING: "training", EVALUATION: "evaluation", CHECKPOINTING: "checkpointing",
          RUNNING: "running (no training step recognised)", ENDED: "ended"}
EVAL_SHARE = 0.3          # of a window's moments in evaluation frames (without training ones)
CHECKPOINT_SHARE = 0.25   # of a window's moments in checkpoint frames
STARTUP_SHARE = 0.2       # of a window's moments in start-up frames (imports, model build...) to be start-up
QUIET_WINDOWS = 2         # start-up ends after this many windows with neither start-up nor training frames


@dataclass
class PhaseTracker:
    phase: str | None = None       # None until the first window
    since: float | None = None
    startup_t0: float | None = None
    startup_parts: Counter = field(default_factory=Counter)   # start-up part -> seconds
    startup_s: float | None = None
    training_since: float | None = None  # start of the current judged stretch
    quiet: int = 0                       # start-up windows in a row without start-up frames
    changes: list = field(default_factory=list)                # [(t, phase)]

    def window(self, t0: float, t1: float, hints: Counter, n: int, dt: float, probe_steps: int,
               startup_if_quiet: bool = False) -> str | None:
        """Update with one py-spy window [t0, t1] of ``n`` moments; returns the new phase when
        it changed, else None."""
        if self.phase == ENDED:
            return None   # windows settled after the exit do not bring the job back
        train = hints.get(fr.TRAIN, 0) > 0 or probe_steps > 0
        starting = (n > 0 and sum(hints.get(p, 0) for p in fr.STARTUP_PARTS) / n >= STARTUP_SHARE) or startup_if_quiet
        if train:
            new = CHECKPOINTING if n and hints.get(fr.CHECKPOINT, 0) / n >= CHECKPOINT_SHARE else TRAINING
        elif n and hints.get(fr.EVAL, 0) / n >= EVAL_SHARE:
            new = EVALUATION
            self.quiet = 0
        elif n and hints.get(fr.CHECKPOINT, 0) / n >= CHECKPOINT_SHARE and self.phase in JUDGED:
            new = CHECKPOINTING
        elif self.phase is None:
            new = STARTUP if starting else RUNNING   # attached to a job past its start-up
        elif self.phase == STARTUP:
            self.quiet = 0 if starting else self.quiet + 1
            new = RUNNING if self.quiet >= QUIET_WINDOWS else STARTUP
        elif self.phase == EVALUATION:
            # an evaluation that ends without training frames after it (a loop the frame tables
            # do not know) must not keep the job unjudged forever
            self.quiet += 1
            new = RUNNING if self.quiet >= QUIET_WINDOWS else EVALUATION
        elif self.phase == CHECKPOINTING:
            new = TRAINING
        else:
            new = self.phase
        if new == STARTUP or self.phase in (None, STARTUP):
            if self.phase is None and new == STARTUP:
                self.startup_t0 = 0.0   # the session's start: what came before is start-up too
            if new == STARTUP:
                for part in fr.STARTUP_PARTS:
                    if hints.get(part):
                        self.startup_parts[part] += hints[part] * dt
                other = n - sum(hints.get(p, 0) for p in fr.STARTUP_PARTS)
                self.startup_parts["other"] += max(0, other) * dt
        return self._set(new, t0)

    def ended(self, t: float) -> str | None:
        return self._set(ENDED, t)

    def _set(self, new: str, t: float) -> str | None:
        if new == self.phase:
            return None
        if self.phase == STARTUP and self.startup_t0 is not None:
            self.startup_s = max(0.0, t - self.startup_t0)
        if (new in JUDGED and self.phase not in JUDGED) or (new == TRAINING and self.phase == RUNNING):
            self.training_since = t
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
