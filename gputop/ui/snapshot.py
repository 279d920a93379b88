"""The one object a UI tick hands to every panel: the session's state at that moment.

Panels are dumb: ``Panel.update_view(snapshot)`` turns a Snapshot into text. The snapshot
reads the store lazily and caches what it read, so two panels that draw the same series pay
for it once per tick.
"""

from __future__ import annotations

import math
from typing import Any

from gputop.model import Sample
from gputop.session.whole_replay import recorded_kind
from gputop.sources.nvml_fields import GPM_HOLD_S, HELD_FIELDS
from gputop.ui.fmt import HOLD_S, cell_means

# Snapshot.current: a field the newest sample left None is shown from an older one this recent
# (the cheap counters come at 10 Hz, 2.5 Hz while the job is calm: gaps of at most 4 intervals,
# 1.6 s), or GPM_HOLD_S for the fields read less often than that.
CURRENT_HOLD_S = 2.0
HELD_LONGER = HELD_FIELDS
# sparkline cells: these fields hold GPM_HOLD_S, the others ui/fmt.HOLD_S (GPM's calm snapshots
# are up to ~3.6 s apart)
_LONGER = (HELD_LONGER, GPM_HOLD_S)


def key_order(key: str):
    """Sort keys numerically where they are numbers ("2" < "10"), else as text."""
    try:
        return (0, tuple(int(p) for p in key.split(":")), "")
    except ValueError:
        return (1, (), key)


