"""From raw samples to *moments*: each py-spy sample of the main thread, placed in time, named
by its frames, and joined with the GPU's busy fraction at that moment and the kernel's view of
the thread in that second. The time budget (gputop.derive.budget), the stall finder
(gputop.derive.stalls) and the phases (gputop.derive.phases) read moments.

A stacks sample with ``seq`` (the samples' order) gives each sample its own moment; an older
recording without it spreads the window's samples evenly and gives them the window's mean GPU
busy, which is right on average and says nothing about bursts.

**At step resolution, with the probe.** A GPU busy sample covers >= 100 ms; a step is often
shorter, so the join spreads a step's idle time over whatever the main thread did in that
period. The probe measures where it falls: its CUDA events time each step's GPU span from the
moment the batch arrived, so ``1 - GPU span / step time`` of its ~1 s window is the share of
wall time the GPU idled *before the batch was there* -- the data wait's cost. Within each probe
window that idle is given to the moments in ``next(DataLoader)``, the rest of the window's idle
(the GPU counters') to the other moments in proportion to what the join gave them
(``_calibrate``): a main thread that waits for the GPU in a copy (it queues behind the previous
step) is no longer charged the data wait's idle time. Two things the probe measures better than
the samples: its timed share of the window in ``next(DataLoader)``, so the moments there stand
for that share (a weight per moment; at py-spy's rate a window holds a handful of them), and the
idle before the batches, timed on the GPU by its events: where the counters' smeared average
gave the window less idle in all, the window gets the probe's. (On the corpus's DataLoader jobs
the budget's data share now agrees with the probe's split within 5 points on 20 of 20
recordings; 18 before.)

**After a device sync, without the probe.** A main thread inside ``.item()`` or ``synchronize()``
waits for the GPU, so the GPU is busy then; once it returns, the GPU's queue is empty, and it
stays idle until the thread launches again. So a sleep, lock, socket or file wait that follows a
sync with nothing but such waits between them (in the samples' order) keeps the GPU idle for
sure. The join, smeared over NVML's averaging period, gives those waits only part of that idle
and the sync itself the rest (a loop that .item()s then POSTs its metrics for 0.3 s every second,
H100: 13% blocked and 13% "sync" where its fix gained 38%). ``_drain_waits`` moves idle
time onto them, taken from the syncs first, then from the window's other moments, so the
window's idle time is kept exactly. A sync is a frame or line the rules know (``.item()``,
``synchronize()``), or, with the probe, a line where it counted implicit device syncs
(``sync_sites``): a pageable batch copy in Accelerate's ``send_to_device`` waits for the
previous step while CUDA spins on the CPU, so only the probe's count tells it from Python code
(the corpus's accelerate_log_sleep: the lock wait after that copy was its cost, 44% by its fix).

**The host code after a sync.** ``_mark_relaunch`` marks the "Python code" moments that follow
a sync (or open the window) with no wait of another kind between: the relaunch that a sync leaves
the GPU waiting for, sync_stall's cost with the syncs themselves (the budget's
``cpu_after_sync``). Host code after a file, sleep, DataLoader or collective wait is that wait's
relaunch.

**A named blocking wait, anywhere.** A main thread in sleep, a lock, a queue, select, a socket or
a child process launches nothing; a wait that py-spy samples at 20-50 ms outlasts the GPU's queue
in a loop that syncs every few steps. The smeared join gave such waits only the window's average
idle when no sampled sync came before them: py-spy rarely catches a ``.item()`` that returns in
microseconds. nvidia-smi run after ``loss.item()`` every 5 steps (the unseen corpus,
nvidia_smi_in_loop, H100): 11% of the main thread's samples, 3% of the budget; its fix gained
17%. So these waits are drained wherever they fall (file waits still only after a sync: drained
everywhere, a Trainer checkpoint's writes took the idle of the steps around them, +127% predicted
against +96% measured).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from functools import lru_cache

from gputop.catalogue import KIND_GPU, KIND_GPU_INFO, KIND_PROBE_STEP, KIND_PROBE_SYNC, KIND_STACKS, KIND_THREAD_KERNEL
from gputop.derive.budget import (BLOCKED, COLLECTIVE, DATA, GPU_SAMPLE_MAX_S, IO, SYNC, UNKNOWN, Budget, KernelSplit,
                                  Moment, Naming, budget_of, name_stack)

SETTLE_S = 3.0   # a py-spy window's moments are final once the GPU and kernel samples after it are in
MAX_SAMPLES = 20000  # samples of one thread in one py-spy window (20 Hz x 2 s is 40; a file may claim more)
_NAMED_OFF = (DATA, SYNC, BLOCKED, COLLECTIVE, IO)
_NUM = (int, float)


def chosen_gpus(store, only: list[str] | None = None, fallback: list[str] | None = None) -> list[str]:
    """The GPUs that judge the job: one rank's, else those the target uses, else those the
    user chose, else all watched, else ``fallback`` (default: every GPU with samples). The one
    choice the time budget and the verdict signals both make."""
    infos = store.latest_of_kind(KIND_GPU_INFO)
    if only:
        return list(only)
    for by in ("target", "user"):
        keys = [k for k, s in infos.items() if s.get("chosen_by") == by]
        if keys:
            return keys
    keys = [k for k, s in infos.items() if s.get("watched") is not False]
    return keys or (list(fallback) if fallback is not None else list(store.latest_of_kind(KIND_GPU)))


class GpuBusy:
    """The GPUs' busy fraction as a step function of time: each sample covers the time since
    the one before it. ``source``: "util.gpu", "gpm" (SM active standing in) or None."""

    def __init__(self, store, since: float, keys: list[str], lines_since: float | None = None):
        """``lines_since``: the step function is needed from then on only (the windows not yet
        cached: the stall finder looks at 40 s and more every second, and building them all was most
        of a GpuBusy's cost); which field judges and whether there are readings at all are still
        decided over everything since ``since``, so the moments are those of the whole look."""
        series = store.window(KIND_GPU, since)
        self.lines: list[tuple[list[float], list[float]]] = []
        self.source = None
        # Time, not space: util.gpu is the share of time some kernel ran, which is what "the GPU
        # waited for the host" is about; GPM's SM active also counts SMs left empty by small
        # kernels (HF Trainer on GPT-2: util.gpu 70-78% while SM active read 60-66%, H200), which
        # is not host time. SM active stands in only where util.gpu is missing.
        util = any(type(s.get("util_gpu")) in _NUM for k in keys for s in series.get(k, ()))
        fieldname, scale = ("util_gpu", 0.01) if util else ("sm_active", 0.01)
        lo = since if lines_since is None else max(since, lines_since)
        for k in keys:
            ts, vs = [], []
            for s in series.get(k, ()):
                if s.t < lo:
                    continue
                v = s.data.get(fieldname)
                if type(v) in _NUM:
                    ts.append(s.t)
                    vs.append(min(1.0, max(0.0, v * scale)))
            if ts:
                self.lines.append((ts, vs))
        # readings anywhere in the look (not only since lines_since): whether moments are joined
        self.has_lines = bool(self.lines) or (lo > since and any(
            type(s.data.get(fieldname)) in _NUM for k in keys for s in series.get(k, ())))
        if self.has_lines:
            self.source = "util.gpu" if util else "gpm"
        self.newest = max((ts[-1] for ts, _ in self.lines), default=None)

    def at(self, t: float) -> float | None:
        vals = []
        for ts, vs in self.lines:
            i = bisect.bisect_left(ts, t)
            if i < len(ts) and ts[i] - t <= GPU_SAMPLE_MAX_S:
                vals.append(vs[i])
        return sum(vals) / len(vals) if vals else None

    def mean(self, t0: float, t1: float) -> float | None:
        vals = []
        for ts, vs in self.lines:
            i, j = bisect.bisect_left(ts, t0), bisect.bisect_right(ts, t1)
            if j > i:
                vals.append(sum(vs[i:j]) / (j - i))
        return sum(vals) / len(vals) if vals else None


def main_thread(data, pid: str) -> dict | None:
    threads = data.get("threads")
    if not isinstance(threads, list):
        return None
    by_name = None
    for th in threads:
        if not isinstance(th, dict):
            continue
        if str(th.get("tid")) == pid:
            return th
        if th.get("name") == "MainThread":
            by_name = th
    return by_name


def naming_of(table: list[tuple], stack: list[int], code: dict) -> Naming:
    """``name_stack`` of one stack, computed once per distinct stack: the same frames (name,
    file, line) and innermost line's text always name it the same, whichever window, process or
    builder it came from. Each py-spy window has its own frame table, so before this every
    window named its stacks again: after a replay's seek that was most of the catch-up (the
    budget's and the stall finder's first run name every window of the 120 s fed)."""
    n = len(table)
    key = tuple(table[i] if 0 <= i < n else None for i in stack)
    leaf = code.get(str(stack[-1]))
    return _named(key, leaf if isinstance(leaf, str) else None)


@lru_cache(maxsize=8192)
def _named(key: tuple, leaf_code: str | None) -> Naming:
    # an index outside the window's table is kept as -1 at its place: name_stack skips it there
    frames = [f for f in key if f is not None]
    stack, j = [], 0
    for f in key:
        stack.append(-1 if f is None else j)
        j += f is not None
    return name_stack(frames, stack, leaf_code)


def sync_sites(data: dict) -> frozenset:
    """The lines where the probe counted implicit device syncs (a probe_sync sample's ``lines``:
    ["file:line", count], the first frame outside torch, as ``Naming.site`` names a stack)."""
    lines = data.get("lines") if isinstance(data, dict) else None
    return frozenset(x[0] for x in lines if isinstance(x, list) and len(x) == 2 and isinstance(x[0], str)
                     and type(x[1]) is int and x[1] > 0) if isinstance(lines, list) else frozenset()


class _Cached:
    """A settled py-spy window's moments, and their Budget once one is asked for; ``sites``: the
    probe's sync lines they were built with (a window is built again when those grow)."""
    __slots__ = ("sample", "moments", "sites", "_budget")

    def __init__(self, sample, moments: list[Moment], sites: frozenset = frozenset()):
        self.sample = sample
        self.moments = moments
        self.sites = sites
        self._budget: Budget | None = None

    def budget(self) -> Budget:
        if self._budget is None:
            self._budget = budget_of(self.moments)
        return self._budget


