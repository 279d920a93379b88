"""The processor that keeps the time budget and the phases, live and in replay.

Every second it publishes:

- ``budget``/"window": the budget of the last ``WINDOW_S`` seconds of the current phase (the
  window starts no earlier than the phase did, so training is never judged with start-up in
  it), with its stalls, and the probe's split of each step when there is a probe;
- ``phase``/"main": the job's phase, on change and every ``PHASE_EVERY_S``, with the start-up's
  length and parts;
- every ``SESSION_EVERY_S``, ``budget``/"session": the budget of the whole session so far, per
  phase — what the report shows. Every py-spy window is added to it exactly once, when its
  moments are final (GPU and kernel samples after it are in).

The process judged is the one the verdicts judge: the lowest running rank of a distributed job,
else the target.
"""

from __future__ import annotations

from collections import Counter

from gputop.catalogue import (KIND_BUDGET, KIND_HEALTH, KIND_PHASE, KIND_PROBE_STEP, KIND_STACKS, KIND_TARGET,
                              SOURCE_STACKS)
from gputop.derive import frame_rules as fr
from gputop.derive import phases as ph
from gputop.derive.budget import UNKNOWN, Budget, Moment, Naming, budget_of
from gputop.derive.moments import SETTLE_S, GpuBusy, MomentBuilder, chosen_gpus
from gputop.derive.ranks import rank_table
from gputop.derive.stacks_window import budget_since, works_now
from gputop.derive.stalls import describe, find_stalls
from gputop.derive.steps import pool_steps
from gputop.derive.thread_samples import window_weight
from gputop.model import Sample

WINDOW_S = 20.0          # long enough to see a stall that comes back every few seconds
MIN_WINDOW_S = 2.0       # a phase younger than this is judged over its first seconds anyway
PHASE_EVERY_S = 10.0
SESSION_EVERY_S = 5.0
# How many moments the phase tracker judges at once (derive/phases.py: its shares of a window's
# moments and its count of quiet windows were set on windows of ~40 moments: the UI's first 2 s
# windows at 20 Hz, the agent's 20 s ones at 2 Hz). The UI's steady 5 s windows (~100 moments)
# are judged as two halves, so a 1 s checkpoint still fills the 25% it did of a 2 s window.
PHASE_SPAN_MOMENTS = 40
_GPU_ONLY = Naming(UNKNOWN, None, None, "unknown", None)


def judged_process(store, now: float) -> tuple[str | None, list[str] | None]:
    """(PID, its GPUs or None) of the process whose main thread the budget follows: the lowest
    running rank (the one the verdicts judge first), else the lowest rank that ran (a job whose
    ranks ended is still about them, never about its launcher), else the target."""
    table = [r for r in rank_table(store, now) if r.get("rank") is not None]
    running = [r for r in table if r.get("state") != "exited"]
    ranks = running or table
    if ranks:
        r = min(ranks, key=lambda r: r["rank"] if isinstance(r["rank"], int) else 1 << 30)
        gpu = r.get("gpu")
        return str(r["pid"]), ([str(gpu)] if gpu is not None else None)
    mains = [k for k, s in store.latest_of_kind(KIND_STACKS).items() if s.get("main") is True]
    if mains:
        return mains[0], None
    target = store.latest_of_kind(KIND_TARGET)
    return (next(iter(target)) if target else None), None


