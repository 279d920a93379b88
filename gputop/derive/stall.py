"""Has the training loop stopped making progress? The stall detector, live and in replay.

A processor (like the budget's) that publishes ``stall``/"job" every second: whether the job is
stalled now, since when, why, and the ranks a snapshot should dump. Two ways to see a stall:

- **no step**: no training step for ``max(min_s, factor x the median step time)``. Steps come
  from the probe (``probe_step`` windows with steps) or, without one, from the stacks: a py-spy
  moment of the main thread in a backward pass or an optimizer step (frame_rules' TRAIN hint);
  the median step time is then the median gap between the starts of those runs. A job of
  several ranks steps when any rank does (synchronous data parallel ranks step together).
- **idle**: the main thread off the CPU in every py-spy sample (a wait its frames name: sleep,
  lock, collective, data, sync, I/O; or Python code the kernel saw on the CPU <
  ``IDLE_MAIN_RUNNING``) and the GPU idle (util.gpu and SM active < ``IDLE_GPU_PCT``, or no GPU
  at all) for ``idle_s`` without a break, and no step taken in that time (a job that steps
  progresses, whatever 60 py-spy samples in the agent's 30 s say). It needs py-spy's stacks.
  A stretch whose waits are mostly for the DataLoader while the job's DataLoader workers are
  busy on the CPU (>= ``WORKERS_BUSY_PCT`` together) is a pipeline at work, not a stop (for
  this test, and for the no-step test where steps come from the stacks): without
  the probe, steps come from the few samples that land in a backward pass, and the agent's 2
  a second can miss them all for 30 s in an input-bound loop (a job that steps called stalled,
  beside CPU load). A hung DataLoader's workers are idle: still caught.

What is not a stall (docs/verdicts.md, "stalled"): start-up before the first step (nothing has
progressed yet: a job that never stepped and never kept its GPU busy is never called stalled),
a job that ended, and an evaluation or a checkpoint (phases.py): those phases take no steps, so
only the idle test judges them (a long evaluation that keeps its thread or GPU busy progresses).
The step clock restarts when such a phase ends. Nor is torch.compile compiling (its frames,
frame_rules' COMPILE hint): a recompile under inductor took 10.2 s on the H200, and 5.5 s more
for its backward, and the loop is compiling, not stopped; the step clock restarts at its last
moment seen compiling (the recompilation verdict names the cost). A compile that hangs with
the main thread waiting and the GPU idle is still caught by the idle test.

The snapshot (every thread's stack, the GPU's state) is taken live by
``gputop.sources.stall_snapshot`` when this sample turns stalled; ``describe_snapshot`` names
what each rank's threads are doing for the Stall view and the report.
"""

from __future__ import annotations

import math
import statistics

from gputop.catalogue import (KIND_GPU, KIND_PHASE, KIND_PROBE_STEP, KIND_PROC, KIND_STACKS, KIND_STALL,
                               KIND_STALL_SNAPSHOT, KIND_TARGET)
from gputop.derive import frame_rules as fr
from gputop.derive import phases as ph
from gputop.derive.budget import BLOCKED, COLLECTIVE, CPU, CPU_WAIT, DATA, IO, SYNC, owner
from gputop.derive.budget_processor import judged_process
from gputop.derive.moments import MomentBuilder, chosen_gpus
from gputop.derive.ranks import rank_table
from gputop.derive.stacks_window import stacks_window_s
from gputop.model import Sample
from gputop.sources.procfs import ROLE_WORKER

STALL_MIN_S = 10.0          # no step for at least this long ...
STALL_STEP_FACTOR = 20.0    # ... and for 20x the median step time (a slow step is not a stall)
STALL_IDLE_S = 30.0         # main thread and GPU both idle this long without a break
IDLE_MAIN_RUNNING = 5.0     # % of the main thread's time on the CPU below which it is idle or waiting
IDLE_GPU_PCT = 5.0          # util.gpu / SM active below which the GPU is idle
BUSY_GPU_PCT = 20.0         # a GPU seen this busy means the job was making progress once
HISTORY_S = 120.0           # the median step time is taken over this much of the past (probe)
MOMENTS_S = 40.0            # py-spy moments looked at each second (stack steps, the idle test)
SAY_EVERY_S = 1.0
WORKERS_BUSY_PCT = 20.0     # DataLoader workers' CPU, together, that makes a wait for data progress
WORKERS_FRESH_S = 45.0      # ... read this recently (the agent reads child processes every ~20 s: two reads;
                            # a worker that exited busy, at an epoch's end, stops counting then)
