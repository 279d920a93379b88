"""Whether the watched job is *calm*: one phase for a minute, no verdict turning on or off, no
stall. While it is, the stack source samples py-spy, and the NVML fast loop the GPUs,
``CALM_FACTOR`` (4) times less often, the kernel-wait sampler ``CALM_KERNEL_FACTOR`` (2) times
(gputop/sources/stacks.py, nvml.py): what watching costs then is spent on noticing a change, and anything that changes
makes it unsettled again, so the next minute is sampled at the full rates.

Why this trade (issue 14): the full rates buy the accuracy of a *first* judgement (a share near
a verdict's threshold, a short stall's moments), and once a verdict has held for a minute the
engine's hysteresis (ENTER_S, LEAVE_S, LEAVE_LEVEL in verdicts/engine.py) keeps it on; the
calm rates pool samples over wider windows: py-spy at 5 Hz in 20 s windows over the thread
states' 30 s horizon (derive/stacks_window.py) holds 50-150 samples a thread (at worst, just
before a window lands, half the full rate's worst, 100; a 25% share: 6 points of binomial noise
then, 4.3 at the full rate; the verdict leaves only below 80% of its 20% threshold for 5 s); if
the noise did turn one off, that change itself brings the full rates back. A stall makes the loop
unsettled from its first second (the stall detector's sample), the calm window in flight is cut
within ~1-2 s, so a stall's own stacks are sampled at the full rate from then on. What it
costs: a change that shows only in the stacks (a new wait that no verdict names yet) is first
judged on 5 Hz samples, up to one calm window (20 s) late, over a 30 s horizon; and the stall
finder resolves a short idle stretch to a moment (0.2 s) instead of 0.05 s (derive/stalls.py's
MIN_STALL_S = 0.25 s is then two moments).

The kernel-wait sampler (25 Hz, the GIL-wait share's source) goes to 12.5 Hz while calm: its
wake-ups were most of the stack thread's CPU (~250 us of CPU each on a torch process, the
sleep's wake-up and a cold cache included: 0.38 of the H200's 0.60% in run 11). Its noise is
binomial in the off-CPU ticks a thread state pools: at worst (all off-CPU, half of it GIL)
1/(2 sqrt(n)), 3.2 points at 25 Hz over the 10 s horizon; while calm the horizon is 30 s, so
12.5 Hz pools 375 ticks: 2.6 points. Not a quarter: 6.25 Hz (187 ticks, 3.7 points at worst)
missed a sleeper thread's GIL wait by 5.8 points in one of two repeats of
benchmarks/gil_accuracy.py (docs/benchmarks.md), outside the +-5 the GIL-wait accuracy asks.
The rate is chosen once a second, at each harvest, so every thread_kernel second is sampled at
one rate and says so (``calm_factor``).

It hears the derived samples on the bus (the budget processor's ``phase``, the stall detector's
``stall``, the engine's ``verdict_change``): sources import no derive code, so only the kinds
(gputop/catalogue.py) and their documented fields are read. ``on_samples`` runs on whichever
thread publishes: it only writes two numbers and a tuple, each assignment atomic.
"""

from __future__ import annotations

from gputop.catalogue import KIND_PHASE, KIND_STALL, KIND_VERDICT_CHANGE