class MomentBuilder:
    """Moments of one process's main thread, built once per py-spy window and cached."""

    def __init__(self, max_windows: int = 256):
        self._cache: OrderedDict = OrderedDict()   # id(stacks sample) -> _Cached
        self.with_gpu = False
        self.max_windows = max_windows

    def reset(self) -> None:
        self._cache.clear()
        self.with_gpu = False

    def moments(self, store, pid: str, since: float, now: float, gpus: list[str]) -> tuple[list[Moment], str | None]:
        """The moments since ``since``, oldest first, and the GPU source that judged them."""
        return self._moments(store, pid, since, now, gpus, None)

    def moments_and_budget(self, store, pid: str, since: float,
                           now: float, gpus: list[str]) -> tuple[list[Moment], str | None, Budget]:
        """``moments``, and the Budget of them: a settled window wholly inside the look gives its
        own budget, made once and merged, not its moments added again each second. The window
        budget looks at 20-40 s of moments every second, and adding each one again was the
        largest part of the budget processor's cost, which the live session and the recorder's
        summary chain (session/summary_chain.py) both pay. The seconds are the same sums taken
        in another order: equal to the float rounding (the shares are rounded to 4 digits)."""
        budget = Budget()
        moments, source = self._moments(store, pid, since, now, gpus, budget)
        return moments, source, budget

    def _moments(self, store, pid: str, since: float, now: float, gpus: list[str],
                 budget: Budget | None) -> tuple[list[Moment], str | None]:
        # (a rank's windows come from py-spy's --subprocesses runs: not "main", still its own)
        stacks = store.window(KIND_STACKS, since).get(pid, [])
        cache = self._cache
        # the GPU's step function is needed for the windows not cached yet only (from 2 s before
        # the earliest of them begins: a window's moments look up the readings at and after them)
        # the probe's sync lines (sent when they change, every ~2 s at most): a window built before a
        # line was known is built again with it, so its waits after that sync are drained (the
        # session budget keeps what such a window gave when it was judged: one window's worth)
        sync = store.latest(KIND_PROBE_SYNC, pid)
        sites = sync_sites(sync.data) if sync is not None else frozenset()
        hits = [hit if (hit := cache.get(id(s))) is not None and hit.sample is s and hit.sites == sites else None
                for s in stacks]
        fresh = [s for s, hit in zip(stacks, hits) if hit is None]
        lines_since = None
        for s in fresh:
            t0, dur = s.data.get("t0"), s.data.get("dur_s")
            t0 = t0 if type(t0) in _NUM else (s.t - dur if type(dur) in _NUM else None)
            if t0 is None:
                lines_since = None   # (a malformed window: build them all, as before)
                break
            lines_since = t0 - 2.0 if lines_since is None else min(lines_since, t0 - 2.0)
        else:
            if not fresh:
                lines_since = now   # every window cached: readings are not looked up at all
        busy = GpuBusy(store, since - 2.0, gpus, lines_since)
        self.with_gpu = self.with_gpu or busy.has_lines   # once a session has GPU counters, it has them
        kernel = store.window(KIND_THREAD_KERNEL, since - 2.0).get(pid, [])
        probe = store.window(KIND_PROBE_STEP, since - 2.0).get(pid, []) if fresh else []
        out: list[Moment] = []
        for s, hit in zip(stacks, hits):   # (as found above: caching below may evict an older hit)
            if hit is not None:
                ms = hit.moments
                if ms and ms[0].t >= since:   # (a window's moments are in time order)
                    out.extend(ms)
                    if budget is not None:
                        budget.merge(hit.budget())
                    continue
                ms = [m for m in ms if m.t >= since]
            else:
                ms = self._window(s, pid, busy, kernel, probe, sites)
                settled = s.t <= now - SETTLE_S or (busy.newest is not None and busy.newest >= s.t and
                                                    any(k.t >= s.t for k in kernel) and
                                                    (not probe or probe[-1].t >= s.t))
                if settled:
                    self._cache[id(s)] = _Cached(s, ms, sites)
                    while len(self._cache) > self.max_windows:
                        self._cache.popitem(last=False)
                if not ms or ms[0].t < since:
                    ms = [m for m in ms if m.t >= since]
            out.extend(ms)
            if budget is not None:
                for m in ms:
                    budget.add(m)
        return out, busy.source

    def _window(self, s, pid: str, busy: GpuBusy, kernel: list, probe: list | None = None,
                sites: frozenset = frozenset()) -> list[Moment]:
        data = s.data
        th = main_thread(data, pid)
        frames, code = data.get("frames"), data.get("code") or {}
        t0, dur = data.get("t0"), data.get("dur_s")
        if th is None or not isinstance(frames, list) or type(t0) not in _NUM or type(dur) not in _NUM or dur <= 0:
            return []
        if not isinstance(code, dict):
            code = {}
        frames = [f if isinstance(f, list) and len(f) >= 3 and isinstance(f[0], str) and isinstance(f[1], str)
                  else ["?", "", 0] for f in frames]
        stacks = []
        entries = th.get("stacks")
        for entry in entries if isinstance(entries, list) else []:
            try:
                count, stack = entry
                stacks.append((int(count), [int(i) for i in stack]))
            except (TypeError, ValueError, OverflowError):
                stacks.append((0, []))
        unknown = Naming("unknown", None, None, "unknown", None)
        table = [(f[0], f[1], f[2] if type(f[2]) is int else f"{f[2]}") for f in frames]
        names = [naming_of(table, st, code) if st else unknown for _c, st in stacks]

        seq = th.get("seq")
        order: list[Naming] = []
        timed = isinstance(seq, list) and len(seq) % 2 == 0 and all(type(x) is int for x in seq)
        if timed:
            for j in range(0, len(seq), 2):
                i, count = seq[j], seq[j + 1]
                order.extend([names[i] if 0 <= i < len(names) else unknown] * max(0, min(count, MAX_SAMPLES)))
                if len(order) > MAX_SAMPLES:
                    break
        else:
            for (count, _st), nm in zip(stacks, names):
                order.extend([nm] * max(0, min(count, MAX_SAMPLES)))
                if len(order) > MAX_SAMPLES:
                    break
        del order[MAX_SAMPLES:]
        n = len(order)
        if n == 0:
            return []
        dt = dur / n
        mean_busy = None if timed else busy.mean(t0, t0 + dur)
        ms = [Moment(t0 + (i + 0.5) * dt, dt, busy.at(t0 + (i + 0.5) * dt) if timed else mean_busy, nm)
              for i, nm in enumerate(order)]
        if timed:
            _mark_relaunch(ms, sites)   # (the order alone says it: with or without GPU counters)
        if busy.has_lines or self.with_gpu:
            # with GPU counters, a moment without a GPU sample near it cannot be joined: leave it
            # out rather than count it as idle (or the shares would not sum to 1)
            ms = [m for m in ms if m.busy is not None]
            if timed:
                _drain_waits(ms, sites)
            if probe:
                _calibrate(ms, probe)
        self._split(ms, pid, kernel)
        return ms

    @staticmethod
    def _split(ms: list[Moment], pid: str, kernel: list) -> None:
        """Give each "Python code" moment the kernel's split of the second it fell in."""
        for k in kernel:
            t0, dur = k.data.get("t0"), k.data.get("dur_s")
            cols, rows = k.data.get("cols"), k.data.get("threads")
            if type(t0) not in _NUM or type(dur) not in _NUM or not isinstance(cols, list) or not isinstance(rows, list):
                continue
            inside = [m for m in ms if t0 <= m.t < t0 + dur]
            if not inside:
                continue
            idx = {c: i for i, c in enumerate(cols) if isinstance(c, str)}
            row = next((r for r in rows if isinstance(r, list) and len(r) == len(cols) and "tid" in idx
                        and str(r[idx["tid"]]) == pid), None)
            if row is None:
                continue
            vals = {c: (row[i] if type(row[i]) in _NUM else None) for c, i in idx.items() if c not in ("tid", "name")}
            named = sum(1 for m in inside if m.naming.cat in _NAMED_OFF or m.naming.engine_wait) / len(inside)
            split = KernelSplit.of(vals, named)
            for m in inside:
                if m.naming.cat == "python":
                    m.split = split