LOADING_MAX_S = 300.0       # ... for this long at most: a worker spinning forever is a hang (at 2 samples a
                            # second, a loop with 1% of its time in backward shows one in 5 min 99.8% of the time)
STEP_SLACK_S = 2.0          # a step this far into an idle stretch is one the stretch began after
                            # (a probe window ends up to 1 s after its steps); a later one is progress
_NUM = (int, float)
_PAUSED = (ph.EVALUATION, ph.CHECKPOINTING)   # phases without steps: the step clock waits
_WAITING = (DATA, SYNC, BLOCKED, COLLECTIVE, IO)   # what a main thread named by its frames waits in


def _num(v) -> float | None:
    """A finite number, else None (a bool, a string, inf from a damaged file)."""
    if type(v) not in _NUM:
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


class StallDetector:
    name = "stall"
    produces = (KIND_STALL,)
    interval_s = 1.0

    def __init__(self, min_s: float = STALL_MIN_S, factor: float = STALL_STEP_FACTOR,
                 idle_s: float = STALL_IDLE_S) -> None:
        self.min_s, self.factor, self.idle_s = min_s, factor, idle_s
        self.reset()

    def reset(self) -> None:
        self.builders: dict[str, MomentBuilder] = {}
        self.last_step: dict[str, float] = {}    # pid -> time of its newest step seen
        self.step_s: dict[str, float] = {}       # pid -> median step time (s)
        self.progressed = False                  # a step, or a busy GPU, was ever seen
        self.paused_t = float("-inf")            # last time the job was in a phase without steps
        self.idle_since: float | None = None
        self.since: float | None = None          # when the current stall began (None: not stalled)

    # -- steps -----------------------------------------------------------------------------
    def _probe_steps(self, store, pid: str, now: float) -> bool:
        """Steps from the probe's windows of the last HISTORY_S; False when it has none (then
        the stacks' steps count)."""
        wins = store.window(KIND_PROBE_STEP, now - HISTORY_S).get(pid, [])
        # (this runs every second over 120 s of windows: data.get, without Sample.get's call)
        with_steps = [w for w in wins if type(n := w.data.get("steps")) is int and n > 0]
        if with_steps:
            self.last_step[pid] = max(self.last_step.get(pid, float("-inf")), with_steps[-1].t)
            p50 = [v / 1000.0 for w in with_steps if (v := _num(w.data.get("step_ms_p50"))) is not None and v > 0]
            if p50:
                self.step_s[pid] = statistics.median(p50)
        return bool(wins)

    def _moments(self, store, pid: str, now: float, gpus: list[str]) -> list:
        b = self.builders.setdefault(pid, MomentBuilder(max_windows=64))
        # enough to see an idle stretch of idle_s and a few steps; a longer look costs every second
        return b.moments(store, pid, now - max(MOMENTS_S, self.idle_s + 10.0), now, gpus)[0]

    def _stack_steps(self, pid: str, moments: list) -> None:
        if pid in self.step_s:
            # the step time is known: only the newest training moment can move the last step
            # (a pid's moments are in time order), not a walk over its 40 s and more every second
            for m in reversed(moments):
                if m.naming.hint == fr.TRAIN:
                    if m.t > self.last_step.get(pid, float("-inf")):
                        self.last_step[pid] = m.t
                    break
            return
        starts, prev = [], False
        for m in moments:
            train = m.naming.hint == fr.TRAIN
            if train and not prev:
                starts.append(m.t)
            if train:
                self.last_step[pid] = max(self.last_step.get(pid, float("-inf")), m.t)
            prev = train
        if len(starts) >= 3 and pid not in self.step_s:
            self.step_s[pid] = statistics.median(b - a for a, b in zip(starts, starts[1:]))

    # -- idle ------------------------------------------------------------------------------
    @staticmethod
    def _waiting(m) -> bool:
        """A py-spy moment of the main thread off the CPU: in a wait its frames name (a sleep, a
        lock, a collective, data, a sync, I/O), or Python code the kernel saw mostly off the CPU."""
        if m.naming.cat in _WAITING:
            return True
        if m.split is not None:
            return m.split.shares.get(CPU, 0.0) + m.split.shares.get(CPU_WAIT, 0.0) < IDLE_MAIN_RUNNING / 100.0
        return False

    @staticmethod
    def _loading(store, pid: str, ms: list, since: float, now: float) -> bool:
        """The stretch's waits are mostly for the DataLoader and its workers (the processes of
        role ``dataloader_worker`` whose parent is ``pid``) are busy on the CPU: the pipeline is
        at work (the module's docstring)."""
        stretch = [m for m in ms if m.t >= since]
        if not stretch or sum(1 for m in stretch if m.naming.cat == DATA) < len(stretch) / 2:
            return False
        if now - since > LOADING_MAX_S:
            return False   # (a worker spinning forever in __getitem__ is busy too: a hang, caught then)
        # each worker's latest CPU reading in the stretch, not its mean over it: workers that were
        # busy and then hung must not hold the stall off for the rest of the stretch (and the
        # agent reads child processes only every ~20 s: a short recent window can hold none)
        procs = store.window(KIND_PROC, since)
        # (a forkserver's workers are the fork server's children, and it is the main process's)
        parent_of = {str(key): str(series[-1].get("ppid")) for key, series in procs.items() if series}
        busy = 0.0
        for series in procs.values():
            mine = [s for s in series if s.get("role") == ROLE_WORKER and now - WORKERS_FRESH_S <= s.t <= now
                    and type(s.get("cpu_pct")) in _NUM
                    and pid in (str(s.get("ppid")), parent_of.get(str(s.get("ppid"))))]
            if mine:
                busy += mine[-1].get("cpu_pct")
        return busy >= WORKERS_BUSY_PCT

    def _idle_since(self, store, now: float, moments_of: dict[str, list], gpus: list[str],
                    window: float) -> float | None:
        """Since when every judged main thread has waited and the GPU has been idle (None: not now).
        From the py-spy moments (each at its own time), not the 10 s thread-state shares."""
        since = float("-inf")
        for ms in moments_of.values():
            if not ms or ms[-1].t < now - stacks_late_s(window) or not self._waiting(ms[-1]):
                return None
            start = ms[-1].t
            for m in reversed(ms):
                if not self._waiting(m):
                    break
                start = m.t - m.dt / 2
            since = max(since, start)
        if not moments_of:
            return None
        series = store.window(KIND_GPU, now - HISTORY_S)
        rows = sorted((s.t, max(vals)) for k in gpus for s in series.get(k, ())
                      if (vals := [v for f in ("util_gpu", "sm_active") if (v := _num(s.get(f))) is not None]))
        if any(v >= BUSY_GPU_PCT for _t, v in rows):
            self.progressed = True
        for t, v in reversed(rows):   # the GPU's own idle stretch (no GPU counters: the thread alone)
            if v >= IDLE_GPU_PCT:
                since = max(since, t)
                break
        if rows and rows[-1][1] >= IDLE_GPU_PCT:
            return None
        return since

    # -- the processor -----------------------------------------------------------------------
    def process(self, store, now: float) -> list[Sample]:
        ranks = [r for r in rank_table(store, now) if r.get("state") != "exited" and r.get("pid") is not None]
        if ranks:
            pids = [str(r["pid"]) for r in ranks]
            rank_of = {str(r["pid"]): r.get("rank") for r in ranks}
            gpus = chosen_gpus(store, sorted({str(r["gpu"]) for r in ranks if r.get("gpu") is not None}) or None)
        else:
            pid, only = judged_process(store, now)
            if pid is None:
                return []
            pids, rank_of, gpus = [pid], {pid: None}, chosen_gpus(store, only)
        moments_of, seen_until, stacks_seen, probed_of = {}, {}, {}, {}
        window = stacks_window_s(store)
        for pid in pids:
            probed = probed_of[pid] = self._probe_steps(store, pid, now)
            moments_of[pid] = self._moments(store, pid, now, gpus)
            seen = _stacks_seen_until(store, pid)
            stacks_seen[pid] = min(seen, now) if seen is not None else now
            seen_until[pid] = now if probed else stacks_seen[pid]
            if not probed:
                self._stack_steps(pid, moments_of[pid])
        phase = store.latest(KIND_PHASE, "main")
        phase_name = phase.get("phase") if phase is not None else None
        target = next(iter(store.latest_of_kind(KIND_TARGET).values()), None)
        ended = phase_name == ph.ENDED or (target is not None and target.get("state") == "exited")
        if phase_name in _PAUSED:
            self.paused_t = now
        for pid in pids:
            # the newest moment compiling since the clock last restarted (only that stretch is walked)
            since = max(self.last_step.get(pid, float("-inf")), self.paused_t)
            for m in reversed(moments_of[pid]):
                if m.t <= since:
                    break
                if m.naming.hint == fr.COMPILE:
                    self.paused_t = m.t
                    break
        steps = [self.last_step[p] for p in pids if p in self.last_step]
        last_step = max(steps) if steps else None
        # how long no rank has stepped, each on the clock of what its steps come from (a job of
        # several ranks steps when any rank does): the probe's windows come every second, py-spy's
        # only when a window ends, so a rank stepped from its stacks is judged up to its newest
        # window, not up to now (the agent's 20 s windows would otherwise look like a stop)
        quiet_of = {p: seen_until[p] - max(self.last_step[p], self.paused_t) for p in pids if p in self.last_step}
        self.progressed = self.progressed or last_step is not None
        medians = [self.step_s[p] for p in pids if p in self.step_s]
        median = statistics.median(medians) if medians else None
        threshold = max(self.min_s, self.factor * median) if median is not None else self.min_s
        if quiet_of and min(quiet_of.values()) >= threshold and not any(probed_of[p] for p in quiet_of) and any(
                self._loading(store, p, moments_of[p], max(self.last_step[p], self.paused_t), now) for p in quiet_of):
            # a rank stepped from its stacks whose quiet stretch is a wait for data with its workers
            # busy is loading, not stopped (the agent's 2 samples a second can miss every backward
            # of an input-bound loop for longer than the threshold, as they can the idle test's
            # 30 s; the probe counts steps and needs no such allowance); its peers wait for it in
            # their collectives, so the job is loading (synchronous ranks step together); not where a
            # rank's probe counts its steps and says it has stopped
            quiet_of = {}
        quiet = list(quiet_of.values())
        self.idle_since = self._idle_since(store, now, moments_of, gpus, window)
        if self.idle_since is not None and any(self._loading(store, p, moments_of[p], self.idle_since, now)
                                               for p in pids):
            self.idle_since = None

        reason = None
        if not ended and self.progressed:
            if quiet and phase_name not in _PAUSED and min(quiet) >= threshold:
                reason = "no_step"
            # idle as long as the stacks have shown it (up to the newest window's end), not up
            # to now: what the thread does after its newest window nobody has seen yet
            # ... and no step taken in that time: a job that steps progresses, however its main
            # thread looks in py-spy's samples (2 a second in the agent: 60 in 30 s can all land in
            # a data wait or the GIL while the probe counts steps)
            elif (self.idle_since is not None and min(stacks_seen.values()) - self.idle_since >= self.idle_s
                  and (last_step is None or last_step <= self.idle_since + STEP_SLACK_S)):
                reason = "idle"
        if reason is None:
            self.since = None
        elif self.since is None:
            self.since = (last_step if reason == "no_step" else self.idle_since)
            if reason == "no_step" and self.paused_t > last_step:
                self.since = self.paused_t
        data = {
            "stalled": reason is not None, "reason": reason, "since": _r(self.since),
            "last_step_t": _r(last_step), "median_step_s": _r(median, 4), "threshold_s": _r(threshold),
            "idle_since": _r(self.idle_since), "idle_s": self.idle_s, "phase": phase_name,
            "ended": ended, "gpus": list(gpus),
            "ranks": [{"pid": p, "rank": rank_of.get(p), "last_step_t": _r(self.last_step.get(p)),
                       "median_step_s": _r(self.step_s.get(p), 4)} for p in pids],
        }
        return [Sample(now, KIND_STALL, "job", data)]


