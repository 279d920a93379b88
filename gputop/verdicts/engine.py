"""The verdict engine: runs every rule once a second, applies hysteresis, picks the primary.

It is a session *processor* (gputop.session.session.Processor): live it runs on the derive
thread, in a replay it runs again on the raw samples. Its output samples are recorded:

- ``verdict``/<id>: every second while a verdict is active (and once with ``active: False``
  when it ends): title, severity, confidence, level, lost_share, evidence, advice, summary,
  since, first_seen, missing.
- ``verdict_primary``/``primary``: every second: the verdict that best explains lost
  throughput now (``id`` None while nothing is established yet), and the others ranked.
- ``verdict_change``/<id>: when a verdict turns on or off (the timeline).
"""

from __future__ import annotations

from dataclasses import replace

from gputop.catalogue import (KIND_HEALTH, KIND_PHASE, KIND_VERDICT, KIND_VERDICT_CHANGE, KIND_VERDICT_PRIMARY,
                              SOURCE_PROBE, SOURCE_STACKS)
from gputop.derive.budget import budget_text
from gputop.derive.phases import ENDED, EVALUATION, JUDGED, STARTUP, WARMUP
from gputop.model import Sample
from gputop.verdicts.budget_rules import FRAMEWORK_CPU_SHARE
from gputop.verdicts.causal import (BUSY_GATE, MIN_TIMED_LOSS, NO_GAIN, NOT_GATED, URGENT, busy_for, causal_loss,
                                    fix_gain, timed_loss)
from gputop.verdicts.compile_rules import RECOMPILES_EXPLAIN
from gputop.verdicts.finding import Finding, VerdictState
from gputop.verdicts.registry import specs
from gputop.verdicts.rules import RULES, straggler_rank
from gputop.verdicts.signals import WINDOW_S, build_signals, cache_rebuilt, running_ranks
from gputop.verdicts.stall_rules import stalled_now


ENTER_S = 1.5        # a rule must hold this long before its verdict turns on (no blips)
LEAVE_S = 5.0        # ... and fail this long before it turns off (no flapping)
LEAVE_LEVEL = 0.8    # "fail" means: the level fell below 80% of its threshold
MIN_PRIMARY_LOSS = 0.10  # a cause must cost >= 10% of step time to outrank a healthy verdict
PHASE_STALE_S = 25.0  # a phase sample older than this (they come every 10 s) no longer holds
MIN_WINDOW_S = 3.0   # a training stretch younger than this is judged over its first seconds
NO_GPU_AFTER_EVALUATIONS = 10  # only after 10 s without GPU counters or steps say there are none
PHASE_WAIT_EVALUATIONS = 15  # seconds to wait for a first phase from a running stacks or probe source
PRIMARY_FREE_S = 15.0   # for this long after a judged stretch begins the primary is the ranking's top
PRIMARY_SWITCH_S = 30.0  # another verdict must lead this long before it replaces an active primary ...
PRIMARY_SWITCH_GAIN = 0.05  # ... and by this much lost share (so the live primary does not flicker)
# verdicts that describe the GPU's state rather than a cause of lost time
NOT_A_CAUSE = tuple(s.id for s in specs() if not s.names_cause)
# specificity: ties for the primary verdict go to the lower value (straggler_rank first: it
# explains the others' communication wait better than anything else); unknown ids go last
ORDER = {s.id: s.order for s in specs()}
UNKNOWN_ORDER = max(ORDER.values()) + 1


