"""The report's sections as mergeable partials: what one summary frame's samples (5 minutes,
``SUMMARY_S``) give each section, written into the recorder's summary frames and merged by
``gputop report`` (gputop/report.py) so that an hour's report reads the summary frames only,
never every chunk.

A summary frame's ``sections`` (format 1.1; readers that do not know it ignore it):
  {"v": 2, "keep": [kind...], "kept": [[kind, key, ts, order, {field: values}]...],
   "parts": {section: partial}}
- ``kept``: the samples of the small kinds (probe windows, health, ranks, GPU info and
  processes, stall snapshots: a few a second) as they are (as columns, each with its place in
  the order written), once for every section that reads them; a section that reads only these
  is built from them exactly as from the file.
- ``parts``: for the kinds too big to keep (py-spy stacks, the kernel's thread counts, the GPU
  counters), what the section needs of them, as sums:
  * ``stacks`` and ``ranks``: every thread's ThreadAgg (derive/threads.py: counts and seconds
    that add; names and flags: the latest / any / all) and the hot-frame counts
    (derive/hot_frames.py) of all threads and of each process's main thread, as columns; the
    function and file names once each in the partial's string table ``s``, the frames as
    indices into it (layout 1 wrote the names out, 171 kB of JSON a minute, and was the report's
    costliest part to parse and check);
  * ``efficiency``: of each GPU sample only the time, energy counter, power and tensor-pipe
    activity it reads (its training span is known only at the end, so the readings are kept,
    not summed: about 7 kB a minute per GPU sampled at 5/s).
Frames of another layout ``v`` (1: written before the string tables) are not merged: their
sections are built from every sample (correct, only slower). Every number merged is the one
reading every sample gives, except float sums added frame by
frame (the last bits; docs/report.md). Pure: no file, no thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from gputop.catalogue import (KIND_GPU, KIND_GPU_INFO, KIND_GPU_PROCS, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY,
                              KIND_PROBE_STEP, KIND_PROBE_SYNC, KIND_RANK, KIND_STACKS, KIND_STALL_SNAPSHOT,
                              KIND_THREAD_KERNEL, WAIT_CLASSES)
from gputop.derive.hot_frames import HotCounts, tid_key
from gputop.derive.threads import ThreadAgg, aggregate
from gputop.model import KIND_HEALTH, Sample
from gputop.session.sanitize import MAX_NUMBER, MAX_TIME_S

PARTS_VERSION = 2   # 2: string tables, hot frames as columns (frames of 1 are read from the samples)
KEEP = (KIND_PROBE_STEP, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_SYNC, KIND_HEALTH, KIND_RANK,
        KIND_GPU_INFO, KIND_GPU_PROCS, KIND_STALL_SNAPSHOT)
GPU_FIELDS = ("energy_j", "power_w", "tensor_active")   # what derive/efficiency.py reads of a gpu sample


# -- kept samples -------------------------------------------------------------------------------

def kept_series(samples: list[Sample], keep=KEEP) -> list:
    """The samples of the kinds kept, as columns: [kind, key, ts, order, {field: values}] per
    kind, key and set of fields (so each sample reads back with exactly its own fields), with
    each sample's place in ``samples`` (``order``) so that they read back in the order written."""
    groups: dict[tuple, list] = {}
    for i, s in enumerate(samples):
        if s.kind in keep:
            names = tuple(s.data)
            g = groups.get((s.kind, s.key, names))
            if g is None:
                g = groups[(s.kind, s.key, names)] = [s.kind, s.key, [], [], {n: [] for n in names}]
            g[2].append(s.t)
            g[3].append(i)
            cols = g[4]
            for n, v in s.data.items():
                cols[n].append(v)
    return list(groups.values())