def stacks_late_s(window: float) -> float:
    """How old the newest py-spy sample may be and still say what a thread does now (the next
    window may land that late): 1.5 windows and 3 s (a loaded machine starts py-spy late): 6 s
    at the UI's first 2 s windows, 10.5 s at its steady 5 s ones, 33 s at the agent's 20 s."""
    return 1.5 * window + 3.0


def _stacks_seen_until(store, pid: str) -> float | None:
    """Up to when py-spy has looked at ``pid``: the end of its newest window (None: never). When
    the windows stop coming (py-spy failing, its health says so) the clock stops with them: a
    job nobody can see step is not called stalled for that (it was, before: a critical verdict
    for a sampler's failure)."""
    s = store.latest(KIND_STACKS, pid)
    return s.t if s is not None else None


def _r(x, nd: int = 2):
    return None if x is None else round(x, nd)


# -- the snapshot, in words (the Stall view and the report) ------------------------------------

def _frames(thread: dict) -> list[tuple[str, str, object, str]]:
    """A snapshot thread's frames, innermost first, as (function, file, line, path); a value
    of the wrong shape (a damaged or foreign file) is left out."""
    out = []
    for f in thread.get("frames") if isinstance(thread.get("frames"), list) else []:
        if isinstance(f, list) and len(f) >= 3:
            path = f[3] if len(f) > 3 and isinstance(f[3], str) else str(f[1])
            out.append((str(f[0]), str(f[1]), f[2] if type(f[2]) is int else "?", path))
    return out