class BudgetProcessor:
    name = "budget"
    produces = (KIND_BUDGET, KIND_PHASE)
    interval_s = 1.0

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.reset()

    def reset(self) -> None:
        self.builder = MomentBuilder()
        self.tracker = ph.PhaseTracker()
        self.first_batch_t = None        # the probe's first window with a batch taken (FIRST_STEP_MAX_S)
        self.session: dict[str, Budget] = {}
        self.done_t = float("-inf")      # py-spy windows ending at or before this are in the session budget
        self.phase_said_t = None
        self.session_said_t = None
        self.pid = None
        self.gpu_source = None
        self.probe_phases = False        # phases from the probe's windows (no stacks to read)
        self.reset_phase = False         # say "phase unknown" once after the judged process changed
        self.last_judged = None          # the last judged phase (for time settled after the end)
        # moments with no Python frame, held until a moment with one comes: the main thread has
        # none only while the interpreter starts or exits, so a run of them at the recording's
        # end is the job's exit (0.5-1 s: 7-10% of a 14 s corpus job's "training"), not training
        self.frameless: list[tuple[str, Moment]] = []
        self.probe_t = float("-inf")
        self.worked_t: float | None = None   # the last run that did its work (works_now)

    def process(self, store, now: float) -> list[Sample]:
        if not works_now(store, now, self.interval_s, self.worked_t):
            return []   # calm: every other second (derive/stacks_window.py)
        self.worked_t = now
        pid, only = judged_process(store, now)
        if pid is None:
            return []
        if pid != self.pid:
            if self.pid is not None:
                # another process is judged now (a launcher's ranks appeared): its phases are
                # its own, so what the launcher's frames said no longer holds
                self.tracker = ph.PhaseTracker()
                self.first_batch_t = None
                self.builder.reset()
                self.done_t = float("-inf")
                self.phase_said_t = None
                self.reset_phase = True
            self.pid = pid
        gpus = chosen_gpus(store, only)
        out: list[Sample] = []
        changed = self._settle(store, now, pid, gpus)
        if self.done_t == float("-inf") and not self._stacks_expected(store):
            changed = self._settle_probe(store, now, pid) or changed
        target = store.latest(KIND_TARGET, pid)
        if target is not None and target.get("state") == "exited":
            changed = self.tracker.ended(target.t) or changed
        phase = self.tracker.phase
        if changed or self.phase_said_t is None or now - self.phase_said_t >= PHASE_EVERY_S:
            if phase is not None or self.reset_phase:
                out.append(Sample(now, KIND_PHASE, "main", self.phase_data(now)))
                self.phase_said_t = now
                self.reset_phase = False
        since = budget_since(store, pid, now, self.window_s)   # holds the window in flight, late or not
        start = ph.look_start(phase, self.tracker.since, self.tracker.training_since)
        if start is not None:
            since = max(since, start)   # never judged with what came before the phase in it
        moments, source, b = self.builder.moments_and_budget(store, pid, since, now, gpus)
        if not moments:
            moments, source = self._gpu_only(store, since, gpus)
            b = budget_of(moments)
        self.gpu_source = source or self.gpu_source
        if moments:
            data = b.to_data()
            span = max(1e-6, moments[-1].t - moments[0].t + moments[-1].dt)
            data.update({"window_s": round(now - since, 2), "gpu_source": source, "phase": phase, "pid": pid,
                         "from": "stacks" if moments[0].naming is not _GPU_ONLY else "gpu",
                         "stalls": describe(find_stalls(moments), span,
                                            sum(m.dt for m in moments if m.busy is not None))})
            split = self._probe_split(store, pid, since)
            if split:
                data["probe"] = split
            out.append(Sample(now, KIND_BUDGET, "window", data))
        if self.session and (self.session_said_t is None or now - self.session_said_t >= SESSION_EVERY_S):
            out.append(Sample(now, KIND_BUDGET, "session", self.session_data(now)))
            self.session_said_t = now
        return out

    # -- internals ---------------------------------------------------------------------------

    def _settle(self, store, now: float, pid: str, gpus: list[str]) -> bool:
        """Give every py-spy window that became final to the phase tracker and the session."""
        changed = False
        windows = [s for s in store.window(KIND_STACKS, self.done_t).get(pid, []) if s.t > self.done_t]
        if not windows:
            return False
        kernel_newest = store.latest("thread_kernel", pid)
        busy = GpuBusy(store, now - 1.0, gpus)
        probe = store.window(KIND_PROBE_STEP, windows[0].t - 30.0).get(pid, [])
        for s in windows:
            final = s.t <= now - SETTLE_S or (kernel_newest is not None and kernel_newest.t >= s.t
                                             and busy.newest is not None and busy.newest >= s.t)
            if not final:
                break
            try:
                changed = self._settle_window(store, now, pid, gpus, s, probe) or changed
            except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError):
                pass   # a malformed window (a damaged or hostile recording) is skipped, not retried forever
            self.done_t = s.t
        return changed

    def _settle_window(self, store, now: float, pid: str, gpus: list[str], s, probe) -> bool:
        """One final py-spy window: its phase, and its moments into the session budget. A window
        of twice PHASE_SPAN_MOMENTS moments or more is judged as spans of PHASE_SPAN_MOMENTS or
        a few more (the stack source's steady 5 s windows as two halves)."""
        dur = s.get("dur_s")
        dur = float(dur) if type(dur) in (int, float) and 0 < dur < 600 else 2.0
        ms, _src = self.builder.moments(store, pid, s.t - dur - 0.5, now, gpus)
        ms = [m for m in ms if m.t <= s.t and m.t > self.done_t]
        # a calm window (1/calm_factor of the rate: sources/calm.py) has that share of the moments in the same time:
        # its spans are as long as a full-rate window's, so a 1 s checkpoint fills the same share
        return self._judge_moments(ms, s.t, probe, max(1, PHASE_SPAN_MOMENTS // window_weight(s.data)))

    def _judge_moments(self, ms: list[Moment], t_end: float, probe, span_moments: int | None = None) -> bool:
        changed = False
        if self.first_batch_t is None:
            # kept, not looked up: the probe windows at hand reach back 30 s only
            self.first_batch_t = next((p.t for p in probe if type(p.get("batch_total")) is int
                                       and p.get("batch_total") > 0), None)
        t0 = ms[0].t - ms[0].dt / 2 if ms else t_end
        n_spans = max(1, len(ms) // (span_moments or PHASE_SPAN_MOMENTS))
        cuts = [len(ms) * k // n_spans for k in range(n_spans + 1)]
        edges = [t0] + [ms[c].t - ms[c].dt / 2 for c in cuts[1:-1]] + [t_end]
        for k in range(n_spans):
            a, b = edges[k], edges[k + 1]
            last = k == n_spans - 1
            span = ms[cuts[k]:cuts[k + 1]] if n_spans > 1 else ms
            # the probe's windows near the span (its ends: 0.5 s of slack, as for a whole window)
            lo, hi = (a - 0.5 if k == 0 else a), (t_end + 0.5 if last else b)
            near = [p for p in probe if (lo <= p.t <= hi if k == 0 else lo < p.t <= hi)]
            steps = sum(p.get("step_n") for p in near if type(p.get("step_n")) is int)
            recompiling = any(type(p.get(k)) is int and p.get(k) > 0 for p in near
                              for k in ("recompiles", "recompile_limit_hits"))
            # a backward pass or an optimizer step on the stack, before the job was ever judged: only a
            # job's first warm-up waits for its first step this way (a loop whose steps the probe never
            # counts would otherwise wait WARMUP_MAX_S after every evaluation)
            in_step = self.tracker.training_since is None and any(m.naming.hint == fr.TRAIN for m in span)
            changed = self._judge_span(span, a, b, steps, _step_readings(near, span), recompiling,
                                       _first_step_pending(near, probe, in_step, self.first_batch_t)) or changed
        return changed

    def _judge_span(self, ms: list[Moment], t0: float, t1: float, steps: int, readings: list,
                    recompiling: bool = False, first_step_pending: bool = False) -> bool:
        hints = Counter(m.naming.hint for m in ms if m.naming.hint)
        if recompiling:
            # torch.compile compiling *again* (the probe saw a guard fail): not the job warming
            # up but a cause of lost time in training (the recompilation verdict), so its
            # compile frames do not restart the warm-up
            hints.pop(fr.COMPILE, None)
        before = self.tracker.phase
        # training starts at its first backward/optimizer moment, not at the span's start
        first_train = next((m.t - m.dt / 2 for m in ms if m.naming.hint == fr.TRAIN), t0)
        changed = bool(self.tracker.window(first_train if before in (None, ph.STARTUP) else t0, t1, hints, len(ms),
                                           ms[0].dt if ms else 0.0, steps, readings=readings,
                                           first_step_pending=first_step_pending))
        if self.tracker.running_was_startup:
            self.tracker.running_was_startup = False
            ran = self.session.pop(ph.RUNNING, None)
            if ran is not None:
                self.session.setdefault(ph.STARTUP, Budget()).merge(ran)
        phase = self.tracker.phase or ph.STARTUP
        for m in ms:
            p = before if (before == ph.STARTUP and phase in ph.JUDGED + (ph.WARMUP,) and m.t < first_train) else phase
            if p == ph.ENDED:
                p = self.last_judged or ph.TRAINING   # time after the exit belongs to what it was doing
            if m.naming.cat == UNKNOWN and m.naming is not _GPU_ONLY:
                self.frameless.append((p, m))
                continue
            for held_p, held in self.frameless:
                self.session.setdefault(held_p, Budget()).add(held)
            self.frameless.clear()
            self.session.setdefault(p, Budget()).add(m)
        if phase in ph.JUDGED:
            self.last_judged = phase
        return changed

    def at_end(self, store, now: float) -> list[Sample]:
        """The end of a recording: settle every window left (nothing comes after them) and say
        the session budget as it stands, so the report covers the whole file."""
        pid = self.pid
        if pid is None:
            return []
        self._settle(store, float("inf"), pid, chosen_gpus(store, judged_process(store, now)[1]))
        for _p, held in self.frameless:   # no frame came after them: the job's exit
            self.session.setdefault(ph.ENDED, Budget()).add(held)
        self.frameless.clear()
        return [Sample(now, KIND_BUDGET, "session", self.session_data(now))] if self.session else []

    @staticmethod
    def _stacks_expected(store) -> bool:
        """The stack source runs (or is starting): its windows, not the probe's, give the phases."""
        h = store.latest(KIND_HEALTH, SOURCE_STACKS)
        return h is not None and h.get("state") in ("ok", "degraded")

    def _settle_probe(self, store, now: float, pid: str) -> bool:
        """Without stacks (no ptrace), the probe's windows give the phases: a window with steps
        is training; before the first one the job is starting up."""
        if store.latest(KIND_STACKS, pid) is not None:
            self.probe_phases = False
            return False
        windows = [w for w in store.window(KIND_PROBE_STEP, self.probe_t).get(pid, []) if w.t > self.probe_t]
        changed = False
        for w in windows:
            steps = int(w.get("step_n") or 0)
            span = float(w.get("window_s") or 1.0)
            self.probe_phases = True
            # a probe window without steps before the first one is start-up
            if self.tracker.window(w.t - span, w.t, Counter(), 0, 0.0, steps, startup_if_quiet=True,
                                   readings=_step_readings([w], [])):
                changed = True
            self.probe_t = w.t
        return changed

    @staticmethod
    def _gpu_only(store, since: float, gpus: list[str]) -> tuple[list[Moment], str | None]:
        """Without stacks: the GPU's busy samples alone; the idle time is "not attributable"."""
        busy = GpuBusy(store, since, gpus)
        ms = []
        for ts, vs in busy.lines[:1]:
            for i, (t, v) in enumerate(zip(ts, vs)):
                if t >= since:
                    dt = (t - ts[i - 1]) if i > 0 else 0.1
                    ms.append(Moment(t, min(max(dt, 0.01), 1.0), v, _GPU_ONLY))
        return ms, busy.source

    @staticmethod
    def _probe_split(store, pid: str, since: float) -> dict | None:
        """Each step's split from the probe's own events: data wait, GPU time, the rest."""
        windows = store.window(KIND_PROBE_STEP, since).get(pid, [])
        if not windows:
            return None
        pool = pool_steps(windows)
        if not pool.timed_steps:
            return None
        data = pool.data_wait_share
        gpu = pool.gpu_share
        host = None
        if gpu is not None:
            # CUDA events time the GPU's work of a step, which can run past the step's end into
            # the next one (queued work): a share over 1 says "the GPU never waited", shown as 1
            gpu = min(gpu, 1.0)
        if data is not None and gpu is not None:
            host = max(0.0, 1.0 - data - min(gpu, 1.0 - data))
        return {"steps_per_s": _r(pool.steps_per_training_s), "step_ms": _r(pool.step_ms_mean),
                "data_wait_share": _r(data), "gpu_share": _r(gpu), "host_share": _r(host),
                "syncs_per_step": _r(pool.syncs_per_step)}

    def phase_data(self, now: float) -> dict:
        t = self.tracker
        return {"phase": t.phase, "label": ph.LABELS.get(t.phase, t.phase), "since": t.since,
                "training_since": t.training_since, "startup": t.startup(now),
                "startup_text": t.describe_startup(now)}

    def session_data(self, now: float) -> dict:
        return {"phases": {p: b.to_data() for p, b in self.session.items()},
                "startup": self.tracker.startup(now), "startup_text": self.tracker.describe_startup(now),
                # [t, phase] lists, as a recording gives them back: a tuple would make the
                # recorder rewrite its chunk plain before writing it (encode_chunk_series)
                "changes": [[t, p] for t, p in _bounded(self.tracker.changes)]}


def _step_readings(probe_windows: list, ms: list[Moment]) -> list:
    """What says how the steps go in a span, for the warm-up (derive/phases.py): the mean step of
    each probe window with steps, weighted by its steps (so readings pool to the steps' time over
    the steps), else the span's GPU busy share in each second of it."""
    out = []
    for p in probe_windows:
        ms_mean, n = p.get("step_ms_mean"), p.get("step_n")
        if type(ms_mean) not in (int, float) or not ms_mean > 0:
            ms_mean = p.get("step_ms_p50")   # (a window without the mean: its median)
        if type(ms_mean) in (int, float) and ms_mean > 0:
            out.append((p.t, "step", ms_mean, n if type(n) is int and n > 0 else 1))
    if out:
        return out
    # one reading a second: a span is ~2 s, and a warm-up needs a few readings to settle
    buckets: dict[int, list[float]] = {}
    for m in ms:
        if m.busy is not None:
            buckets.setdefault(int(m.t), []).append(m.busy)
    # (a second needs a few samples to say anything: 5 at the UI's 20 Hz, 2 at the agent's 2 Hz)
    return [(sec + 1.0, "busy", sum(v) / len(v)) for sec, v in sorted(buckets.items()) if len(v) >= 2]


FIRST_STEP_MAX_S = ph.WARMUP_MAX_S   # a first step longer than this after the first batch is not waited for


def _first_step_pending(probe_windows: list, earlier: list = (), in_step: bool = False,
                        first_batch_t: float | None = None) -> bool:
    """The probe sees the loop inside its first step: it has taken a batch, ended no step, and
    took no batch in its newest window near the span. That step is cuDNN autotuning, lazy module
    init, the allocator's first growth: the GPU's busy share meanwhile says nothing about how the
    steps will go (a ResNet's first backward autotuned 7 s on the H200, and its busy seconds
    settled the warm-up before any step had ended). A loop taking batches without steps (an
    inference loop) is not pending: its busy share is all there is; nor is one whose first batch
    (in ``earlier``, the probe windows before) came over FIRST_STEP_MAX_S ago: a loop whose steps
    the probe never sees (a custom optimizer) and whose batches take over a second would
    otherwise be warm-up for WARMUP_MAX_S.

    A loop with no DataLoader (its batches made on the GPU, or indexed from tensors) takes no batch
    the probe sees: it is inside its first step while the probe has ended no step and taken no
    batch and the span's stacks (``in_step``) show a backward pass or an optimizer step. (A
    MobileNet's first backward sat 12 s loading cuDNN with the GPU idle, on an H100: the idle
    seconds, level, settled the warm-up and were judged host-bound.) Only the job's first warm-up
    waits so (the caller's ``in_step`` says it): a loop whose steps the probe never counts (a
    hand-written update under torch.compile: no optimizer step, no forward steps) waits the
    warm-up's WARMUP_MAX_S once, at its start, not after every evaluation. GradScaler's steps, in
    any window so far, count as ended steps: one that skips its optimizer step on an overflow
    ended all the same (amp_fp16_overflow skips them all). ``first_batch_t``: when the job took its
    first batch, kept by the caller (``earlier`` reaches back 30 s only)."""
    if not probe_windows:
        return False
    p = probe_windows[-1]
    steps, batches, rate = p.get("step_total"), p.get("batch_total"), p.get("batches_per_s")
    # GradScaler's steps (per window): a skipped one ended too, with no optimizer step
    scaled = any(type(w.get("scaler_steps")) is int and w.get("scaler_steps") > 0 for w in (*earlier, *probe_windows))
    no_batch = batches is None or (type(batches) is int and batches == 0)
    if in_step and type(steps) is int and steps == 0 and no_batch and not scaled:
        return True
    if not (type(steps) is int and steps == 0 and type(batches) is int and batches > 0
            and type(rate) in (int, float) and rate == 0):
        return False
    first = first_batch_t if first_batch_t is not None else next(
        (w.t for w in (*earlier, *probe_windows)
         if type(w.get("batch_total")) is int and w.get("batch_total") > 0), p.t)
    return p.t - first <= FIRST_STEP_MAX_S


def _bounded(changes: list, head: int = 50, tail: int = 150) -> list:
    """The first and the last phase changes (a long job that checkpoints every minute changes
    phase thousands of times; its start-up -> training change must stay)."""
    return changes if len(changes) <= head + tail else changes[:head] + changes[-tail:]


def _r(x, nd: int = 4):
    return None if x is None else round(x, nd)


def budget_section(processor: "BudgetProcessor", t_end: float) -> dict:
    """The report's ``budget``, ``phases`` and ``startup`` keys from the processor that replayed
    the whole file: the same numbers the session's ``budget``/"session" samples carry."""
    data = processor.session_data(t_end)
    out: dict = {"startup": data["startup"], "startup_s": (data["startup"] or {}).get("seconds"),
                 "phases": [{"t": t, "phase": p} for t, p in data["changes"]]}
    phases = data["phases"]
    if phases:
        judged = Budget()
        for p in ph.JUDGED:
            if p in processor.session:
                judged.merge(processor.session[p])
        out["budget"] = {"training": judged.to_data() if judged.total_s > 0 else None,
                         "by_phase": phases, "gpu_source": processor.gpu_source}
    return out


def render_budget_text(report: dict) -> list[str]:
    """The report's text lines for the start-up and the training time budget."""
    from gputop.derive.budget import CATEGORIES, LABELS, budget_text

    lines = []
    st = report.get("startup")
    if st:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in st["parts"].items() if v >= 0.1)
        lines.append(f"Start-up {st['seconds']:.1f} s" + (f": {parts}" if parts else "")
                     + " (not judged: verdicts are about training)")
    b = (report.get("budget") or {}).get("training")
    if b:
        src = (report.get("budget") or {}).get("gpu_source")
        lines.append(f"Time budget of training ({b['seconds']:.0f} s of main-thread samples; GPU busy from "
                     f"{src or 'no GPU counters'}): {budget_text(b)}")
        for c in CATEGORIES:
            v = b["shares"].get(c)
            if isinstance(v, (int, float)) and v >= 0.005:
                top = (b.get("frames") or {}).get(c) or []
                where = f"  {top[0][0]}" if top else ""
                lines.append(f"  {LABELS[c]:<34} {v * 100:5.1f}%{where}")
    return lines