def kept_samples(rows, keep) -> list[Sample]:
    """``kept_series``' series as samples in the order written, each value checked as every
    value read from a file is (session/sanitize.clean_series); ValueError if they are not what a
    recorder writes."""
    from gputop.session.sanitize import clean_series

    if not isinstance(rows, list):
        raise ValueError("kept samples")
    out = []
    for r in rows:
        if not (isinstance(r, list) and len(r) == 5):
            raise ValueError("kept samples")
        kind, key, ts, order, cols = r
        if not (isinstance(kind, str) and isinstance(key, str) and isinstance(ts, list) and isinstance(order, list)
                and isinstance(cols, dict) and len(order) == len(ts) and _numbers(ts, none=False)
                and (not ts or -MAX_TIME_S <= min(ts) and max(ts) <= MAX_TIME_S)
                and set(map(type, order)) <= {int}
                and all(isinstance(c, list) and len(c) == len(ts) for c in cols.values())):
            raise ValueError("kept samples")
        if kind not in keep:
            continue
        got = clean_series(kind, key, ts, cols)
        if got is None:
            raise ValueError("kept samples")
        cols = got[3]
        names = list(cols)
        out += [(order[j], Sample(float(t), kind, key, {n: cols[n][j] for n in names})) for j, t in enumerate(ts)]
    out.sort(key=lambda x: x[0])
    return [s for _, s in out]


# -- threads --------------------------------------------------------------------------------------