def _frame_text(f: tuple) -> str:
    return f"{f[0]} ({f[1].rsplit('/', 1)[-1]}:{f[2]})"


def where(thread: dict) -> str | None:
    """The innermost frame of the job's own code in one thread of a snapshot (outside torch,
    the standard library and gputop's probe when there is one), as "func (file:line)"."""
    frames = _frames(thread)
    for f in frames:
        if owner(f[3]) in ("user", "library") and "/gputop/probe/" not in f[3]:
            return _frame_text(f)
    return _frame_text(frames[0]) if frames else None


def collective(thread: dict) -> str | None:
    """The torch.distributed collective the thread is in, from its frames (frame_rules)."""
    frames = _frames(thread)
    rows = [[name, path, line] for name, _file, line, path in frames]
    # frame_rules reads a stack as indices into a frame table, root first
    cat, _why = fr.classify(rows, list(range(len(rows)))[::-1], None)
    if cat != COLLECTIVE:
        return None
    return next((name for name, _f, _l, path in frames if "torch/distributed/" in path), "collective")


def _dicts(v) -> list[dict]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def describe_snapshot(data: dict) -> dict:
    """A snapshot sample's data -> what the view and the report print: per rank its main
    thread's place, the collective it is in and since when (its last step), and every thread's
    innermost frame of the job's code."""
    threads = _dicts(data.get("threads"))
    ranks = []
    for r in sorted(_dicts(data.get("ranks")), key=lambda r: r.get("rank") if type(r.get("rank")) is int else 1 << 30):
        mine = [t for t in threads if str(t.get("pid")) == str(r.get("pid"))]
        main = next((t for t in mine if t.get("main") is True), mine[0] if mine else None)
        ranks.append({
            "pid": r.get("pid"), "rank": r.get("rank"), "error": r.get("error"),
            "where": where(main) if main else None, "collective": collective(main) if main else None,
            "since": _num(r.get("last_step_t")),
            "threads": [{"tid": t.get("tid"), "name": t.get("name"), "active": t.get("active") is True,
                         "main": t is main, "where": where(t), "collective": collective(t)} for t in mine],
        })
    gpus = data.get("gpus") if isinstance(data.get("gpus"), dict) else {}
    return {"t": _num(data.get("t")), "since": _num(data.get("since")), "reason": data.get("reason"),
            "last_step_t": _num(data.get("last_step_t")), "median_step_s": _num(data.get("median_step_s")),
            "gpus": {str(k): g for k, g in gpus.items() if isinstance(g, dict)}, "ranks": ranks,
            "dump_ms": _num(data.get("dump_ms"))}