_DRAINED_WAITS = (BLOCKED, IO)   # off-CPU waits that launch nothing (a DataLoader wait is placed by the probe)


def _is_sync(m: Moment, sites: frozenset) -> bool:
    return m.naming.cat == SYNC or (m.naming.cat == "python" and m.naming.site in sites)


def _mark_relaunch(ms: list[Moment], sites: frozenset = frozenset()) -> None:
    """Mark which "Python code" moments relaunch after a device sync (``ms`` in the order they
    were sampled). After a wait of another kind (a file, a sleep, the DataLoader, a collective)
    the GPU's queue was drained by that wait, so the host code that follows is that wait's
    relaunch, not the sync's: those moments are not. The rest stay marked: those after a sync
    with only Python code between, and a window's first ones, before any wait in it (what came
    before the window is not known here). A sample with no Python frame says nothing either
    way, and a moment at a line where the probe counted syncs is a sync itself (it keeps the
    mark). sync_stall's cost counts the marked moments' idle only: a debug dump that .cpu()s its
    tensors then writes 260 MB (the third unseen set, timm_debug_dump_every_step) had its whole
    host-code share (21%, mostly the backward passes between dumps) counted as the syncs' cost,
    and outweighed its file writes."""
    after_other_wait = False
    for m in ms:
        cat = m.naming.cat
        if _is_sync(m, sites):
            after_other_wait = False
        elif cat == "python":
            m.relaunch = not after_other_wait
        elif cat != UNKNOWN:
            after_other_wait = True


