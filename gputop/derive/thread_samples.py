"""Reading the stack source's raw samples once each, for the thread states (threads.py).

The thread-state processor runs every 2 s over a 10 s window: every ``stacks`` and
``thread_kernel`` sample sits in ~5 of its windows. Each is checked and taken apart here once
(kept by identity in a ``_ClassifyCache``), and each distinct stack is classified against the
frame rules once (``_stack_class``). Malformed parts (a damaged or hostile recording) are
skipped, never trusted.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict

from gputop.catalogue import WAIT_CLASSES
from gputop.derive import frame_rules as fr
from gputop.model import Sample
from gputop.sources.calm import WEIGHT_FIELD, weight_of

_K = {c: i for i, c in enumerate(WAIT_CLASSES)}


def window_weight(data: dict) -> int:
    """How many samples of the full rate each sample of this stacks window (or each tick of this
    thread_kernel second) stands for: its
    ``calm_factor`` (a window sampled at the calm rate, gputop/sources/calm.py), else 1. Where
    samples are counted (thread states, hot frames), a calm second then weighs what a full-rate
    second does, so a long recording's shares stay shares of time."""
    return weight_of(data.get(WEIGHT_FIELD))


def _num(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


class _ClassifyCache:
    """Samples are immutable: read each once. Keyed by identity; the sample is kept in the entry
    so its id cannot be reused while cached. By default it classifies stacks samples; the
    processor keeps a second one of parsed thread_kernel samples (``_parse_kernel``)."""

    def __init__(self, size: int = 4096, fn=None):
        self.size = size
        self.fn = fn or _classify_sample
        self._d: OrderedDict[int, tuple[Sample, object]] = OrderedDict()

    def get(self, s: Sample):
        hit = self._d.get(id(s))
        if hit is not None and hit[0] is s:
            self._d.move_to_end(id(s))
            return hit[1]
        res = self.fn(s)
        self._d[id(s)] = (s, res)
        while len(self._d) > self.size:
            self._d.popitem(last=False)
        return res

    def clear(self) -> None:
        self._d.clear()

    def forget_before(self, t: float) -> None:
        """Drop entries of samples older than ``t``: each entry keeps its (large) stacks sample
        alive, so without this the cache would hold hours of them (the memory soak found it)."""
        for key in [k for k, (s, _) in self._d.items() if s.t < t]:
            del self._d[key]


# A stack's category and "is a DataLoader worker's loop" depend only on the (function, file) of
# its frames in order and the innermost line's text (frame_rules.classify), and a process's stacks
# repeat window after window: each distinct stack is classified once. Keys are the frames' names;
# 8192 distinct stacks cover hours of a real job (the H200 recordings have < 300 each).
_STACK_MEMO: dict[tuple, tuple[str, bool]] = {}
_STACK_MEMO_MAX = 8192


def _stack_class(frames: list, names: list, stack: list[int], leaf_code: str | None) -> tuple[str, bool]:
    n = len(names)
    key = (leaf_code, *[names[i] if 0 <= i < n else None for i in stack])
    hit = _STACK_MEMO.get(key)
    if hit is None:
        if len(_STACK_MEMO) >= _STACK_MEMO_MAX:
            _STACK_MEMO.clear()
        hit = _STACK_MEMO[key] = (fr.classify(frames, stack, leaf_code)[0], fr.is_dataloader_worker(frames, stack))
    return hit


def _classify_sample(s: Sample) -> dict:
    """{tid: (name, n, Counter categories, Counter leaf frames, worker?)} of one stacks sample.
    Malformed parts (a damaged or hostile recording) are skipped, never trusted."""
    out: dict = {}
    frames = s.data.get("frames")
    code = s.data.get("code") or {}
    threads = s.data.get("threads")
    if not isinstance(frames, list) or not isinstance(threads, list):
        return out
    if not isinstance(code, dict):
        code = {}
    weight = window_weight(s.data)
    frames = [f if isinstance(f, list) and len(f) >= 3 and isinstance(f[0], str) and isinstance(f[1], str)
              else ["?", "", 0] for f in frames]
    names = [(f[0], f[1]) for f in frames]
    for th in threads:
        if not isinstance(th, dict):
            continue
        tid = th.get("tid")
        if isinstance(tid, bool) or not isinstance(tid, (int, str)):
            continue
        cats: Counter = Counter()
        leaf: Counter = Counter()
        worker = False
        n = 0
        stacks = th.get("stacks")
        for entry in stacks if isinstance(stacks, list) else ():   # (damage: a thread's stacks lost, not the sample's)
            try:
                count, stack = entry
                count = int(count)
                stack = [int(i) for i in stack]
            except (TypeError, ValueError, OverflowError):
                continue
            if count <= 0:
                continue
            count *= weight
            leaf_code = code.get(str(stack[-1])) if stack else None
            cat, in_worker = _stack_class(frames, names, stack, leaf_code if isinstance(leaf_code, str) else None)
            cats[cat] += count
            n += count
            if stack and 0 <= stack[-1] < len(frames):
                f = frames[stack[-1]]
                leaf[(f[0], f[1], f[2] if isinstance(f[2], int) else 0)] += count
            worker = worker or in_worker
        dropped = th.get("dropped")
        if isinstance(dropped, int) and dropped > 0:
            cats[fr.UNKNOWN] += dropped * weight
            n += dropped * weight
        name = th.get("name") if isinstance(th.get("name"), str) else None
        out[tid] = (name, n, cats, leaf, worker)
    return out


def _tid_key(tid) -> int | str:
    if isinstance(tid, str) and tid.isdigit():
        return int(tid)
    return tid


def _parse_kernel(s: Sample) -> tuple | None:
    """One thread_kernel sample, checked and taken apart once: (pid, main, gil_known, python,
    rows), each row (tid, comm or None, ((class index, count > 0), ...) or None, span or None,
    cpu or None, runq). ``span`` is None where the row gives no usable span (its counts and name
    still count); ``cpu`` and ``runq`` are both given or both None. The processor sums the same
    samples 5 times (every 2 s over 10 s) and a torch process has tens of threads: reading each
    row once was most of the thread states' cost (benchmarks/cpu_profile.py). None for a
    malformed sample (a damaged or hostile recording): skipped, never trusted."""
    try:
        pid = int(s.key)
    except ValueError:
        return None
    cols = s.data.get("cols")
    rows = s.data.get("threads")
    if not isinstance(cols, list) or not isinstance(rows, list):
        return None
    idx = {c: i for i, c in enumerate(cols) if isinstance(c, str)}
    if "tid" not in idx:
        return None
    i_tid, i_name = idx["tid"], idx.get("name")
    i_span, i_cpu, i_runq = idx.get("span_s"), idx.get("cpu_s"), idx.get("runq_s")
    classes = [(idx[c], _K[c]) for c in WAIT_CLASSES if c in idx]
    weight = window_weight(s.data)   # a calm second's ticks count for the full rate's (sources/calm.py)
    n_cols = len(cols)
    out = []
    for row in rows:
        if not isinstance(row, list) or len(row) != n_cols:
            continue
        tid = row[i_tid]
        if isinstance(tid, bool) or not isinstance(tid, (int, str)):
            continue
        comm = row[i_name] if i_name is not None and isinstance(row[i_name], str) else None
        counts = tuple((k, v * weight) for j, k in classes
                       if isinstance(v := row[j], int) and not isinstance(v, bool) and v > 0) or None
        span = _num(row[i_span]) if i_span is not None else None
        cpu = _num(row[i_cpu]) if i_cpu is not None else None
        runq = _num(row[i_runq]) if i_runq is not None else None
        if span is not None and span <= 0:
            span = None
        if cpu is None or runq is None or cpu < 0 or runq < 0:
            cpu = runq = None
        out.append((_tid_key(tid), comm, counts, span, cpu, runq))
    return pid, s.data.get("main") is True, s.data.get("gil_known") is True, s.data.get("python") is True, out