class Snapshot:
    def __init__(self, session: Any, history_s: float = 60.0, cell_cache: dict | None = None,
                 job_log: Any = None) -> None:
        store = session.store
        self.job_log = job_log  # joblog.LogTail of the job's output (gputop run), or None
        self.session = session
        self.store = store
        self.generation = store.generation
        self.now: float = session.now()
        self.meta: dict = session.meta or {}
        self.history_s = history_s
        self.kinds = frozenset(store.kinds())
        self.playback = getattr(session, "playback", None)
        self._latest_of_kind: dict[str, dict[str, Sample]] = {}
        self._series: dict[tuple[str, str], list[Sample]] = {}
        self._cells: dict[tuple, dict[str, list]] = {}
        # Sparkline cells that outlive the tick (owned by the app): only the newest cell changes
        # until time crosses into the next one, so most ticks recompute one cell, not sixty.
        self._cell_cache = cell_cache

    # -- reading -------------------------------------------------------------------------------
    def latest_of_kind(self, kind: str) -> dict[str, Sample]:
        got = self._latest_of_kind.get(kind)
        if got is None:
            got = self._latest_of_kind[kind] = self.store.latest_of_kind(kind)
        return got

    def latest(self, kind: str, key: str) -> Sample | None:
        return self.latest_of_kind(kind).get(key)

    def current(self, kind: str, key: str, max_age_s: float = CURRENT_HOLD_S) -> dict:
        """The newest values of one series: the latest sample's data, with fields it left None
        filled from samples at most ``max_age_s`` older, GPM_HOLD_S for the fields read less
        often than the sample (HELD_LONGER): GPM counters are read every GPM_EVERY_S (0.5 s),
        so about 4 in 5 "gpu" samples carry None for them, and PCIe without GPM comes once a
        second; without this the panels would flicker between a number and n/a."""
        latest = self.latest(kind, key)
        if latest is None:
            return {}
        data = dict(latest.data)
        missing = [k for k, v in data.items() if v is None]
        if missing:
            longest = max(max_age_s, GPM_HOLD_S) if any(k in HELD_LONGER for k in missing) else max_age_s
            for s in reversed(self.store.series(kind, key, latest.t - longest)):
                age = latest.t - s.t
                for k in [k for k in missing if s.data.get(k) is not None
                          and (age <= max_age_s or k in HELD_LONGER)]:
                    data[k] = s.data[k]
                    missing.remove(k)
                if not missing:
                    break
        return data

    def keys(self, kind: str) -> list[str]:
        return sorted(self.latest_of_kind(kind), key=key_order)

    def series(self, kind: str, key: str) -> list[Sample]:
        """The samples of one series inside the history window (for sparklines)."""
        got = self._series.get((kind, key))
        if got is None:
            got = self._series[(kind, key)] = self.store.series(kind, key, self.now - self.history_s)
        return got

    def cells(self, kind: str, key: str, fields: tuple[str, ...], width: int) -> dict[str, list]:
        """Sparkline cells of several fields of one series over the history window, in one pass
        (see fmt.cell_means); cached for the tick."""
        ck = (kind, key, fields, width)
        got = self._cells.get(ck)
        if got is None:
            got = self._cells[ck] = self._cells_now(kind, key, fields, width)
        return got

    def _cells_now(self, kind: str, key: str, fields: tuple[str, ...], width: int) -> dict[str, list]:
        cache = self._cell_cache
        if cache is None or width <= 1:
            return cell_means(self.series(kind, key), fields, self.now, self.history_s, width, longer=_LONGER)
        cell = self.history_s / width
        idx = math.floor(self.now / cell)
        ck = (kind, key, fields, width, self.history_s)
        hit = cache.get(ck)
        if hit is not None and hit[0] == idx and hit[1] <= self.now:
            # Same newest cell as last time and time went forward: only that cell can differ.
            # It is recomputed with the few cells before it that its held value can come from
            # (a cell without samples holds the previous cell's mean for up to HOLD_S, GPM_HOLD_S
            # for the fields read less often).
            hold = max(HOLD_S, GPM_HOLD_S) if any(f in HELD_LONGER for f in fields) else HOLD_S
            k = min(width, math.ceil(hold / cell) + 2)
            recent = self.store.series(kind, key, (idx - k + 1) * cell - hold)
            tail = cell_means(recent, fields, self.now, k * cell, k, longer=_LONGER)
            got = {f: hit[2][f][:-1] + tail[f][-1:] for f in fields}
        else:
            got = cell_means(self.series(kind, key), fields, self.now, self.history_s, width, longer=_LONGER)
        cache[ck] = (idx, self.now, got)
        if len(cache) > 512:  # series come and go (processes): keep it bounded
            cache.pop(next(iter(cache)))
        return got

    def is_stale(self, sample: Sample | None, max_age_s: float = 3.0) -> bool:
        return sample is None or self.now - sample.t > max_age_s

    # -- what a panel may know of the session ---------------------------------------------------
    @property
    def replay_path(self) -> str | None:
        """The file a replay plays (None live)."""
        return getattr(self.session, "replay_path", None) if self.playback is not None else None

    @property
    def recording_path(self) -> str | None:
        """The file a live session records to (None when it records nothing, and in a replay)."""
        return getattr(self.session, "recording_path", None)

    @property
    def recording_error(self) -> str | None:
        return getattr(self.session, "recording_error", None)

    def computes(self, kind: str) -> bool:
        """Whether this session's processors compute ``kind`` (live, or again in a replay)."""
        return kind in (getattr(self.session, "derived_kinds", None) or ())

    @staticmethod
    def recorded_kind(kind: str) -> str:
        """The kind under which a replay keeps what the file recorded of a kind it computes."""
        return recorded_kind(kind)

    def replay_whole_file(self, processors: list, kinds=None, *, progress=None, cancel=None):
        """The whole replayed file through fresh ``processors`` (session/whole_replay.py:
        ``WholeReplay``); slow: call it from a worker thread, never from ``draw``. None live."""
        run = getattr(self.session, "replay_whole_file", None)
        if self.playback is None or run is None:
            return None
        return run(processors, kinds, progress=progress, cancel=cancel)

    # -- facts several panels need -----------------------------------------------------------
    @property
    def target(self) -> dict:
        t = self.meta.get("target")
        return t if isinstance(t, dict) else {}

    @property
    def target_pid(self) -> str | None:
        pid = self.target.get("pid")
        return None if pid is None else str(pid)

    def target_exit(self) -> Sample | None:
        """The target's ``target`` sample when it says the target has exited, else None."""
        pid = self.target_pid
        samples = self.latest_of_kind("target")
        s = samples.get(pid) if pid is not None else None
        if s is None and samples:  # meta without a pid: any exited target counts
            s = max(samples.values(), key=lambda x: x.t)
        if s is not None and s.get("state") == "exited":
            return s
        return None

    def health(self) -> dict[str, Sample]:
        return self.latest_of_kind("health")

    def source_state(self, name: str) -> dict | None:
        """What is known of a source's health: its latest health sample, else what the session
        said of it at the start (``meta["sources"]``; a replay at its first instant has not read
        a health sample yet). None when the session has no such source."""
        h = self.health().get(name)
        if h is not None:
            return dict(h.data)
        described = (self.meta.get("sources") or {}).get(name)
        return dict(described) if isinstance(described, dict) else None

    def gpu_na(self, key: str) -> dict[str, str]:
        info = self.latest("gpu_info", key)
        na = info.get("na") if info is not None else None
        return na if isinstance(na, dict) else {}

    def why_missing(self, key: str, name: str) -> str:
        """Why a GPU field has no value: the source's stated reason, else its health."""
        reason = self.gpu_na(key).get(name)
        if reason:
            return f"n/a: {reason}"
        h = self.source_state("nvml")
        if h is not None and h.get("state") in ("failed", "degraded") and h.get("message"):
            return f"n/a: {h.get('message')}"
        return "n/a"