class Strings:
    """A partial's string table: each function and file name once, frames as indices into it
    (an hour of py-spy windows names the same few hundred functions over and over)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.list: list[str] = []

    def __call__(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.list)
            self.list.append(s)
        return i


def _strings(p) -> list:
    got = _part(p, "s")
    if not (isinstance(got, list) and set(map(type, got)) <= {str}):
        raise ValueError("string table")
    return got


def _agg_row(a: ThreadAgg, intern: Strings) -> list:
    return [a.pid, a.tid, a.name, a.comm, a.main_proc, a.n, dict(a.cats),
            [x for (func, path, line), n in a.leaf.items() for x in (intern(func), intern(path), line, n)],
            a.frames_s, list(a.k), a.cpu_s, a.runq_s, a.span_s, a.sched_span_s, a.gil_known, a.python_proc, a.worker]


def _agg_of(row, strings: list) -> ThreadAgg:
    if not (isinstance(row, list) and len(row) == 17):
        raise ValueError("thread")
    (pid, tid, name, comm, main, n, cats, leaf, frames_s, k, cpu, runq, span, sched, gil_known, python,
     worker) = row
    if not (type(pid) is int and (type(tid) is int or isinstance(tid, str)) and _count(n)
            and isinstance(cats, dict) and all(_count(v) for v in cats.values())
            and isinstance(leaf, list) and len(leaf) % 4 == 0
            and isinstance(k, list) and len(k) == len(WAIT_CLASSES) and all(_count(v) for v in k)
            and all(v is None or isinstance(v, str) for v in (name, comm))
            and all(v is None or isinstance(v, bool) for v in (gil_known, python))
            and isinstance(main, bool) and isinstance(worker, bool)):
        raise ValueError("thread")
    a = ThreadAgg(pid, tid, name=name, comm=comm, main_proc=main, n=n, frames_s=_float(frames_s),
                  k=list(k), cpu_s=_opt(cpu), runq_s=_opt(runq), span_s=_float(span), sched_span_s=_float(sched),
                  gil_known=gil_known, python_proc=python, worker=worker)
    a.cats.update(cats)
    n_str = len(strings)
    for func, path, line, c in zip(leaf[::4], leaf[1::4], leaf[2::4], leaf[3::4]):
        if not (type(func) is int and type(path) is int and 0 <= func < n_str and 0 <= path < n_str
                and type(line) is int and _count(c)):
            raise ValueError("thread frame")
        a.leaf[(strings[func], strings[path], line)] += c
    return a


def _merge_agg(a: ThreadAgg, o: ThreadAgg) -> None:
    """``o`` (the same thread, later samples) into ``a``: as ``threads.aggregate`` of both at once."""
    a.name = o.name or a.name
    a.comm = o.comm if o.comm is not None else a.comm
    a.main_proc = a.main_proc or o.main_proc
    a.worker = a.worker or o.worker
    a.n += o.n
    a.cats.update(o.cats)
    a.leaf.update(o.leaf)
    a.frames_s += o.frames_s
    a.k = [x + y for x, y in zip(a.k, o.k)]
    if o.cpu_s is not None:
        a.cpu_s = (a.cpu_s or 0.0) + o.cpu_s
        a.runq_s = (a.runq_s or 0.0) + (o.runq_s or 0.0)
    a.span_s += o.span_s
    a.sched_span_s += o.sched_span_s
    if o.gil_known is not None:
        a.gil_known = o.gil_known if a.gil_known is None else (a.gil_known and o.gil_known)
    if o.python_proc is not None:
        a.python_proc = o.python_proc


def _merged_aggs(parts) -> dict:
    aggs: dict = {}
    for p in parts:
        rows, strings = _part(p, "threads"), _strings(p)
        if not isinstance(rows, list):
            raise ValueError("threads")
        for row in rows:
            o = _agg_of(row, strings)
            a = aggs.get((o.pid, o.tid))
            if a is None:
                aggs[(o.pid, o.tid)] = o
            else:
                _merge_agg(a, o)
    # a process is a DataLoader worker if any of its threads showed it, in any frame
    workers = {a.pid for a in aggs.values() if a.worker}
    for a in aggs.values():
        a.worker = a.pid in workers
    return aggs


def _is_main_tid(pid: int, th: dict) -> bool:
    return tid_key(th.get("tid")) == pid


def stacks_partial(samples: list[Sample]) -> dict:
    stacks = [s for s in samples if s.kind == KIND_STACKS]
    kernel = [s for s in samples if s.kind == KIND_THREAD_KERNEL]
    hot_all, hot_main = HotCounts(), {}
    for s in stacks:
        hot_all.add_sample(s)
        try:
            pid = int(s.key)
        except ValueError:
            continue
        h = hot_main.get(pid)
        if h is None:
            h = hot_main[pid] = HotCounts()
        h.add_sample(s, _is_main_tid)
    ts = [s.t for s in stacks + kernel]
    intern = Strings()
    out = {"threads": [_agg_row(a, intern) for a in aggregate(stacks, kernel).values()],
           "t": [min(ts), max(ts)] if ts else None,
           "windows": sorted({(s.key, s.t) for s in stacks}),
           "hot": hot_all.to_columns(intern),
           "hot_main": [[pid, h.to_columns(intern)] for pid, h in hot_main.items() if h.n_all]}
    out["s"] = intern.list
    return out


def stacks_merge(parts: list, kept: list[Sample], report: dict) -> dict:
    from gputop.catalogue import SOURCE_STACKS
    from gputop.derive.threads import _health_summary, stacks_section

    sampler = _health_summary([s for s in kept if s.kind == KIND_HEALTH and s.key == SOURCE_STACKS])
    spans = [_part(p, "t") for p in parts]
    spans = [_span(t) for t in spans if t is not None]
    if not spans:
        return {"available": False, "why": sampler.get("message") or "the stack source did not run",
                "sampler": sampler}
    aggs = _merged_aggs(parts)
    windows = set()
    hot_all, hot_main = HotCounts(), {}
    for p in parts:
        for w in _part(p, "windows"):
            if not (isinstance(w, list) and len(w) == 2):
                raise ValueError("window")
            windows.add((str(w[0]), _float(w[1])))
        strings = _strings(p)
        hot_all.add_columns(_part(p, "hot"), strings)
        for row in _part(p, "hot_main"):
            if not (isinstance(row, list) and len(row) == 2 and type(row[0]) is int):
                raise ValueError("hot frames")
            hot_main.setdefault(row[0], HotCounts()).add_columns(row[1], strings)
    t0, t1 = min(t for t, _ in spans), max(t for _, t in spans)
    return stacks_section(aggs, sampler, round(t1 - t0, 1), len(windows), lambda: hot_all.rows(top=10)["rows"],
                          lambda pid, tid: hot_main.get(pid, HotCounts()).rows(top=10)["rows"])


# -- ranks: the main threads' sums, GPU memory per process ------------------------------------------

def ranks_partial(samples: list[Sample]) -> dict:
    from gputop.derive.ranks import _int

    stacks = [s for s in samples if s.kind == KIND_STACKS]
    kernel = [s for s in samples if s.kind == KIND_THREAD_KERNEL]
    mains = [a for a in aggregate(stacks, kernel).values() if a.tid == a.pid]
    mem: dict[str, dict[str, int]] = {}
    for s in samples:
        if s.kind == KIND_GPU_PROCS:
            mine = mem.setdefault(s.key, {})
            procs = s.data.get("procs")
            if isinstance(procs, dict):
                for p, e in procs.items():
                    if p.isdigit() and isinstance(e, dict):
                        mine[p] = max(mine.get(p, 0), _int(e.get("mem")) or 0)
    intern = Strings()
    return {"threads": [_agg_row(a, intern) for a in mains], "gpu_mem": mem, "s": intern.list}


def ranks_merge(parts: list, kept: list[Sample], report: dict) -> dict | None:
    from gputop.derive import ranks

    samples = [s for s in kept if s.kind in (KIND_RANK, KIND_PROBE_STEP, KIND_GPU_INFO)]
    if not any(s.kind == KIND_RANK for s in samples):
        return None
    mem: dict[str, dict[str, int]] = {}
    for p in parts:
        got = _part(p, "gpu_mem")
        if not isinstance(got, dict):
            raise ValueError("gpu memory")
        for key, procs in got.items():
            if not isinstance(procs, dict) or not all(_count(v) for v in procs.values()):
                raise ValueError("gpu memory")
            mine = mem.setdefault(key, {})
            for pid, m in procs.items():
                mine[pid] = max(mine.get(pid, 0), m)
    # one gpu_procs sample per GPU with each process's largest memory: what ranks.report_section
    # takes the maximum of
    samples += [Sample(0.0, KIND_GPU_PROCS, key, {"procs": {p: {"mem": m} for p, m in procs.items()}})
                for key, procs in mem.items()]
    return ranks.report_section(samples, report, aggs=_merged_aggs(parts))


# -- efficiency: the GPU readings it reads ------------------------------------------------------------

def efficiency_partial(samples: list[Sample]) -> dict:
    cols: dict[str, list] = {}
    for s in samples:
        if s.kind == KIND_GPU:
            c = cols.get(s.key)
            if c is None:
                c = cols[s.key] = [[] for _ in range(1 + len(GPU_FIELDS))]
            c[0].append(s.t)
            for i, f in enumerate(GPU_FIELDS, 1):
                c[i].append(s.data.get(f))
    return {"gpu": cols}


def efficiency_merge(parts: list, kept: list[Sample], report: dict) -> dict:
    from gputop.derive import efficiency

    cols: dict[str, list[list]] = {}
    for p in parts:
        got = _part(p, "gpu")
        if not isinstance(got, dict):
            raise ValueError("gpu readings")
        for key, c in got.items():
            if not (isinstance(c, list) and len(c) == 1 + len(GPU_FIELDS) and all(isinstance(x, list) for x in c)
                    and len({len(x) for x in c}) == 1 and _numbers(c[0], none=False)
                    and all(_numbers(x) for x in c[1:])):
                raise ValueError("gpu readings")
            mine = cols.setdefault(key, [[] for _ in c])
            for into, x in zip(mine, c):
                into += x
    readings = {}
    for key, (ts, *vals) in cols.items():
        # time-ordered, as the samples a section's build gets (a stable sort: equal times keep
        # the order written)
        if any(a > b for a, b in zip(ts, ts[1:])):
            order = sorted(range(len(ts)), key=ts.__getitem__)
            ts, vals = [ts[i] for i in order], [[v[i] for i in order] for v in vals]
        readings[key] = efficiency.GpuReadings([float(t) for t in ts], *vals)
    return efficiency.report_section([s for s in kept if s.kind in efficiency.KINDS], gpu_readings=readings)


# -- the table ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SectionPartial:
    """How a report section is summarized: ``partial`` of one summary frame's samples of the section's
    kinds (JSON-able); ``merge(partials, kept samples, report so far)`` -> the section, as its
    ``build`` over every sample gives it. ``partial`` None: the section reads kept kinds only
    and is built from them (``build`` itself)."""
    name: str
    partial: Callable[[list[Sample]], dict] | None
    merge: Callable[[list, list[Sample], dict], dict | None] | None


PARTIALS: dict[str, SectionPartial] = {p.name: p for p in (
    SectionPartial("stacks", stacks_partial, stacks_merge),
    SectionPartial("probe", None, None),
    SectionPartial("ranks", ranks_partial, ranks_merge),
    SectionPartial("efficiency", efficiency_partial, efficiency_merge),
    SectionPartial("stall", None, None),
)}


# -- checks --------------------------------------------------------------------------------------------

def _part(p, name: str):
    if not isinstance(p, dict) or name not in p:
        raise ValueError(f"section partial without {name}")
    return p[name]


def _count(v) -> bool:
    return type(v) is int and 0 <= v < (1 << 53)


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _span(t) -> tuple[float, float]:
    """A partial's (first, last) sample time, as the reader bounds sample times."""
    if not isinstance(t, list) or len(t) != 2:
        raise ValueError("not a span")
    a, b = _float(t[0]), _float(t[1])
    if not (-MAX_TIME_S <= a <= b <= MAX_TIME_S):
        raise ValueError("span out of bounds")
    return a, b