def _drain_waits(ms: list[Moment], sites: frozenset = frozenset()) -> None:
    """Make the waits that follow a device sync idle, and every named blocking wait (sleep,
    lock, queue, select, socket, a child process), keeping the window's idle time (the module's
    docstring). ``ms``: one py-spy window's moments in the order they were sampled;
    ``sites``: the lines where the probe counted syncs (``sync_sites``), whose "Python code"
    moments are syncs here (they keep their category in the budget)."""
    drained, after_sync = [], False

    def is_sync(m: Moment) -> bool:
        return _is_sync(m, sites)

    for m in ms:
        cat = m.naming.cat
        if is_sync(m):
            after_sync = True
        elif cat == BLOCKED or (after_sync and cat in _DRAINED_WAITS):
            drained.append(m)
        else:
            after_sync = False
    need = sum(m.busy * m.dt for m in drained)
    if need <= 0:
        return
    ids = {id(m) for m in drained}
    syncs = [m for m in ms if is_sync(m)]
    others = [m for m in ms if id(m) not in ids and not is_sync(m)]
    from_sync = sum((1.0 - m.busy) * m.dt for m in syncs)
    from_others = sum((1.0 - m.busy) * m.dt for m in others)
    move = min(need, from_sync + from_others)
    if move <= 0:
        return
    take = min(move, from_sync)
    for group, pool, taken in ((syncs, from_sync, take), (others, from_others, move - take)):
        if pool > 0 and taken > 0:
            keep = 1.0 - taken / pool
            for m in group:
                m.busy = 1.0 - (1.0 - m.busy) * keep
    for m in drained:
        m.busy = m.busy * (1.0 - move / need)