def snapshot_lines(data: dict, width: int = 100) -> list[str]:
    """The snapshot as text: the report's section and the Stall view share these lines."""
    d = describe_snapshot(data)
    since = d["since"]
    out = [f"stalled at {_clock(d['t'])}" + (f", no progress since {_clock(since)}" if since is not None else "")
           + f" ({'no step' if d['reason'] == 'no_step' else 'main thread and GPU idle'})"]
    if d["last_step_t"] is not None:
        med = d["median_step_s"]
        out.append(f"last step at {_clock(d['last_step_t'])}" + (f"; median step {med * 1000:.0f} ms" if med else ""))
    for key, g in sorted(d["gpus"].items()):
        out.append(f"GPU {key}: " + gpu_text(g))
    for r in d["ranks"]:
        head = f"rank {r['rank']}" if r["rank"] is not None else "process"
        line = f"{head} (pid {r['pid']}): "
        if r["error"]:
            out.append(line + f"no stacks: {r['error']}")
            continue
        line += f"in {r['collective']}() " if r["collective"] else ""
        line += f"at {r['where']}" if r["where"] else "no main thread"
        if r["since"] is not None:
            line += f" since {_clock(r['since'])} (its last step)"
        out.append(line)
        for t in r["threads"]:
            state = "active" if t["active"] else "idle/waiting"
            name = f"{t['name'] or t['tid']}{' (main)' if t['main'] else ''}"
            out.append(f"    {name} [{state}]: {t['where'] or '-'}"[:width])
    return out