def _float(v) -> float:
    f = _num(v)
    if f is None:
        raise ValueError("not a number")
    return f


def _numbers(v: list, none: bool = True) -> bool:
    """Every item a finite number (or None where ``none``), as ``clean_series`` leaves a GPU
    column: checked a list at a time."""
    types = set(map(type, v))
    if not types <= ({int, float, type(None)} if none else {int, float}):
        return False
    nums = [x for x in v if x is not None] if type(None) in types else v
    return not nums or (math.isfinite(min(nums)) and math.isfinite(max(nums))
                        and -MAX_NUMBER <= min(nums) and max(nums) <= MAX_NUMBER)


def _opt(v) -> float | None:
    return None if v is None else _float(v)


# -- the recorder's side and the report's side ----------------------------------------------------------

SUMMARY_KINDS = frozenset(KEEP) | {KIND_STACKS, KIND_THREAD_KERNEL, KIND_GPU}   # what ``summarize`` reads


def summarize(samples: list[Sample]) -> dict:
    """A summary frame's ``sections`` of its samples (in the order written)."""
    ordered = sorted(samples, key=lambda s: s.t)   # as a section's build gets them
    return {"v": PARTS_VERSION, "keep": list(KEEP), "kept": kept_series(samples),
            "parts": {p.name: p.partial(ordered) for p in PARTIALS.values() if p.partial is not None}}