def pre_batch_idle(w) -> tuple[float, float, float] | None:
    """(t0, t1, share) of one probe window: the share of its wall time the GPU idled before each
    batch arrived (its steps' GPU spans start at the batch's CUDA event); None when the window
    cannot say (no DataLoader wait timed, no GPU span read)."""
    d = w.data
    n, step_s, gpu_n, gpu_s, wait = (d.get("step_n"), d.get("step_s_sum"), d.get("gpu_n"), d.get("gpu_s_sum"),
                                     d.get("data_wait_s_sum"))
    span = d.get("window_s")
    if not (type(n) is int and n > 0 and type(gpu_n) is int and gpu_n > 0 and type(step_s) in _NUM and step_s > 0
            and type(gpu_s) in _NUM and type(wait) in _NUM and wait > 0 and type(span) in _NUM and span > 0):
        return None
    share = max(0.0, 1.0 - (gpu_s / gpu_n) / (step_s / n))
    return w.t - span, w.t, min(1.0, share, wait / step_s)


def data_wait_fraction(w) -> float | None:
    """The share of a probe window's step time the loop spent in next(DataLoader); None when it
    timed no step or no wait."""
    d = w.data
    step_s, wait = d.get("step_s_sum"), d.get("data_wait_s_sum")
    if type(step_s) not in _NUM or step_s <= 0 or type(wait) not in _NUM or wait < 0:
        return None
    return min(1.0, wait / step_s)


