"""Thread states: what share of recent time each thread of the target spent doing what.

Input: the stack source's raw samples (gputop/sources/stacks.py), live or replayed:

- ``stacks``/PID: py-spy windows: per thread, de-duplicated stacks with sample counts;
- ``thread_kernel``/PID: per thread, counts of kernel wait classes (``run``, ``gil``, ``lock``,
  ``sleep``, ``poll``, ``io``, ``other``) sampled at ~25 Hz, and exact on-CPU and run-queue
  seconds from schedstat.

Output (the ``ThreadStateProcessor``, every 2 s, over the last ``horizon_s`` = 10 s):
``thread_state``/"PID:TID" with the share of time, in percent, in each state of ``STATES``.

How the two inputs are fused (docs/metrics.md, "Python stacks", has the long form):

1. py-spy's frames give the *waits the user cares about by name*: ``data`` (inside the
   DataLoader iterator), ``cuda`` (synchronize, ``.item()``...), ``collective`` (torch.distributed),
   and known blocking calls (``idle`` frames). See gputop/derive/frame_rules.py.
2. The kernel gives what frames cannot: exact CPU time, time waiting for a CPU (run queue),
   and, of the time off the CPU, how much was blocked on the GIL (a futex in the Python
   runtime's static data) versus other waits (sleep, locks, I/O).
3. ``gil`` = kernel GIL share, charged to the time outside the named waits;
   ``idle`` = the larger of the idle frames' share and the kernel's non-GIL off-CPU share not
   explained by the named waits; the rest is split between ``running`` and ``cpu_wait`` in the
   thread's on-CPU : run-queue ratio (schedstat).

A thread seen only by the kernel (a native thread: CUDA, OpenMP, or any thread when py-spy is
off) gets running / cpu_wait / gil / idle; one seen only by py-spy (no /proc access) gets its
named waits and idle frames, and the rest is ``unknown``: running and GIL wait look the same
from frames alone. Nothing is guessed: a share that cannot be known is None.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

from gputop.derive import frame_rules as fr
from gputop.derive.hot_frames import HotCounts
from gputop.derive.phases import ENDED, look_start
from gputop.derive.stacks_window import threads_since, works_now
from gputop.derive.thread_samples import (  # noqa: F401  (the readers of raw samples; importable here)
    _STACK_MEMO, _STACK_MEMO_MAX, _ClassifyCache, _classify_sample, _num, _parse_kernel, _stack_class, _tid_key,
)
from gputop.model import KIND_HEALTH, MetricSpec, Sample
from gputop.catalogue import KIND_PHASE, KIND_STACKS, KIND_THREAD_KERNEL, WAIT_CLASSES
from gputop.catalogue import SOURCE_STACKS as SOURCE_NAME

from gputop.catalogue import KIND_THREAD_STATE  # noqa: E402  (kept importable from here)

STATES = ("running", "gil", "data", "cuda", "collective", "idle", "cpu_wait", "unknown")
STATE_LABELS = {
    "running": "running Python", "gil": "GIL wait", "data": "DataLoader wait", "cuda": "CUDA sync",
    "collective": "collective", "idle": "idle", "cpu_wait": "waiting for a CPU", "unknown": "unknown",
}
ROLE_MAIN, ROLE_THREAD, ROLE_WORKER, ROLE_CHILD = "main", "thread", "dataloader_worker", "child"

DEFAULT_HORIZON_S = 10.0
NATIVE_MIN_CPU = 0.05   # threads without Python frames are published only when this busy
_K = {c: i for i, c in enumerate(WAIT_CLASSES)}
_IDLE_CLASSES = ("lock", "sleep", "poll", "io", "other")

METRICS: list[MetricSpec] = [
    MetricSpec(KIND_THREAD_STATE, f"{s}_pct", "%", STATE_LABELS[s], h) for s, h in (
        ("running", "on a CPU in Python code or native code called from it (torch ops, hashing...)"),
        ("gil", "blocked waiting for the GIL (kernel: futex on the Python runtime's GIL)"),
        ("data", "inside next() of a torch DataLoader iterator (py-spy frames)"),
        ("cuda", "waiting for the GPU: synchronize(), .item(), .cpu(), .tolist(), event/stream sync (py-spy frames)"),
        ("collective", "inside a torch.distributed collective (py-spy frames)"),
        ("idle", "blocked off the CPU outside the waits above: sleep, lock, queue, I/O, select"),
        ("cpu_wait", "ready to run but waiting for a free CPU core (schedstat run-queue time)"),
        ("unknown", "not attributable: no Python frame, or running vs GIL wait unknown without /proc access"),
    )
] + [
    MetricSpec(KIND_THREAD_STATE, "cpu_pct", "%", "CPU", "on-CPU time of the thread per wall second (schedstat; 100 = one core)"),
]


# ---------------------------------------------------------------------------------------------
# Aggregation


@dataclass
class ThreadAgg:
    pid: int
    tid: int | str
    name: str | None = None          # Python thread name (py-spy)
    comm: str | None = None          # kernel thread name (/proc/.../comm)
    main_proc: bool = False
    worker: bool = False
    # py-spy
    n: int = 0
    cats: Counter = field(default_factory=Counter)
    leaf: Counter = field(default_factory=Counter)   # (func, file, line) -> samples
    frames_s: float = 0.0
    # kernel
    k: list = field(default_factory=lambda: [0] * len(WAIT_CLASSES))
    cpu_s: float | None = None
    runq_s: float | None = None
    span_s: float = 0.0
    sched_span_s: float = 0.0
    gil_known: bool | None = None
    python_proc: bool | None = None


def aggregate(stacks: Iterable[Sample], kernel: Iterable[Sample],
              cache: _ClassifyCache | None = None,
              kcache: _ClassifyCache | None = None) -> dict[tuple[int, int | str], ThreadAgg]:
    """Sum raw stack and kernel samples per thread. ``cache`` / ``kcache``: the processor's
    caches of classified stacks samples / parsed kernel samples, which outlive one call."""
    cache = cache or _ClassifyCache()
    aggs: dict[tuple[int, int | str], ThreadAgg] = {}
    worker_pids: set[int] = set()

    def get(pid: int, tid) -> ThreadAgg:
        a = aggs.get((pid, tid))
        if a is None:
            a = aggs[(pid, tid)] = ThreadAgg(pid, tid)
        return a

    for s in stacks:
        try:
            pid = int(s.key)
        except ValueError:
            continue
        dur = _num(s.data.get("dur_s")) or 0.0
        for tid, (name, n, cats, leaf, worker) in cache.get(s).items():
            a = get(pid, _tid_key(tid))
            a.name = name or a.name
            a.main_proc = a.main_proc or s.data.get("main") is True
            a.n += n
            a.cats.update(cats)
            a.leaf.update(leaf)
            a.frames_s += dur
            if worker:
                worker_pids.add(pid)
    for s in kernel:
        parsed = kcache.get(s) if kcache is not None else _parse_kernel(s)
        if parsed is None:
            continue
        pid, main, gil_known, python, rows = parsed
        for tid, comm, counts, span, cpu, runq in rows:
            a = aggs.get((pid, tid))   # get() inlined: this loop runs per thread per second of window
            if a is None:
                a = aggs[(pid, tid)] = ThreadAgg(pid, tid)
            a.main_proc = a.main_proc or main
            if comm is not None:
                a.comm = comm
            if counts is not None:
                k = a.k
                for i, v in counts:
                    k[i] += v
            if span is None:
                continue
            a.span_s += span
            if cpu is not None:
                a.cpu_s = (a.cpu_s or 0.0) + cpu
                a.runq_s = (a.runq_s or 0.0) + runq
                a.sched_span_s += span
            a.gil_known = gil_known if a.gil_known is None else (a.gil_known and gil_known)
            a.python_proc = python
    for (pid, _tid), a in aggs.items():
        a.worker = pid in worker_pids
    return aggs


# ---------------------------------------------------------------------------------------------
# Fusion


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def _runq_part(share: float, cpu: float | None, runq: float | None) -> float | None:
    """The part of ``share`` (time the thread wanted a CPU, outside the named waits) spent
    waiting for one: the thread's run-queue : on-CPU ratio. Named waits can hold run-queue
    time too (a thread woken with its batch waits for a core inside next()), so the ratio is
    used rather than the whole run-queue time."""
    if cpu is None or runq is None:
        return None
    if cpu + runq <= 0:
        return 0.0
    return share * runq / (cpu + runq)


def fuse(a: ThreadAgg) -> dict[str, float | None]:
    """Shares (0..1, None = cannot be known) of every state in STATES, plus "cpu"."""
    out: dict[str, float | None] = dict.fromkeys(STATES)
    out["cpu"] = None
    kn = sum(a.k)
    have_k = kn > 0 or a.sched_span_s > 0
    cpu = runq = None
    if a.sched_span_s > 0 and a.cpu_s is not None and a.runq_s is not None:
        cpu = _clamp01(a.cpu_s / a.sched_span_s)
        runq = _clamp01(a.runq_s / a.sched_span_s)
        if cpu + runq > 1:
            cpu, runq = cpu / (cpu + runq), runq / (cpu + runq)
        out["cpu"] = cpu
    # Kernel view: the off-CPU time split by the sampled wait classes.
    gil_k = idle_k = oncpu_k = off_total = None
    if have_k:
        n_off = kn - a.k[_K["run"]]
        if cpu is not None:
            oncpu_k = cpu + runq
            off = max(0.0, 1.0 - oncpu_k)
        elif kn:
            oncpu_k = a.k[_K["run"]] / kn
            off = 1.0 - oncpu_k
        else:
            off = None
        if off is not None:
            if n_off > 0:
                g = off * a.k[_K["gil"]] / n_off
            else:
                g = 0.0
            gil_k = g if a.gil_known else None
            idle_k = off - g if a.gil_known else None
            off_total = off
    if a.n > 0:
        F = {c: a.cats.get(c, 0) / a.n for c in fr.CATEGORIES}
        u = F[fr.UNKNOWN]
        waits = F[fr.DATA] + F[fr.CUDA] + F[fr.COLLECTIVE]
        out["data"], out["cuda"], out["collective"] = F[fr.DATA], F[fr.CUDA], F[fr.COLLECTIVE]
        out["unknown"] = u
        avail = max(0.0, 1.0 - waits - u)
        if not have_k or oncpu_k is None:
            # Frames alone: running and GIL wait look the same.
            out["idle"] = min(avail, F[fr.IDLE])
            out["unknown"] = u + max(0.0, avail - out["idle"])
            return out
        if gil_k is not None:
            gil = min(gil_k, avail)
            avail -= gil
            idle = min(avail, max(F[fr.IDLE], idle_k - waits))
            rest = avail - idle
            cw = _runq_part(rest, cpu, runq)
            out.update(gil=gil, idle=idle, cpu_wait=cw, running=rest - (cw or 0.0))
            return out
        # GIL unknown (no /proc syscall access, or not CPython): on-CPU time is known, the
        # rest of the off-CPU time might be GIL wait or a blocked C call.
        idle = min(avail, F[fr.IDLE])
        avail -= idle
        on = min(avail, oncpu_k)
        cw = _runq_part(on, cpu, runq)
        out.update(idle=idle, cpu_wait=cw, running=on - (cw or 0.0), unknown=u + (avail - on))
        return out
    if not have_k or off_total is None:
        return out
    # Kernel only: a native thread, or py-spy is not running.
    out["gil"] = gil_k
    out["idle"] = idle_k if idle_k is not None else None
    if a.gil_known is False and off_total is not None:
        if a.python_proc is False:
            out["gil"] = None
            out["idle"] = off_total   # no GIL in a process without Python
        else:
            out["unknown"] = off_total
    if cpu is not None:
        out["running"], out["cpu_wait"] = cpu, runq
    else:
        out["running"] = oncpu_k
    return out


def _role(a: ThreadAgg) -> str:
    if a.main_proc:
        return ROLE_MAIN if a.tid == a.pid else ROLE_THREAD
    return ROLE_WORKER if a.worker else ROLE_CHILD


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100.0 * x, 1)


def _where(a: ThreadAgg) -> str | None:
    if not a.leaf:
        return None
    (func, path, line), _n = a.leaf.most_common(1)[0]
    base = path.rsplit("/", 1)[-1] if path else "?"
    return f"{func} ({base}:{line})"


def thread_state(a: ThreadAgg, native_min_cpu: float = NATIVE_MIN_CPU) -> dict | None:
    """The data of one thread_state sample, or None for a quiet native thread."""
    shares = fuse(a)
    python = a.n > 0
    if not python and (shares["cpu"] or 0.0) < native_min_cpu and (shares["gil"] or 0.0) < 0.01 and not (
            a.main_proc and a.tid == a.pid):
        return None
    known = {s: v for s, v in shares.items() if s in STATES and v is not None}
    top = max(known, key=lambda s: known[s]) if known else None
    idle_counts = {c: a.k[_K[c]] for c in _IDLE_CLASSES if a.k[_K[c]]}
    data = {
        "pid": a.pid, "tid": a.tid, "name": a.name or a.comm, "comm": a.comm, "role": _role(a),
        "python": python, "samples": a.n, "kernel_samples": sum(a.k),
        "window_s": round(max(a.frames_s, a.span_s), 2),
        **{f"{s}_pct": _pct(shares[s]) for s in STATES},
        "cpu_pct": _pct(shares["cpu"]),
        "top": top,
        "idle_kind": max(idle_counts, key=lambda c: idle_counts[c]) if idle_counts else None,
        "where": _where(a),
        "gil_known": a.gil_known,
    }
    return data


def _order(d: dict) -> tuple:
    role_rank = {ROLE_MAIN: 0, ROLE_THREAD: 1, ROLE_WORKER: 2, ROLE_CHILD: 3}.get(d["role"], 4)
    busy = 100.0 - (d.get("idle_pct") or 0.0)
    return (role_rank, not d["python"], -busy, str(d["tid"]))


def thread_states(aggs: dict, native_min_cpu: float = NATIVE_MIN_CPU) -> list[dict]:
    """thread_state data of every thread worth showing, main thread first."""
    out = [d for a in aggs.values() if (d := thread_state(a, native_min_cpu)) is not None]
    out.sort(key=_order)
    return out


# ---------------------------------------------------------------------------------------------
# The processor


def states_since(store, now: float, horizon_s: float = DEFAULT_HORIZON_S) -> float:
    """Where the thread states' look starts: ``horizon_s`` back, holding the py-spy window in
    flight, late or not (stacks_window.threads_since), and never before the phase the job is in
    (phases.look_start, the budget's window too), so that the states the rules read beside the
    budget are of the judged stretch, not of the warm-up before it. Whole py-spy windows: one that
    ends after the start is in the look, so up to a window in flight (2 s in a warm-up, 5 s steady)
    from before the start is too. The processor reads it, and the Threads view's title says it."""
    since = threads_since(store, now, horizon_s)
    phase = store.latest(KIND_PHASE, "main")   # (the budget processor's, this tick: it runs first)
    if phase is None or phase.get("phase") == ENDED:
        return since   # (after the exit the last look, py-spy's final window in it, stands as it was)
    start = look_start(phase.get("phase"), phase.get("since"), phase.get("training_since"))
    return max(since, start) if start is not None and start < now else since


class ThreadStateProcessor:
    """Processor: thread_state samples every ``interval_s`` over the last ``horizon_s``."""

    name = "threads"
    produces = (KIND_THREAD_STATE,)

    def __init__(self, interval_s: float = 2.0, horizon_s: float = DEFAULT_HORIZON_S,
                 native_min_cpu: float = NATIVE_MIN_CPU) -> None:
        self.interval_s = interval_s
        self.horizon_s = horizon_s
        self.native_min_cpu = native_min_cpu
        self._cache = _ClassifyCache()
        self._kcache = _ClassifyCache(fn=_parse_kernel)
        self.worked_t: float | None = None   # the last run that did its work (works_now)

    def process(self, store, now: float) -> list[Sample]:
        if not works_now(store, now, self.interval_s, self.worked_t):
            return []   # calm: every other run (derive/stacks_window.py)
        self.worked_t = now
        since = self.look_since(store, now)
        stacks = [s for ss in store.window(KIND_STACKS, since).values() for s in ss]
        kernel = [s for ss in store.window(KIND_THREAD_KERNEL, since).values() for s in ss]
        if not stacks and not kernel:
            return []
        aggs = aggregate(stacks, kernel, self._cache, self._kcache)
        self._cache.forget_before(since)
        self._kcache.forget_before(since)
        return [Sample(now, KIND_THREAD_STATE, f"{d['pid']}:{d['tid']}", d)
                for d in thread_states(aggs, self.native_min_cpu)]

    def look_since(self, store, now: float) -> float:
        return states_since(store, now, self.horizon_s)

    def reset(self) -> None:
        self._cache.clear()
        self._kcache.clear()
        self.worked_t = None


# ---------------------------------------------------------------------------------------------
# Hot frames


def hot_frames(stacks: Iterable[Sample], pid: int | None = None, tid: int | str | None = None,
               top: int = 20, by: str = "self") -> dict:
    """The functions with the most samples in the given stacks samples: ``self`` (the
    innermost frame) and ``total`` (anywhere on the stack, once per sample). Filter by
    process and thread. Rows: func, file, line (the hottest line of the function), self,
    total, self_pct, total_pct (of all samples that passed the filter)."""
    if by not in ("self", "total"):
        raise ValueError("by must be 'self' or 'total'")
    counts = HotCounts()
    want = None if pid is None and tid is None else (
        lambda spid, th: (pid is None or spid == pid) and (tid is None or _tid_key(th.get("tid")) == _tid_key(tid)))
    for s in stacks:
        counts.add_sample(s, want)
    return counts.rows(top, by)


# ---------------------------------------------------------------------------------------------
# The report


def _health_summary(health: list[Sample]) -> dict:
    if not health:
        return {"state": None, "message": "no health samples from the stack source"}
    last = health[-1].data
    rates = [r for h in health if (r := _num(h.data.get("rate_hz"))) is not None]
    costs = [c for h in health if (c := _num(h.data.get("pyspy_cpu_pct"))) is not None]
    own = [c for h in health if (c := _num(h.data.get("sampler_cpu_pct"))) is not None]
    errors = [h.data.get("message") for h in health if h.data.get("state") == "failed" and h.data.get("message")]
    return {
        "state": last.get("state"), "message": last.get("message") or "",
        "rate_hz": round(sum(rates) / len(rates), 2) if rates else None,
        "rate_requested_hz": last.get("rate_requested_hz"),
        "restarts": last.get("restarts"), "windows": last.get("windows"),
        "last_error": last.get("last_error") or (errors[-1] if errors else None),
        "pyspy_cpu_pct": round(sum(costs) / len(costs), 2) if costs else None,
        "sampler_cpu_pct": round(sum(own) / len(own), 2) if own else None,
        "gil_known": last.get("gil_known"),
    }


def report_section(samples: list[Sample]) -> dict:
    """The "Python stacks" part of ``gputop report``, over every sample given (usually a
    whole recording). JSON-able. Shares are percent of the time each thread was observed."""
    stacks = [s for s in samples if s.kind == KIND_STACKS]
    kernel = [s for s in samples if s.kind == KIND_THREAD_KERNEL]
    health = sorted((s for s in samples if s.kind == KIND_HEALTH and s.key == SOURCE_NAME), key=lambda s: s.t)
    sampler = _health_summary(health)
    if not stacks and not kernel:
        why = sampler.get("message") or "the stack source did not run"
        return {"available": False, "why": why, "sampler": sampler}
    ts = [s.t for s in stacks + kernel]
    return stacks_section(aggregate(stacks, kernel), sampler, round(max(ts) - min(ts), 1) if ts else None,
                          len({(s.key, s.t) for s in stacks}), lambda: hot_frames(stacks, top=10)["rows"],
                          lambda pid, tid: hot_frames(stacks, pid=pid, tid=tid, top=10)["rows"])


def worker_processes(threads: list[dict]) -> list[dict]:
    """One entry per DataLoader worker *process* (its threads summed), busiest first.

    A worker process has several threads of its own (its main thread, multiprocessing's
    QueueFeederThread, a resource-sharing ``_serve`` thread...): counted per thread, a loader of 2
    workers read as 6. Each entry: pid, tid and name of the thread it is judged by (its main
    thread, else its busiest), cpu_pct (all its threads: the process's CPU, 100 = one core),
    running_pct, idle_pct and where (of that thread), threads (how many were seen)."""
    by_pid: dict = {}
    for d in threads:
        if d["role"] == ROLE_WORKER:
            by_pid.setdefault(d["pid"], []).append(d)
    out = []
    for pid, ds in by_pid.items():
        main = next((d for d in ds if str(d["tid"]) == str(pid)), None) or max(
            ds, key=lambda d: d.get("cpu_pct") or 0.0)
        cpus = [d["cpu_pct"] for d in ds if d.get("cpu_pct") is not None]
        out.append({"pid": pid, "tid": main["tid"], "name": main["name"],
                    "cpu_pct": round(sum(cpus), 1) if cpus else None,
                    "running_pct": main["running_pct"], "idle_pct": main["idle_pct"], "where": main["where"],
                    "threads": len(ds)})
    out.sort(key=lambda w: (-(w["cpu_pct"] or 0.0), str(w["pid"])))
    return out


def stacks_section(aggs: dict, sampler: dict, covered_s: float | None, windows: int,
                   top_all: Callable[[], list], top_of: Callable[[int, int | str], list]) -> dict:
    """The section from the threads' sums, however they were summed: over every sample
    (``report_section``) or merged from the summary frames (derive/report_partials.py)."""
    threads = thread_states(aggs)
    main = next((d for d in threads if d["role"] == ROLE_MAIN), None)

    def g(key):
        return main.get(key) if main else None

    workers = worker_processes(threads)
    return {
        "available": True,
        "covered_s": covered_s,
        "py_spy_windows": windows,
        "sampler": sampler,
        "main_thread": main,
        "gil_wait_pct": g("gil_pct"),
        "data_wait_pct": g("data_pct"),
        "sync_wait_pct": g("cuda_pct"),
        "collective_pct": g("collective_pct"),
        "running_pct": g("running_pct"),
        "threads": threads,
        "dataloader_workers": workers,
        "top_frames": {
            "all": top_all(),
            "main_thread": top_of(main["pid"], main["tid"]) if main else [],
        },
        "states": {s: STATE_LABELS[s] for s in STATES},
    }