def as_json(v):
    """What writing and reading a summary frame makes of a partial (tuples -> lists, NaN -> None)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [as_json(x) for x in v]
    if isinstance(v, dict):
        return {str(k): as_json(x) for k, x in v.items()}
    return v


class MergedFrames:
    """The ``sections`` of every summary frame of a file (in order) and the samples after the
    last one (``set_tail``): what each report section is built from instead of every sample.
    ValueError if a frame's ``sections`` is missing or not what a recorder writes."""

    def __init__(self, frames: list):

        if not frames or not all(isinstance(f, dict) and f.get("v") == PARTS_VERSION for f in frames):
            raise ValueError("no section partials")
        keep = set(KEEP)
        for f in frames:
            if not (isinstance(f.get("keep"), list) and isinstance(f.get("parts"), dict)):
                raise ValueError("section partials")
            keep &= set(f["keep"])
        self.keep = keep
        self._kept = [s for f in frames for s in kept_samples(f.get("kept"), keep)]
        self.kept: list[Sample] = []
        self.frames = frames
        self.tail: list[Sample] = []

    def set_tail(self, tail: list[Sample]) -> None:
        """The samples after the last frame (cleaned, in the order read)."""
        self.kept = sorted(self._kept + [s for s in tail if s.kind in self.keep], key=lambda s: s.t)
        self.tail = sorted((s for s in tail if s.kind in SUMMARY_KINDS), key=lambda s: s.t)

    def can_build(self, section) -> bool:
        if set(section.kinds) <= self.keep:
            return True
        return section.merge is not None and all(section.name in f["parts"] for f in self.frames)

    def build(self, section, report: dict) -> dict | None:
        kept = [s for s in self.kept if s.kind in section.kinds]
        if section.merge is None:
            return section.build(kept, report)
        parts = [f["parts"][section.name] for f in self.frames]
        if self.tail:
            parts.append(as_json(section.partial([s for s in self.tail if s.kind in section.kinds])))
        return section.merge(parts, kept, report)


def held_samples(kind: str, key: str, ts: list, cols: dict) -> list[Sample]:
    """``series_samples`` of what ``summarize`` reads, for the summarizer to hold until its
    frame: of a gpu sample only ``GPU_FIELDS`` (its other ~25 fields were most of the held
    memory: a frame holds 5 minutes of them, 3,000 a GPU)."""
    if kind == KIND_GPU:
        cols = {n: c for n, c in cols.items() if n in GPU_FIELDS}
    return series_samples(kind, key, ts, cols)


def series_samples(kind: str, key: str, ts: list, cols: dict) -> list[Sample]:
    """A cleaned columnar series as samples, as the report makes them (gputop/report.py)."""
    names = list(cols)
    return [Sample(float(t), kind, key, {n: cols[n][i] for n in names}) for i, t in enumerate(ts)]