CALM_AFTER_S = 60.0        # one phase, no verdict change and no stall for this long: calm
# While calm, py-spy's rate is divided by this (20 -> 5 Hz) and the NVML fast loop's interval
# multiplied by it (0.1 -> 0.4 s). A calm py-spy window says so with its ``calm_factor``: each of
# its samples stands for that many of the full rate where samples are counted
# (derive/thread_samples.py: window_weight); so does a gpu sample taken at the calm rate (the
# report's statistics), and a thread_kernel second with its own factor (thread states, the
# workers' I/O share).
CALM_FACTOR = 4
# The kernel-wait sampler's rate is divided by this while calm (25 -> 12.5 Hz): the GIL-wait
# share's accuracy (module docstring).
CALM_KERNEL_FACTOR = 2
# NVML's slow loop (the processes on each GPU, 1 -> 2 s) stretches by this much only: gpu_procs
# older than 5 s count as missing in the rank table and the exporter. GPM's gap stretches by
# CALM_FACTOR with the fast loop (0.5 -> 2 s; nvmlGpmMetricsGet costs ~1 ms a call, the largest
# part of the fast loop's CPU): views hold a GPM value GPM_HOLD_S (4 s: two calm snapshots are at
# most 2 s and one calm fast-loop gap, 1.6 s, apart), and a GPM value, the mean over its own
# gpm_window_s, weighs that span in the report (derive/record_stats.py: held_weights).
CALM_HELD_FACTOR = 2
# While calm, py-spy's steady windows are this long instead of 5 s (sources/stacks.py). py-spy has no
# streaming mode, so each window is a fresh py-spy whose start-up (attach, read the interpreter's
# symbols) costs what ~40 samples do (2-core box: 18 ms of CPU a start, 0.42 ms a sample at 10 Hz):
# at the calm 5 Hz, 10 s windows spent nearly half of py-spy's CPU on start-ups, 20 s windows
# under a third. What it costs: while calm, a window's stacks arrive up to 20 s after they were
# sampled; the thread states' and the time budget's windows widen with the window in flight
# (derive/stacks_window.py), so they always hold one. The window in flight when the job stops
# being calm is cut short (py-spy ends a window early on SIGINT, its file complete), so the
# stacks of a change are at most one short window late, as before.
CALM_WINDOW_S = 20
WEIGHT_FIELD = "calm_factor"   # of a calm ``stacks`` window, ``thread_kernel`` second and ``gpu`` sample
MAX_WEIGHT = 20                # beyond this it is not what a source writes: taken as 1


def weight_of(value) -> int:
    """How many samples of the full rate one sample stands for, from its WEIGHT_FIELD value
    (missing or malformed: 1). Read where samples are counted: derive/thread_samples.py (thread
    states, hot frames) and derive/record_stats.py (the report's statistics)."""
    return value if type(value) is int and 1 <= value <= MAX_WEIGHT else 1
_HEARD = frozenset((KIND_PHASE, KIND_STALL, KIND_VERDICT_CHANGE))
# what a calm source's health adds to its line in the UI's Sources view
CALM_NOTE = (f"calm: a quarter to half the usual sampling rates while the job holds still (one phase, no verdict "
             f"change and no stall for {CALM_AFTER_S:.0f} s)")


class JobCalm:
    """A bus subscriber that says whether the job is calm now (``calm()``). It is listed with
    the session's sources (it samples nothing: ``start``/``stop`` do nothing), so the session
    subscribes it and the recording's meta describes it."""

    name = "calm"

    def __init__(self, clock, after_s: float = CALM_AFTER_S) -> None:
        self.clock = clock
        self.after_s = float(after_s)
        self._phase: tuple | None = None     # (phase, since) of the last phase sample
        self._changed_at: float | None = None  # session time of the last change; None: no phase yet
        self.changes = 0

    def on_samples(self, samples) -> None:
        for s in samples:   # every sample of the session passes here: one set lookup for most
            kind = s.kind
            if kind not in _HEARD:
                continue
            if kind == KIND_PHASE:
                if s.key != "main":
                    continue
                phase = (s.data.get("phase"), s.data.get("since"))
                if phase != self._phase:
                    self._phase = phase
                    self._unsettle(s.t)
            elif kind == KIND_VERDICT_CHANGE or (kind == KIND_STALL and s.data.get("stalled") is True):
                self._unsettle(s.t)

    def start(self, emit) -> None:
        pass

    def stop(self) -> None:
        pass

    def on_reset(self) -> None:
        """(A bus reset is a replay's seek; a live job goes on: nothing to forget.)"""

    def _unsettle(self, t: float) -> None:
        if self._changed_at is None or t > self._changed_at:
            self._changed_at = t
        self.changes += 1

    def calm(self) -> bool:
        """Calm now: a phase has been heard, and nothing changed for ``after_s``."""
        at = self._changed_at
        return at is not None and self._phase is not None and self._phase[0] is not None \
            and self.clock.now() - at >= self.after_s

    def describe(self) -> dict:
        return {"after_s": self.after_s, "factor": CALM_FACTOR, "kernel_factor": CALM_KERNEL_FACTOR,
                "held_factor": CALM_HELD_FACTOR}