class VerdictEngine:
    name = "verdicts"
    produces = (KIND_VERDICT, KIND_VERDICT_PRIMARY, KIND_VERDICT_CHANGE)
    interval_s = 1.0

    def __init__(self, rules=None, window_s: float = WINDOW_S):
        self.rules = list(rules or RULES)
        self.window_s = window_s
        self.states: dict[str, VerdictState] = {}
        self.last_signals = None
        self.evaluations = 0
        self.notes: list[dict] = []         # {"id", "text"}: causes seen this evaluation that cost no GPU time
        self.primary_id: str | None = None  # the live primary (kept until a challenger has led PRIMARY_SWITCH_S)
        self.explained: dict[str, set] = {}  # fallback verdict -> the causes that explain it now
        self.challenger: tuple[str, float] | None = None   # (id, leading since)
        self.stretch: float | None = None   # the judged stretch's start: a new one may change the primary at once
        self.stretch_seen = float("-inf")   # when this engine first judged that stretch

    def reset(self) -> None:
        self.states.clear()
        self.evaluations = 0
        self.notes = []
        self.primary_id, self.challenger, self.stretch = None, None, None
        self.explained = {}

    def evaluate(self, store, now: float, window_s: float | None = None) -> dict[str, Finding]:
        """Every rule's finding now. A distributed job is judged rank by rank (each rank's GPU,
        main thread and probe); a verdict then takes the rank where it holds most strongly and
        names it, and ``straggler_rank`` compares the ranks with each other."""
        ranks = running_ranks(store, now)
        self.notes = []
        if len(ranks) < 2:
            # one rank under a launcher (torchrun --nproc-per-node 1) is judged as itself,
            # not through the launcher's idle main thread
            self.last_signals = build_signals(store, now, window_s or self.window_s, rank=ranks[0] if ranks else None)
            return self._apply(self.last_signals)
        per_rank = []
        for r in ranks:
            sig = build_signals(store, now, window_s or self.window_s, rank=r)
            per_rank.append((r, sig, self._apply(sig)))
        self.last_signals = per_rank[0][1]
        found: dict[str, Finding] = {}
        for r, _, fs in per_rank:
            for vid, f in fs.items():
                if vid not in found or f.level > found[vid].level:
                    found[vid] = replace(f, evidence={"rank": r["rank"], **f.evidence},
                                         summary=f"rank {r['rank']}: {f.summary}")
        straggler = straggler_rank([(r, sig) for r, sig, _ in per_rank], {r["pid"]: fs for r, _, fs in per_rank})
        if straggler is not None:
            found[straggler.id] = straggler = replace(straggler, gain=fix_gain(straggler.lost_share))
            if straggler.level >= 1.0 and "communication_bound" in found:
                # the collectives are slow because one rank is late, not because of the network
                found["communication_bound"] = replace(found["communication_bound"], level=0.0)
        return found

    def _apply(self, sig) -> dict[str, Finding]:
        found = {}
        for rule in self.rules:
            f = rule(sig)
            if f is not None:
                found[f.id] = f
        launch, host = found.get("launch_bound"), found.get("host_bound")
        if launch is not None and host is not None and launch.level >= 1.0 and host.level >= 1.0:
            if (host.evidence.get("framework_cpu_pct") or 0.0) >= 100.0 * FRAMEWORK_CPU_SHARE:
                # most of the CPU time is a framework's per-step code, which is what to fix
                found["launch_bound"] = replace(launch, level=0.0)
            else:
                # the CPU time is spent launching kernels too small to fill the GPU: the more
                # specific explanation of the same host-bound loop
                found["host_bound"] = replace(host, level=0.0)
        copy = found.get("h2d_copy_bound")
        if copy is not None and host is not None and copy.level >= 1.0:
            found["host_bound"] = replace(found["host_bound"], level=0.0)  # the CPU work is the copy
        off = found.get("optimizer_offload")
        if off is not None and off.level >= 1.0:
            # the parameters copied back each step, the gradients' blocking copies and the CPU
            # optimizer's time are the offload's: one cause, named once (an H100 offload job had
            # h2d_copy_bound primary on PCIe alone, the whole idle counted as the copies')
            for vid in ("h2d_copy_bound", "sync_stall", "host_bound"):
                f = found.get(vid)
                if f is not None and f.level >= 1.0:
                    found[vid] = replace(f, level=0.0)
        thrash = found.get("allocator_thrash")
        if thrash is not None and thrash.level >= 1.0 and cache_rebuilt(sig):
            # a cache rebuilt every step slows the host code under each allocating op (a cudaMalloc
            # each) and its flushes wait on the GPU: that host-side idle is in the allocator's cost,
            # one cause, named once (a ResNet-50 with empty_cache() every step: 26% host-side idle,
            # 0.7% once fixed, host_bound's advice beside it wrong; a ViT's cudaMallocs kept its
            # launching thread busy and the SMs 32% active, launch_bound's look, gone once fixed)
            for vid in ("host_bound", "sync_stall", "launch_bound"):
                f = found.get(vid)
                if f is not None and f.level >= 1.0:
                    found[vid] = replace(f, level=0.0)
        self._causal(found, sig)
        rec = found.get("recompilation")
        if rec is not None and rec.level >= 1.0 and rec.lost_share > 0:
            for vid in ("host_bound", "loop_blocked"):
                f = found.get(vid)
                if f is not None and f.level >= 1.0 and rec.lost_share >= RECOMPILES_EXPLAIN * f.lost_share:
                    # the host's time (or its wait) is mostly the recompiles: one cause, named once
                    found[vid] = replace(f, level=0.0)
        idle = found.get("gpu_idle")
        causes = {vid for vid, f in found.items() if vid not in NOT_A_CAUSE and f.level >= 1.0 and f.lost_share > 0}
        if idle is not None and idle.level >= 1.0 and causes:
            # gpu_idle is the fallback "nothing explains it"; here something does
            found["gpu_idle"] = replace(idle, level=0.0)
            self.explained["gpu_idle"] = causes
        else:
            self.explained.pop("gpu_idle", None)
        return found

    def _causal(self, found: dict[str, Finding], sig) -> None:
        """Every cause-naming finding's lost share is the GPU time it cost (verdicts/causal.py),
        with the gain its fix would bring; on a GPU busy BUSY_GATE of the time or more, a cause
        that holds becomes a note instead of a verdict."""
        for vid, f in list(found.items()):
            if vid in NOT_A_CAUSE or vid in URGENT or vid in NO_GAIN:
                continue
            busy = busy_for(vid, sig)
            loss = causal_loss(vid, f.lost_share, sig)
            gain = fix_gain(loss)
            timed = timed_loss(vid, sig)
            if timed is not None and timed < MIN_TIMED_LOSS and f.level >= 1.0:
                self.notes.append({"id": vid, "text": f"{f.summary}; the GPU does not idle meanwhile (the probe's "
                                                      "GPU spans cover the steps): not on the critical path"})
                found[vid] = replace(f, level=0.0, lost_share=loss, gain=gain)
                continue
            if busy is not None and busy >= BUSY_GATE and vid not in NOT_GATED and f.level >= 1.0:
                self.notes.append({"id": vid, "text": f"{f.summary}; the GPU stays busy {busy * 100:.0f}% of the "
                                                      "time: not on the critical path"})
                found[vid] = replace(f, level=0.0, lost_share=loss, gain=gain)
                continue
            found[vid] = replace(f, lost_share=loss, gain=gain,
                                 evidence={**f.evidence, "fix_gain_pct": round(gain * 100.0, 1)})

    def process(self, store, now: float) -> list[Sample]:
        phase = store.latest(KIND_PHASE, "main")
        if phase is not None and phase.t < now - PHASE_STALE_S:
            phase = None   # the budget processor stopped saying (it failed, or the file is damaged)
        ph = phase.get("phase") if phase is not None else None
        stalled = stalled_now(store, now)
        if ph is not None and ph not in JUDGED and not (ph in (EVALUATION, WARMUP) and stalled):
            # start-up, warm-up, evaluation and the end are not training: no verdict is about them
            # (a loop that stopped is, in warm-up and evaluation too), and the verdicts' states wait
            # for training to resume
            self.evaluations += 1
            return [Sample(now, KIND_VERDICT_PRIMARY, "primary", {
                "id": None, "others": [], "phase": ph, "why": self._why_phase(phase)})]
        if ph is None and not stalled and self.evaluations < PHASE_WAIT_EVALUATIONS and self._phase_coming(store):
            # the stacks or the probe will say what the job is doing (its first window settles a
            # few seconds after attach): judging before then would name a verdict that the
            # warm-up then takes back
            self.evaluations += 1
            return [Sample(now, KIND_VERDICT_PRIMARY, "primary", {
                "id": None, "others": [], "phase": None, "why": "collecting evidence"})]
        window = self.window_s
        if ph is not None and isinstance(phase.get("training_since"), (int, float)):
            window = max(MIN_WINDOW_S, min(window, now - phase.get("training_since")))
        found = self.evaluate(store, now, window)
        self.evaluations += 1
        out: list[Sample] = []
        for vid in sorted(set(found) | set(self.states), key=lambda v: ORDER.get(v, UNKNOWN_ORDER)):
            st = self.states.setdefault(vid, VerdictState())
            f = found.get(vid)
            level = f.level if f is not None else 0.0
            was = st.active
            if not st.active:
                if level >= 1.0:
                    if st.holding_since is None:
                        st.holding_since = now
                    if now - st.holding_since >= ENTER_S - 1e-9:
                        st.active, st.since, st.failing_since = True, st.holding_since, None
                        if st.first_seen is None:
                            st.first_seen = st.holding_since
                else:
                    st.holding_since = None
            else:
                if level < LEAVE_LEVEL:
                    if st.failing_since is None:
                        st.failing_since = now
                    # (a fallback that an active cause now explains leaves at once: its hysteresis is
                    # for its own signal's flapping, and it would hold the cause off the primary
                    # meanwhile; the causes' states are updated before it, in ORDER)
                    explained = any(c in self.states and self.states[c].active for c in self.explained.get(vid, ()))
                    if explained or now - st.failing_since >= LEAVE_S - 1e-9:
                        st.active, st.holding_since, st.failing_since = False, None, None
                else:
                    st.failing_since = None
            if f is not None and (not st.active or f.level >= LEAVE_LEVEL or st.last is None):
                # While an active verdict is on its way out, keep the evidence that made it:
                # the fading finding may describe something else (a straggler that exited).
                st.last = f
            if st.active != was:
                out.append(Sample(now, KIND_VERDICT_CHANGE, vid, {
                    "active": st.active, "title": st.last.title if st.last else vid,
                    "severity": st.last.severity if st.last else None, "since": st.since}))
            if st.active or was:
                out.append(Sample(now, KIND_VERDICT, vid, self._data(st, now)))
        ranked = self.ranked()
        primary = self._steady_primary(ranked, now, phase.get("training_since") if phase is not None else None)
        pdata = {"id": None, "others": [v for v, _ in ranked if primary is None or v != primary[0]],
                 "why": self._why_none(), "phase": ph}
        if primary is not None:
            vid, st = primary
            pdata.update({"id": vid, "title": st.last.title, "summary": st.last.summary,
                          "severity": st.last.severity, "lost_share": round(st.last.lost_share, 3),
                          "gain": None if st.last.gain is None else round(st.last.gain, 3),
                          "confidence": st.last.confidence, "since": st.since})
        if self.notes:
            # once per verdict (each rank's rules add theirs), none for a verdict that is active
            notes, seen = [], {v for v, st in self.states.items() if st.active}
            for n in self.notes:
                if n["id"] not in seen:
                    seen.add(n["id"])
                    notes.append(n)
            if notes:
                pdata["notes"] = notes[:4]
        out.append(Sample(now, KIND_VERDICT_PRIMARY, "primary", pdata))
        return out

    def _steady_primary(self, ranked, now: float, stretch) -> tuple[str, VerdictState] | None:
        """The primary: the top of ``ranked``, except that an active primary stays until another
        verdict has led for PRIMARY_SWITCH_S by PRIMARY_SWITCH_GAIN of lost share -- unless a new
        judged stretch began (the job itself changed)."""
        if not ranked:
            self.primary_id, self.challenger = None, None
            return None
        if stretch != self.stretch:
            self.stretch, self.primary_id, self.challenger = stretch, None, None
            self.stretch_seen = now
        top = ranked[0]
        current = next((item for item in ranked if item[0] == self.primary_id), None)
        if (current is None or top[0] == current[0] or top[0] in URGENT
                or now - self.stretch_seen < PRIMARY_FREE_S):
            # (the first seconds of a judged stretch follow the ranking: the first verdicts to hold
            # are not yet the best-supported ones)
            self.primary_id, self.challenger = top[0], None
            return top
        if current[1].last.lost_share < MIN_PRIMARY_LOSS <= top[1].last.lost_share:
            self.primary_id, self.challenger = top[0], None   # a cause that costs replaces "nothing costs"
            return top
        if top[1].last.lost_share < current[1].last.lost_share + PRIMARY_SWITCH_GAIN:
            self.challenger = None
            return current
        if self.challenger is None or self.challenger[0] != top[0]:
            self.challenger = (top[0], now)
        if now - self.challenger[1] >= PRIMARY_SWITCH_S - 1e-9:
            self.primary_id, self.challenger = top[0], None
            return top
        return current

    def _why_none(self) -> str:
        """Why there is no primary verdict, in words for the UI and the report."""
        sig = self.last_signals
        if sig is None:
            return "no samples yet"
        if sig.pending:
            return "waiting for " + ", ".join(sorted(sig.pending))
        if self.evaluations < NO_GPU_AFTER_EVALUATIONS:
            return "collecting evidence"
        if "nvml" not in sig.have and "probe" not in sig.have:
            return ("no GPU counters and no training steps seen: the verdicts judge GPU training "
                    "jobs (the host and Python panels still apply)")
        budget = sig.facts.get("budget") if isinstance(sig.facts.get("budget"), dict) else None
        if budget and isinstance(budget.get("shares"), dict):
            # never silent on a busy-but-not-saturated GPU: say where the rest of the time went
            return budget_text(budget, below=MIN_PRIMARY_LOSS)
        return "no bottleneck rule holds now"

    @staticmethod
    def _phase_coming(store) -> bool:
        """A source that gives the job's phases (py-spy, else the probe) is running."""
        health = store.latest_of_kind(KIND_HEALTH)
        return any(h is not None and h.get("state") in ("ok", "degraded")
                   for h in (health.get(SOURCE_STACKS), health.get(SOURCE_PROBE)))

    @staticmethod
    def _why_phase(phase) -> str:
        ph = phase.get("phase")
        if ph == STARTUP:
            text = phase.get("startup_text") or "start-up"
            return f"{text} so far (before the first training step): verdicts judge training"
        if ph == EVALUATION:
            return "evaluating (forward passes without optimizer steps): verdicts judge training"
        if ph == WARMUP:
            return ("warming up: the step time has not settled yet (autotuning, allocator growth, lazy init): "
                    "verdicts judge settled training")
        if ph == ENDED:
            return "the job has ended"
        return str(phase.get("label") or ph)

    def ranked(self) -> list[tuple[str, VerdictState]]:
        """Active verdicts, most lost throughput first; small losses count as none, and ties go
        to the more specific rule (ORDER)."""
        active = [(v, st) for v, st in self.states.items() if st.active and st.last is not None]

        def key(item):
            v, st = item
            loss = st.last.lost_share if st.last.lost_share >= MIN_PRIMARY_LOSS else 0.0
            # a cause that costs less than MIN_PRIMARY_LOSS ranks after what describes the GPU's
            # state (a busy GPU with a small wait beside it is GPU-bound, not waiting)
            small_cause = loss == 0.0 and v not in NOT_A_CAUSE
            return (-loss, small_cause, ORDER.get(v, UNKNOWN_ORDER))

        return sorted(active, key=key)

    @staticmethod
    def _data(st: VerdictState, now: float) -> dict:
        f = st.last
        return {"active": st.active, "title": f.title, "severity": f.severity, "confidence": f.confidence,
                "level": round(f.level, 3), "lost_share": round(f.lost_share, 3),
                "gain": None if f.gain is None else round(f.gain, 3), "evidence": f.evidence,
                "advice": f.advice, "summary": f.summary, "since": st.since, "first_seen": st.first_seen,
                "missing": list(f.missing)}
