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


def tid_key(tid) -> int | str:
    if isinstance(tid, str) and tid.isdigit():
        return int(tid)
    return tid


class HotCounts:
    __slots__ = ("self_n", "total_n", "lines", "n_all")

    def __init__(self) -> None:
        self.self_n: Counter = Counter()
        self.total_n: Counter = Counter()
        self.lines: dict[tuple, Counter] = {}
        self.n_all = 0

    def add_thread(self, frames: list, th: dict) -> None:
        """One thread entry of a stacks sample (``frames``: the sample's frame table)."""
        for entry in th.get("stacks") or []:
            try:
                count, stack = int(entry[0]), [int(i) for i in entry[1]]
            except (TypeError, ValueError, IndexError):
                continue
            if count <= 0:
                continue
            self.n_all += count
            seen = set()
            for pos, i in enumerate(stack):
                if not (0 <= i < len(frames)) or not isinstance(frames[i], list) or len(frames[i]) < 3:
                    continue
                fkey = (str(frames[i][0]), str(frames[i][1]))
                if fkey not in seen:
                    seen.add(fkey)
                    self.total_n[fkey] += count
                if pos == len(stack) - 1:
                    self.self_n[fkey] += count
                    self.lines.setdefault(fkey, Counter())[frames[i][2]] += count

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
        for th in threads:
            if isinstance(th, dict) and (want is None or want(spid, th)):
                self.add_thread(frames, th)

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

    # -- as JSON (a summary frame): [n_all, [[func, file, total, self, [line, n, ...]], ...]] --
    def to_json(self) -> list:
        return [self.n_all, [[k[0], k[1], n, self.self_n.get(k, 0),
                              [x for line, c in self.lines.get(k, {}).items() for x in (line, c)]]
                             for k, n in self.total_n.items()]]

    @classmethod
    def from_json(cls, obj) -> "HotCounts":
        """From ``to_json``'s list; ValueError on anything else (a damaged summary)."""
        if not (isinstance(obj, list) and len(obj) == 2 and _count(obj[0]) and isinstance(obj[1], list)):
            raise ValueError("hot frames")
        h = cls()
        h.n_all = obj[0]
        for row in obj[1]:
            if not (isinstance(row, list) and len(row) == 5 and isinstance(row[0], str) and isinstance(row[1], str)
                    and _count(row[2]) and _count(row[3]) and isinstance(row[4], list) and len(row[4]) % 2 == 0):
                raise ValueError("hot frame")
            k = (row[0], row[1])
            h.total_n[k] += row[2]
            if row[3]:
                h.self_n[k] += row[3]
            flat = row[4]
            if flat:
                c = h.lines.setdefault(k, Counter())
                for line, n in zip(flat[::2], flat[1::2]):
                    if not _count(n) or isinstance(line, (list, dict)):
                        raise ValueError("hot frame line")
                    c[line] += n
        return h


def _count(v) -> bool:
    return type(v) is int and 0 <= v < (1 << 53)
