"""Hot-frame counts of py-spy stacks samples: the functions with the most samples, as sums.

``HotCounts`` holds, per function (name, file), its self and total sample counts and the counts
of its self lines, in the order the functions were first seen (ties in the table keep that
order), plus the samples counted. Counts add, so one minute's counts merge with the next
minute's into what counting every sample at once gives (the report's summary frames,
derive/report_partials.py). ``derive.threads.hot_frames`` builds its table from one.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from gputop.catalogue import KIND_STACKS
from gputop.derive.thread_samples import window_weight


def tid_key(tid) -> int | str:
    if isinstance(tid, str) and tid.isdigit():
        return int(tid)
    return tid


def frame_keys(frames: list) -> list:
    """(function, file) of each entry of a stacks sample's frame table; None for an entry that is
    not a [function, file, line, ...] list."""
    return [(str(f[0]), str(f[1])) if isinstance(f, list) and len(f) >= 3 else None for f in frames]


class HotCounts:
    __slots__ = ("self_n", "total_n", "lines", "n_all")

    def __init__(self) -> None:
        self.self_n: Counter = Counter()
        self.total_n: Counter = Counter()
        self.lines: dict[tuple, Counter] = {}
        self.n_all = 0

    def add_thread(self, frames: list, th: dict, keys: list | None = None, weight: int = 1) -> None:
        """One thread entry of a stacks sample (``frames``: the sample's frame table; ``keys``:
        its ``frame_keys``, made once for all of the sample's threads; ``weight``: its window's,
        thread_samples.window_weight)."""
        if keys is None:
            keys = frame_keys(frames)
        nf = len(keys)
        total_n, self_n = self.total_n, self.self_n
        stacks = th.get("stacks")
        for entry in stacks if isinstance(stacks, list) else ():
            try:
                count, stack = int(entry[0]), [int(i) for i in entry[1]]
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                continue
            if count <= 0:
                continue
            count *= weight
            self.n_all += count
            # each function once per stack, in the order first seen (ties in the table keep it)
            for fkey in dict.fromkeys(keys[i] for i in stack if 0 <= i < nf and keys[i] is not None):
                total_n[fkey] += count
            last = stack[-1] if stack else -1
            if 0 <= last < nf and keys[last] is not None:
                fkey = keys[last]
                self_n[fkey] += count
                line = frames[last][2]
                if type(line) in (int, str):   # (a damaged frame's line, a list, would not hash)
                    self.lines.setdefault(fkey, Counter())[line] += count

    def add_sample(self, s, want: Callable[[int, dict], bool] | None = None) -> None:
        """The threads of one stacks sample that ``want(pid, thread)`` (all when None)."""
        if s.kind != KIND_STACKS:
            return
        try:
            spid = int(s.key)
        except ValueError:
            return
        frames = s.data.get("frames")
        threads = s.data.get("threads")
        if not isinstance(frames, list) or not isinstance(threads, list):
            return
        keys = frame_keys(frames)
        weight = window_weight(s.data)
        for th in threads:
            if isinstance(th, dict) and (want is None or want(spid, th)):
                self.add_thread(frames, th, keys, weight)

    def merge(self, o: "HotCounts") -> None:
        """Add ``o``, the counts of later samples."""
        self.n_all += o.n_all
        for k, n in o.total_n.items():
            self.total_n[k] += n
        for k, n in o.self_n.items():
            self.self_n[k] += n
        for k, c in o.lines.items():
            self.lines.setdefault(k, Counter()).update(c)

    def rows(self, top: int = 20, by: str = "self") -> dict:
        if by not in ("self", "total"):
            raise ValueError("by must be 'self' or 'total'")
        self_n, total_n, lines, n_all = self.self_n, self.total_n, self.lines, self.n_all
        keys = sorted(total_n, key=lambda k: ((self_n[k], total_n[k]) if by == "self" else (total_n[k], self_n[k])),
                      reverse=True)[:top]
        rows = []
        for k in keys:
            hot_line = lines[k].most_common(1)[0][0] if k in lines else None
            rows.append({"func": k[0], "file": k[1], "line": hot_line, "self": self_n[k], "total": total_n[k],
                         "self_pct": round(100.0 * self_n[k] / n_all, 1) if n_all else None,
                         "total_pct": round(100.0 * total_n[k] / n_all, 1) if n_all else None})
        return {"samples": n_all, "rows": rows}

    # -- as columns (a summary frame): [n_all, funcs, files, totals, selfs, n_lines, lines], where
    # funcs and files index the frame's string table (report_partials.Strings) and ``lines`` is
    # each function's [line, count, ...] pairs in turn (``n_lines`` pairs each): flat lists of
    # numbers, cheap to parse and to check, and no name written twice.
    def to_columns(self, intern: Callable[[str], int]) -> list:
        keys = list(self.total_n)
        lines = [self.lines.get(k, {}) for k in keys]
        return [self.n_all, [intern(k[0]) for k in keys], [intern(k[1]) for k in keys],
                [self.total_n[k] for k in keys], [self.self_n.get(k, 0) for k in keys],
                [len(c) for c in lines], [x for c in lines for line, n in c.items() for x in (line, n)]]

    def add_columns(self, obj, strings: list) -> None:
        """Add ``to_columns``' list (later samples' counts); ValueError on anything else (a
        damaged summary), before anything is added."""
        if not (isinstance(obj, list) and len(obj) == 7 and all(isinstance(x, list) for x in obj[1:])
                and _count(obj[0])):
            raise ValueError("hot frames")
        n_all, funcs, files, totals, selfs, n_lines, flat = obj
        n = len(funcs)
        if not (len(files) == len(totals) == len(selfs) == len(n_lines) == n and _indices(funcs, len(strings))
                and _indices(files, len(strings)) and _counts(totals) and _counts(selfs) and _counts(n_lines)
                and len(flat) == 2 * sum(n_lines) and _counts(flat[1::2])
                and not {list, dict} & set(map(type, flat[::2]))):
            raise ValueError("hot frames")
        self.n_all += n_all
        keys = [(strings[f], strings[p]) for f, p in zip(funcs, files)]
        total_n, self_n, lines = self.total_n, self.self_n, self.lines
        for k, c in zip(keys, totals):
            total_n[k] += c
        for k, c in zip(keys, selfs):
            if c:
                self_n[k] += c
        pos = 0
        for k, m in zip(keys, n_lines):
            if m:
                c = lines.get(k)
                if c is None:
                    c = lines[k] = Counter()
                for line, cnt in zip(flat[pos:pos + 2 * m:2], flat[pos + 1:pos + 2 * m:2]):
                    c[line] += cnt
                pos += 2 * m


def _indices(v: list, n: int) -> bool:
    return not v or (set(map(type, v)) == {int} and min(v) >= 0 and max(v) < n)


def _counts(v: list) -> bool:
    return not v or (set(map(type, v)) == {int} and min(v) >= 0 and max(v) < (1 << 53))


def _count(v) -> bool:
    return type(v) is int and 0 <= v < (1 << 53)