def gpu_text(g: dict) -> str:
    parts = []
    util = _num(g.get("util_gpu"))
    if util is not None:
        parts.append(("kernels running" if util > 0 else "no kernel running") + f" (util {util:.0f}%)")
    sm = _num(g.get("sm_active"))
    if sm is not None:
        parts.append(f"SM active {sm:.0f}%")
    used, total = _num(g.get("mem_used")), _num(g.get("mem_total"))
    if used is not None:
        parts.append(f"memory {used / 2**30:.1f} GiB" + (f" of {total / 2**30:.0f} GiB" if total else ""))
    return ", ".join(parts) or "no readings"


def _clock(t) -> str:
    t = _num(t)
    if t is None or abs(t) > 1e9:
        return "?"
    t = max(0, int(t))
    return f"{t // 3600}:{t % 3600 // 60:02d}:{t % 60:02d}" if t >= 3600 else f"{t // 60}:{t % 60:02d}"


def snapshots(store_or_samples) -> list[Sample]:
    """Every snapshot sample in a list of samples (the report) or a store (the view)."""
    if isinstance(store_or_samples, list):
        return [s for s in store_or_samples if s.kind == KIND_STALL_SNAPSHOT]
    return list(store_or_samples.window(KIND_STALL_SNAPSHOT, float("-inf")).get("job", []))


# -- the report's section -----------------------------------------------------------------------
REPORT_SNAPSHOTS = 10   # snapshots the report keeps (the first ones: the first stall is the cause)


def report_section(samples: list[Sample], report: dict | None = None) -> dict | None:
    """``gputop report``'s "stall" section: every snapshot in the recording, in words."""
    shots = [s for s in samples if s.kind == KIND_STALL_SNAPSHOT and isinstance(s.data, dict)]
    if not shots:
        return None
    return {"count": len(shots),
            "snapshots": [{**describe_snapshot(s.data), "lines": snapshot_lines(s.data)}
                          for s in shots[:REPORT_SNAPSHOTS]]}


def report_lines(section: dict) -> list[str]:
    n = section.get("count") or 0
    out = [f"stalls: {n} snapshot{'s' if n != 1 else ''} of the loop stopped (py-spy dump of every rank, "
           "the job not paused)"]
    for shot in section.get("snapshots") or []:
        out.extend("  " + line for line in shot.get("lines") or [])
    if n > REPORT_SNAPSHOTS:
        out.append(f"  ... and {n - REPORT_SNAPSHOTS} more")
    return out
