"""torch.compile's compilations, read on the probe thread from what dynamo keeps anyway.

Dynamo records one ``CompilationMetrics`` per frame it compiles (or tries to) in
``torch._dynamo.utils``'s bounded deque (64 entries; ``get_compilation_metrics()``): the
function (``co_name``, ``co_filename``, ``co_firstlineno``), the compile id ("frame/attempt"),
how long the compile took (``entire_frame_compile_time_s``), the guard that failed when it is a
recompile (``recompile_reason``: "tensor 'x' size mismatch at index 0. expected 8, actual 9"),
graph breaks, and a failure (``fail_reason``: "Dynamo recompile limit exceeded": from then on
that function runs uncompiled). A compiled forward's backward graph is compiled at its first
backward, after the forward: dynamo records it as a second entry with the same compile id, no
function name and no reason (``is_forward`` False); when that id is a recompile's, its seconds
are the recompile's too (with inductor on the 2-core CI box a recompile's backward took 1.8 s
beside its forward's 1.2 s; on the H200, 5.5 s beside 10.2 s). Each window, the entries not
seen before are summed into the window message's ``compile`` field (docs/metrics.md,
"In-process probe"); what was compiled before the first monitor came is not (``baseline``).

Never imports dynamo (a job that never compiles never loads it): it reads the module only when
the job has loaded it. Reading the deque from this thread while the job appends to it may raise
("deque mutated during iteration"): the window then says nothing new and the next one reads it.

Imports: the standard library only.
"""

from __future__ import annotations

import sys

MAX_FRAMES = 256           # functions remembered by compile id (names for entries that lack one)
MAX_REASON = 300           # characters of a guard-failure reason kept


def _is_limit(fail: object) -> bool:
    text = str(fail or "").lower()
    return "recompile limit" in text or "recompile_limit" in text or "cache_size_limit" in text \
        or "cache size limit" in text


class CompileWatch:
    def __init__(self) -> None:
        self._seen: set[tuple] = set()          # keys of the deque's entries already summed
        self._frames: dict[str, tuple] = {}     # dynamo frame id -> (function, "file:line")
        self.recompiles_total = 0               # since the first monitor came (baseline())
        self.limit_hits_total = 0
        self.limit_top: dict | None = None      # the last function given up at its recompile limit
        self._recompile_ids: list[str] = []    # compile ids of recent recompiles (their backward follows)

    @staticmethod
    def _entries() -> list | None:
        utils = sys.modules.get("torch._dynamo.utils")
        get = getattr(utils, "get_compilation_metrics", None) if utils is not None else None
        if get is None:
            return None
        try:
            return get()
        except Exception:   # the deque changed while it was copied: the next window reads it
            return []

    @staticmethod
    def _key(m) -> tuple:
        return (getattr(m, "compile_id", None), getattr(m, "start_time_us", None) or getattr(m, "start_time", None))

    def baseline(self) -> None:
        """A monitor came: what dynamo compiled before is not this window's (a late attach would
        get the job's whole warm-up, up to 64 compiles, as one window's recompiles)."""
        entries = self._entries()
        if entries:
            self._seen = {self._key(m) for m in entries}
            for m in entries:
                self._function(m)   # (names for a later attempt of the same frame)
                cid = str(getattr(m, "compile_id", "") or "")
                if cid and getattr(m, "recompile_reason", None) and cid not in self._recompile_ids:
                    # a recompile just before the monitor came: its backward may follow
                    self._recompile_ids = (self._recompile_ids + [cid])[-MAX_FRAMES:]

    def window(self) -> dict | None:
        """The compilations since the last call (None until the job has loaded dynamo)."""
        entries = self._entries()
        if entries is None:
            return None
        keys, new = set(), []
        for m in entries:
            key = self._key(m)
            keys.add(key)
            if key not in self._seen:
                new.append(m)
        if entries:
            self._seen = keys   # only what the bounded deque still holds
        n, secs, rsecs, recompiles, limits, breaks = 0, 0.0, 0.0, 0, 0, 0
        by_fn: dict[tuple, list] = {}   # (function, where) -> [recompiles, last reason]
        for m in new:
            n += 1
            s = getattr(m, "entire_frame_compile_time_s", None)
            if not isinstance(s, (int, float)):
                us = getattr(m, "duration_us", None)
                s = us / 1e6 if isinstance(us, (int, float)) else 0.0
            s = max(0.0, float(s))
            secs += s
            b = getattr(m, "num_graph_breaks", None)
            breaks += b if isinstance(b, int) and b > 0 else 0
            fn = self._function(m)
            reason = getattr(m, "recompile_reason", None)
            limit = _is_limit(getattr(m, "fail_reason", None))
            limits += limit
            cid = str(getattr(m, "compile_id", "") or "")
            if reason:
                rsecs += s
                if cid and cid not in self._recompile_ids:
                    self._recompile_ids = (self._recompile_ids + [cid])[-MAX_FRAMES:]
            elif cid and getattr(m, "is_forward", None) is False and cid in self._recompile_ids:
                rsecs += s   # the backward graph of a recompile: part of what the recompile cost
            if limit:
                self.limit_top = {"function": fn[0], "where": fn[1]}
            if reason or limit:
                recompiles += bool(reason) and not limit
                entry = by_fn.setdefault(fn, [0, None, False])
                entry[0] += 1
                entry[1] = str(reason)[:MAX_REASON] if reason else entry[1]
                entry[2] = entry[2] or limit
        self.recompiles_total += recompiles
        self.limit_hits_total += limits
        top = None
        if by_fn:
            (name, where), (count, reason, limit) = max(by_fn.items(), key=lambda kv: kv[1][0])
            top = {"function": name, "where": where, "count": count, "reason": reason, "limit": limit}
        return {"n": n, "s": round(secs, 6), "rs": round(rsecs, 6), "recompiles": recompiles, "limit_hits": limits,
                "breaks": breaks, "top": top, "recompiles_total": self.recompiles_total,
                "limit_hits_total": self.limit_hits_total, "limit_top": self.limit_top}

    def _function(self, m) -> tuple:
        """(function, "file:line") of an entry; an entry without a name (a failed attempt) gets
        the one an earlier attempt of the same frame had."""
        cid = str(getattr(m, "compile_id", "") or "")
        frame = cid.strip("[]").split("/")[0] if cid else ""
        name, filename, line = (getattr(m, "co_name", None), getattr(m, "co_filename", None),
                                getattr(m, "co_firstlineno", None))
        if isinstance(name, str) and name:
            got = (name[:200], f"{filename}:{line}" if filename else None)
            if frame and (frame in self._frames or len(self._frames) < MAX_FRAMES):
                self._frames[frame] = got
            return got
        return self._frames.get(frame, (None, None))