def _calibrate(ms: list[Moment], probe: list) -> None:
    """Re-place the GPU's idle time within each probe window (the module's docstring)."""
    for w in probe:
        got = pre_batch_idle(w)
        if got is None:
            continue
        t0, t1, share = got
        inside = [m for m in ms if t0 <= m.t < t1]
        if not inside:
            continue
        data = [m for m in inside if m.naming.cat == DATA]
        rest = [m for m in inside if m.naming.cat != DATA]
        idle = sum((1.0 - m.busy) * m.dt for m in inside)
        sampled = sum(m.dt for m in inside)
        data_s = sum(m.dt for m in data)
        if data_s <= 0:
            continue
        # The samples in next(DataLoader) are a sample: at py-spy's rate one 1-s window holds a
        # handful, and the probe timed the wait itself. So they stand for the probe's share of
        # the window (the others for the rest): the data wait's idle is no longer capped by how
        # many samples happened to fall in it (the budget read 24% where the probe measured 30%
        # on an Accelerate job, 6% of samples apart in a 14 s run). Idle is counted in weighted
        # seconds from here; the window's seconds are unchanged, its idle too unless the probe's
        # timed idle before the batches is more than the counters gave (below).
        fd, fr = 1.0, 1.0
        frac = data_wait_fraction(w)
        rest_raw = sampled - data_s
        if frac is not None and rest_raw > 0 and 0.0 < frac < 1.0:
            fd, fr = frac * sampled / data_s, (1.0 - frac) * sampled / rest_raw
        data_s *= fd
        # the data wait's idle, in sampled seconds: the probe's, timed on the GPU itself (its
        # events), even where the counters' smeared average gave the window less idle in all
        want = min(share * sampled, data_s)
        left = max(0.0, idle - want)
        rest_idle = sum((1.0 - m.busy) * m.dt for m in rest) * fr
        rest_s = rest_raw * fr
        if left > rest_s:               # (more idle than the other moments can hold: keep the join)
            continue
        for m in data:
            m.weight = fd
        for m in rest:
            m.weight = fr
        for m in data:
            m.busy = 1.0 - want / data_s
        if left <= rest_idle:
            # less idle for the rest than the join gave them: each keeps its share of it
            f = left / rest_idle if rest_idle > 0 else 0.0
            for m in rest:
                m.busy = 1.0 - (1.0 - m.busy) * f
        else:
            # more: the extra goes to each in proportion to its busy time (its room), so no
            # moment passes fully idle and the window's idle time is kept exactly
            room = sum(m.busy * m.dt for m in rest) * fr
            f = (left - rest_idle) / room if room > 0 else 0.0
            for m in rest:
                m.busy = m.busy * (1.0 - f)
