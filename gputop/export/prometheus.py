"""Prometheus export: a ``/metrics`` endpoint that serves a session's latest samples.

``gputop --pid PID --prometheus [HOST:]PORT`` (UI or ``--headless``) starts a
``PrometheusExporter``: a small threading HTTP server on its own thread serving
prometheus_client's WSGI app, with a private registry that holds one ``SessionCollector``. The collector reads the session's ``SampleStore``
only when Prometheus scrapes, so the exporter costs nothing between scrapes (no thread keeps
gauges up to date) and a scrape always sees the newest samples.

What is served (docs/prometheus.md lists every family with its labels and DCGM equivalent):
every number the sources measure (GPU, host, processes, threads), thread-state shares, probe
step timings and counters, one gauge per verdict id, and gputop's own health per source.
Units follow Prometheus conventions: ratios 0-1 (``*_ratio``), bytes, seconds, hertz; per-second
rates end in ``_per_second``; ``_total`` only for real counters. Values are the newest sample of
each series (for GPM fields the newest non-None one: GPM is read every 0.5 s, on about 1 GPU sample in 5). A
series whose source stopped sending (a process that exited, a stopped probe) disappears
after ``STALE_S``, and a value that is None is left out, never served as a zero.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterable

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

import gputop
from gputop.catalogue import (KIND_BUDGET, KIND_GPU, KIND_GPU_INFO, KIND_GPU_PROCS, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY,
                              KIND_PHASE, KIND_PROBE_STEP, KIND_PROBE_SYNC, KIND_PROC, KIND_PROC_INFO, KIND_RANK,
                              KIND_SYSTEM,
                              KIND_TARGET, KIND_THREAD, KIND_THREAD_STATE, KIND_VERDICT, KIND_VERDICT_PRIMARY,
                              MetricSpec)
from gputop.derive import budget as bd
from gputop.derive import efficiency as ef
from gputop.derive import phases as ph
from gputop.derive.budget_processor import PHASE_EVERY_S
from gputop.derive.threads import STATES, STATE_LABELS
from gputop.model import HEALTH_DEGRADED, HEALTH_OK, HEALTH_STATES, KIND_HEALTH
from gputop.sources import metric_specs
from gputop.sources.nvml_fields import CLOCK_EVENT_NAMES, ENERGY_EVERY_S, GPM_FIELDS, GPM_HOLD_S
from gputop.verdicts.registry import VERDICT_IDS
from gputop.export.http_server import (ANSWER_TIMEOUT_S, EXPORTER_SOURCE, HEALTH_EVERY_S, MAX_CONNECTIONS,
                                      REQUEST_TIMEOUT_S, ServerCollector, bind_problem, listen)

DEFAULT_HOST = "127.0.0.1"   # loopback unless the user says otherwise: metrics name processes
DEFAULT_PORT = 9464          # the port OpenTelemetry's Prometheus exporters use by convention
PREFIX = "gputop_"
STALE_S = 5.0                # a series not refreshed for this long is gone (sources send every <= 4 s)
GPM_MAX_AGE_S = GPM_HOLD_S   # newest non-None GPM value, at most this much older than its series
MAX_PARENT_HOPS = 16         # a process without its own rank inherits its nearest ancestor's


class ExporterError(Exception):
    """The exporter cannot listen where it was asked to. The message is one line for the user."""


# ---------------------------------------------------------------------------------------------
# What each sample field becomes: the catalogue's MetricSpecs with a Prometheus name (``prom``),
# scaled to base units by their unit (gputop.catalogue.UNIT_SCALE). The rest of this module is
# the fields that are not one family each: labels, clock events, GPU processes, thread states,
# verdicts, health.

PCT = 0.01

# GPM fields: read on about 1 GPU sample in 5 (every GPM_EVERY_S, 0.5 s), so the newest non-None value.
GPM_LATEST = frozenset({*GPM_FIELDS, "gpm_window_s"})
# Read by the NVML slow loop every ENERGY_EVERY_S (its 1 Hz ticks jittered up to 4 s, then carried
# by the next fast sample): the newest reading, served while younger than 2.5 of those intervals.
SLOW_GPU_FIELDS = {"energy_j": 2.5 * ENERGY_EVERY_S}

# Fields of the sources' METRICS (gputop.sources.metric_specs()) that are not numbers to plot.
NOT_EXPORTED = {
    ("gpu", "clock_events"): "a list of names: served one by one as gputop_gpu_clock_event{reason}",
    ("gpu_procs", "procs"): "a dict per PID: served as gputop_process_gpu_memory_bytes / _sm_utilization_ratio",
    ("stacks", "threads"): "stack samples: served through the thread states they give (gputop_thread_state_ratio)",
    ("thread_kernel", "threads"): "kernel wait counts: served through gputop_thread_state_ratio",
    ("probe_step", "flops_dtype"): "a name: the dtype label of gputop_mfu_ratio",
    ("probe_step", "flops_by_dtype"): "a dict per dtype: gputop_mfu_ratio divides by its weighted peak",
    ("probe_step", "flops_step"): "which step was counted: not a quantity over time",
    ("probe_step", "flops_varies"): "a flag: the Steps view and the report say it",
    ("probe_step", "flops_off"): "words (why no count): the Steps view and the report say them",
    ("probe_step", "kernel_sample_age_s"): "the kernel trace's age: how old gputop_probe_kernel_seconds_per_step is",
    ("probe_step", "kernel_off"): "words (why no kernel trace): the Steps view says them",
}

# thread_state fields: one family with a "state" label (and the CPU share), built in _threads.
THREAD_STATE_FIELDS = {**{f"{s}_pct": "thread_state_ratio" for s in STATES},
                       "cpu_pct": "thread_state_cpu_seconds_per_second"}

_exported_by_kind: dict[str, list[MetricSpec]] | None = None


def exported_specs(kind: str) -> list[MetricSpec]:
    """The catalogue's fields of ``kind`` that are one family each, in catalogue order."""
    global _exported_by_kind
    if _exported_by_kind is None:
        by_kind: dict[str, list[MetricSpec]] = {}
        for m in metric_specs():
            if m.prom and m.kind != KIND_THREAD_STATE:
                by_kind.setdefault(m.kind, []).append(m)
        _exported_by_kind = by_kind
    return _exported_by_kind.get(kind, [])


def _family_name(m: MetricSpec) -> str:
    return PREFIX + m.prom + ("_total" if m.counter else "")


def exported_fields() -> dict[tuple[str, str], str]:
    """(kind, field) -> metric name, for every sample field this module serves (tests, docs)."""
    out = {(m.kind, m.field): _family_name(m) for m in metric_specs() if m.prom and m.kind != KIND_THREAD_STATE}
    for field, name in THREAD_STATE_FIELDS.items():
        out[(KIND_THREAD_STATE, field)] = PREFIX + name
    return out


# ---------------------------------------------------------------------------------------------
# Building the families from a store


def _help(m: MetricSpec) -> str:
    dcgm = f" DCGM: {m.dcgm}." if m.dcgm else ""
    return f"{m.prom_help}{dcgm} (gputop {m.kind}.{m.field})"


def _add_fields(fams: "_Families", kind: str, labels: dict[str, str], data) -> None:
    """One series per exported field of ``kind``, from a sample's data."""
    for m in exported_specs(kind):
        fams.add(m.prom, _help(m), labels, data.get(m.field), m.scale, counter=m.counter)


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


class _Families:
    """Families by name, created on first use, so only those with samples are served."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[GaugeMetricFamily | CounterMetricFamily, list[str]]] = {}

    def add(self, name: str, help_: str, labels: dict[str, str], value, scale: float = 1,
            counter: bool = False) -> None:
        v = _num(value)
        if v is None:
            return  # None is "no value": the series is left out, never served as 0
        got = self._by_name.get(name)
        if got is None:
            cls = CounterMetricFamily if counter else GaugeMetricFamily
            got = self._by_name[name] = (cls(PREFIX + name, help_, labels=list(labels)), list(labels))
        fam, names = got
        if scale != 1:
            v = float(f"{v * scale:.12g}")  # 0.191, not 0.19100000000000003
        fam.add_metric([labels[k] for k in names], v)

    def __iter__(self):
        return iter(fam for fam, _names in self._by_name.values())


def _fresh(sample, now: float, max_age: float = STALE_S) -> bool:
    return sample is not None and now - sample.t <= max_age


def _ranks(store) -> dict[str, str]:
    """PID -> rank ("" when unknown). A process without a rank of its own (a DataLoader worker)
    has the rank of its nearest ancestor that has one."""
    own: dict[str, str] = {}
    for kind in (KIND_RANK, KIND_PROBE_STEP, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY):
        for pid, s in store.latest_of_kind(kind).items():
            r = s.data.get("rank")
            if r is not None and not isinstance(r, bool) and pid not in own:
                own[pid] = str(r)
    parent: dict[str, str] = {}
    for kind in (KIND_PROC_INFO, KIND_PROC):
        for pid, s in store.latest_of_kind(kind).items():
            pp = s.data.get("ppid")
            if isinstance(pp, int) and not isinstance(pp, bool):
                parent[pid] = str(pp)

    def rank_of(pid: str) -> str:
        p = pid
        for _ in range(MAX_PARENT_HOPS):
            if p in own:
                return own[p]
            p = parent.get(p)
            if p is None:
                break
        return ""

    return {pid: rank_of(pid) for pid in set(own) | set(parent)}


def derived_stale_s(derive_every_s: float) -> float:
    """How old the processors' newest output (the time budget, thread states, verdicts) may be
    and still be served: ``STALE_S`` at their 1 s cadence (the budget every 2 s and the thread
    states every 4 s while the job is calm: derive/stacks_window.works_now; the thread states get
    2 s more), longer when they run less often (the node agent's every 4 s: 8 s). A shorter limit would drop an active verdict from every other
    scrape between two runs, and Prometheus would restart an alert's ``for:`` each time."""
    return STALE_S + max(0.0, derive_every_s - 1.0)


def collect_families(store, now: float, meta: dict, mode: str = "live", derive_every_s: float = 1.0) -> list:
    """Every metric family of the session's current state (what one scrape serves).
    ``derive_every_s``: how often the session's processors run (see ``derived_stale_s``)."""
    fams = _Families()
    derived = derived_stale_s(derive_every_s)
    host = str(meta.get("host") or socket.gethostname())
    target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    target_pid = str(target.get("pid", "")) if target.get("pid") is not None else ""
    ranks = _ranks(store)

    def rank(pid: str) -> str:
        return ranks.get(pid, "")

    fams.add("info", "gputop itself: version, the watched PID and its process name, live or replay. Always 1.",
             {"host": host, "version": gputop.__version__, "pid": target_pid,
              "target": str(target.get("name") or ""), "mode": mode}, 1)
    if isinstance(meta.get("start_wall"), (int, float)):
        fams.add("session_start_timestamp_seconds", "When this gputop session started (Unix time).",
                 {"host": host}, meta["start_wall"])
    for pid, s in store.latest_of_kind(KIND_TARGET).items():
        fams.add("target_running", "1 while the watched process runs, 0 once it exited.",
                 {"host": host, "pid": pid}, 1 if s.data.get("state") == "running" else 0)

    for pid, s in store.latest_of_kind(KIND_RANK).items():
        d = s.data
        if d.get("state", "running") != "running" or d.get("rank") is None:
            continue
        fams.add("rank_info", "A rank process of a distributed job in the watched tree (from its environment or "
                 "the probe), while it runs. Always 1. (gputop rank)",
                 {"host": host, "pid": pid, "rank": str(d.get("rank")),
                  "local_rank": "" if d.get("local_rank") is None else str(d.get("local_rank")),
                  "world_size": "" if d.get("world_size") is None else str(d.get("world_size"))}, 1)

    _gpu(fams, store, now, host, rank)
    _system(fams, store, now, host)
    _procs(fams, store, now, host, rank)
    _threads(fams, store, now, host, rank, derived)
    _probe(fams, store, now, host, rank)
    _budget(fams, store, now, host, target_pid, derived)
    _efficiency(fams, store, now, host, rank)
    _verdicts(fams, store, now, host, target_pid, meta, derived)
    _health(fams, store, host)
    return list(fams)


def _gpu(fams: _Families, store, now: float, host: str, rank) -> None:
    infos = store.latest_of_kind(KIND_GPU_INFO)

    def labels(idx: str) -> dict[str, str]:
        info = infos.get(idx)
        d = info.data if info is not None else {}
        return {"host": host, "gpu": idx, "gpu_uuid": str(d.get("uuid") or ""), "gpu_name": str(d.get("name") or "")}

    for idx, info in infos.items():
        d = info.data
        fams.add("gpu_info", "Static facts of a GPU as labels (driver, PCI bus id, GPM support). Always 1.",
                 {**labels(idx), "driver": str(d.get("driver") or ""), "pci_bus_id": str(d.get("pci_bus_id") or ""),
                  "gpm": "1" if d.get("gpm") else "0"}, 1)
        if d.get("watched") is not None:
            fams.add("gpu_watched", "1 when gputop samples this GPU (it runs the target's processes, or --gpu).",
                     labels(idx), 1 if d.get("watched") else 0)
    for idx, s in store.latest_of_kind(KIND_GPU).items():
        if not _fresh(s, now):
            continue
        lab = labels(idx)
        for m in exported_specs(KIND_GPU):
            if m.field in GPM_LATEST:
                v = store.latest_value(KIND_GPU, idx, m.field, max_age_s=GPM_MAX_AGE_S)
            elif m.field in SLOW_GPU_FIELDS:
                v = store.latest_value(KIND_GPU, idx, m.field, max_age_s=SLOW_GPU_FIELDS[m.field])
            else:
                v = s.data.get(m.field)
            fams.add(m.prom, _help(m), lab, v, m.scale, counter=m.counter)
        events = s.data.get("clock_events")
        if isinstance(events, list):
            for reason in CLOCK_EVENT_NAMES:
                fams.add("gpu_clock_event",
                         "1 while this reason holds the clocks below their maximum (NVML clock-event reasons), "
                         "for every known reason. DCGM: the bits of DCGM_FI_DEV_CLOCKS_EVENT_REASONS (field 112).",
                         {**lab, "reason": reason}, 1 if reason in events else 0)
    for idx, s in store.latest_of_kind(KIND_GPU_PROCS).items():
        if not _fresh(s, now):
            continue
        lab = labels(idx)
        procs = s.data.get("procs")
        if isinstance(procs, dict):
            for pid, p in procs.items():
                if not isinstance(p, dict):
                    continue
                plab = {"host": host, "gpu": idx, "gpu_uuid": lab["gpu_uuid"], "pid": str(pid), "rank": rank(str(pid))}
                fams.add("process_gpu_memory_bytes",
                         "GPU memory used by one process of the target's tree on this GPU, in bytes "
                         "(NVML compute processes). (gputop gpu_procs.procs[pid].mem)", plab, p.get("mem"))
                fams.add("process_gpu_sm_utilization_ratio",
                         "Share of time a kernel of this process ran on this GPU (NVML process utilization "
                         "smUtil, time-based like gputop_gpu_utilization_ratio), 0-1. (gputop gpu_procs.procs[pid].sm_pct)",
                         plab, p.get("sm_pct"), PCT)
        _add_fields(fams, KIND_GPU_PROCS, lab, s.data)


def _system(fams: _Families, store, now: float, host: str) -> None:
    for _key, s in store.latest_of_kind(KIND_SYSTEM).items():
        if not _fresh(s, now):
            continue
        _add_fields(fams, KIND_SYSTEM, {"host": host}, s.data)


def _procs(fams: _Families, store, now: float, host: str, rank) -> None:
    for pid, s in store.latest_of_kind(KIND_PROC).items():
        if not _fresh(s, now):
            continue
        lab = {"host": host, "pid": pid, "rank": rank(pid), "role": str(s.data.get("role") or "")}
        _add_fields(fams, KIND_PROC, lab, s.data)


THREAD_STATE_HELP = ("Share of the last ~10 s a thread of the target spent in each state, 0-1 (py-spy frames + "
                     "kernel wait states; absent where a share cannot be known). States: "
                     + "; ".join(f"{k} = {STATE_LABELS[k]}" for k in STATES) + ". (gputop thread_state.<state>_pct)")


def _threads(fams: _Families, store, now: float, host: str, rank, derived: float = STALE_S) -> None:
    for key, s in store.latest_of_kind(KIND_THREAD).items():
        if not _fresh(s, now):
            continue
        pid, _, tid = key.partition(":")
        lab = {"host": host, "pid": pid, "tid": tid, "thread": str(s.data.get("name") or ""), "rank": rank(pid)}
        _add_fields(fams, KIND_THREAD, lab, s.data)
    states = store.latest_of_kind(KIND_THREAD_STATE)
    newest = max((s.t for s in states.values()), default=None)
    for key, s in states.items():
        # Only the processor's latest run: a thread missing from it has ended or gone quiet.
        if not _fresh(s, now, derived + 2.0) or s.t < newest - 0.5:
            continue
        d = s.data
        pid, _, tid = key.partition(":")
        lab = {"host": host, "pid": pid, "tid": tid, "thread": str(d.get("name") or d.get("comm") or ""),
               "role": str(d.get("role") or ""), "rank": rank(pid)}
        for st in STATES:
            fams.add("thread_state_ratio", THREAD_STATE_HELP, {**lab, "state": st}, d.get(f"{st}_pct"), PCT)
        fams.add("thread_state_cpu_seconds_per_second",
                 "On-CPU time of the thread per wall second over the thread-state window (schedstat). "
                 "(gputop thread_state.cpu_pct)", lab, d.get("cpu_pct"), PCT)


def _probe(fams: _Families, store, now: float, host: str, rank) -> None:
    steps = store.latest_of_kind(KIND_PROBE_STEP)
    for pid, s in steps.items():
        if not _fresh(s, now):
            continue
        lab = {"host": host, "pid": pid, "rank": rank(pid)}
        _add_fields(fams, KIND_PROBE_STEP, lab, s.data)
        sync = store.latest(KIND_PROBE_SYNC, pid)  # sent on change only: valid while the probe reports
        if sync is not None:
            _add_fields(fams, KIND_PROBE_SYNC, lab, sync.data)
    for pid, s in store.latest_of_kind(KIND_PROBE_MEMORY).items():
        if not _fresh(s, now):
            continue
        dev = s.data.get("device")
        lab = {"host": host, "pid": pid, "rank": rank(pid), "cuda_device": "" if dev is None else str(dev)}
        _add_fields(fams, KIND_PROBE_MEMORY, lab, s.data)


def _efficiency(fams: _Families, store, now: float, host: str, rank) -> None:
    """FLOP/s, MFU and energy per step over the newest 10 s (gputop/derive/efficiency.py, its METRICS)."""
    res = ef.live(store, now)
    specs = {m.field: m for m in ef.METRICS}

    def add(field: str, labels: dict[str, str], v) -> None:
        m = specs[field]
        fams.add(m.prom, f"{m.prom_help} (gputop efficiency.{field})", labels, v, m.scale)

    for r in res["ranks"]:
        lab = {"host": host, "pid": r["pid"], "rank": rank(r["pid"])}
        ach = r.get("achieved_tflops")
        add("achieved_flops_per_s", lab, ach * 1e12 if ach is not None else None)
        add("mfu", {**lab, "dtype": str(r.get("dtype") or "")}, r.get("mfu"))
    for g in res["gpus"]:
        add("joules_per_step", {"host": host, "gpu": g["gpu"], "method": str(g.get("method") or "")},
            g.get("joules_per_step"))
    add("joules_per_sample", {"host": host, "method": str(res.get("energy_method") or "")}, res.get("joules_per_sample"))


BUDGET_HELP = ("Share of the training loop's wall time over the last window (up to 20 s of the current phase), "
               "0-1, summing to 1 over the categories: " + "; ".join(f"{c} = {bd.LABELS[c]} ({bd.HELP[c]})"
                                                                      for c in bd.CATEGORIES)
               + ". gpu_busy is absent without GPU counters. (gputop budget/window shares)")
PHASE_HELP = ("The job's phase now: 1 for the current one (" + ", ".join(f"{p} = {ph.LABELS[p]}" for p in ph.PHASES)
              + "); verdicts judge " + ", ".join(ph.JUDGED) + " only. (gputop phase.phase)")


def _budget(fams: _Families, store, now: float, host: str, target_pid: str, derived: float = STALE_S) -> None:
    """The latest window budget (one series per category) and the current phase."""
    s = store.latest(KIND_BUDGET, "window")
    window = s.data if _fresh(s, now, derived) and isinstance(s.data, dict) else None
    pid = str(window.get("pid") or target_pid) if window is not None else target_pid
    if window is not None:
        shares = window.get("shares") if isinstance(window.get("shares"), dict) else {}
        for c in bd.CATEGORIES:
            fams.add("time_budget_share", BUDGET_HELP, {"host": host, "pid": pid, "category": c}, shares.get(c))
    # the phase: the window's (every second, 2 s while calm) when there is one, else the phase sample (sent on
    # change and every 10 s; "ended" stays true once the job ended)
    phase = window.get("phase") if window is not None else None
    if not phase:
        p = store.latest(KIND_PHASE, "main")
        if p is not None and isinstance(p.data, dict) and (
                _fresh(p, now, PHASE_EVERY_S + STALE_S) or p.data.get("phase") == ph.ENDED):
            phase = p.data.get("phase")
    if isinstance(phase, str) and phase:
        fams.add("phase_info", PHASE_HELP, {"host": host, "pid": pid, "phase": phase}, 1)


def _verdicts(fams: _Families, store, now: float, host: str, target_pid: str, meta: dict,
              derived: float = STALE_S) -> None:
    primary = store.latest(KIND_VERDICT_PRIMARY, "primary")
    if not _fresh(primary, now, derived):
        return  # the verdict engine is not running: no verdict is known, so none is served as 0
    latest = store.latest_of_kind(KIND_VERDICT)
    ids = list(VERDICT_IDS) + sorted(set(latest) - set(VERDICT_IDS))
    start_wall = meta.get("start_wall") if isinstance(meta.get("start_wall"), (int, float)) else None
    primary_id = primary.data.get("id")
    for vid in ids:
        s = latest.get(vid)
        active = bool(s is not None and _fresh(s, now, derived) and s.data.get("active"))
        lab = {"host": host, "pid": target_pid, "verdict": vid}
        fams.add("verdict_active", "1 while this bottleneck verdict is active, 0 otherwise; one series per known "
                 "verdict id (docs/verdicts.md). (gputop verdict.active)", lab, 1 if active else 0)
        fams.add("primary_verdict", "1 for the verdict that best explains lost throughput now, 0 for the others "
                 "(all 0 while none is established). (gputop verdict_primary.id)", lab, 1 if vid == primary_id else 0)
        if not active:
            continue
        d = s.data
        fams.add("verdict_lost_share_ratio", "Estimated share of step time this active verdict's cause costs, 0-1. "
                 "(gputop verdict.lost_share)", lab, d.get("lost_share"))
        fams.add("verdict_fix_gain_ratio", "The speed-up removing this active verdict's cause would bring, as a "
                 "fraction of steps/s (0.25: up to +25%); absent for a verdict about the GPU's state. "
                 "(gputop verdict.gain)", lab, d.get("gain"))
        fams.add("verdict_confidence_ratio", "Confidence of this active verdict, 0-1 (lower when it had to work "
                 "without some sources). (gputop verdict.confidence)", lab, d.get("confidence"))
        fams.add("verdict_level", "The active verdict's main measure divided by its threshold (>= 1 holds). "
                 "(gputop verdict.level)", lab, d.get("level"))
        since = _num(d.get("since"))
        if start_wall is not None and since is not None:
            fams.add("verdict_active_since_timestamp_seconds", "When this active verdict turned on (Unix time). "
                     "(gputop verdict.since)", lab, start_wall + since)


def _health(fams: _Families, store, host: str) -> None:
    # Health samples come on change and every ~5 s: the newest one is the current state, whatever its age.
    for source, s in sorted(store.latest_of_kind(KIND_HEALTH).items()):
        state = s.data.get("state")
        lab = {"host": host, "source": source}
        fams.add("source_up", "1 while this gputop source or processor produces samples (health ok or degraded), "
                 "0 when it failed or is off (its health message says why). (gputop health.state)",
                 lab, 1 if state in (HEALTH_OK, HEALTH_DEGRADED) else 0)
        for st in HEALTH_STATES:
            fams.add("source_state", "Health state of this gputop source: 1 for the current state "
                     f"({', '.join(HEALTH_STATES)}). (gputop health.state)", {**lab, "state": st}, 1 if st == state else 0)
        fams.add("source_rate_hertz", "Measured sampling rate of this gputop source, in hertz. (gputop health.rate_hz)",
                 lab, s.data.get("rate_hz"))


# ---------------------------------------------------------------------------------------------
# The collector and the HTTP server


class SessionCollector:
    """A prometheus_client collector over a session (live or replay): reads its store at scrape time."""

    def __init__(self, session=None) -> None:
        self.session = session
        self.errors = 0
        self.last_error: str | None = None

    def collect(self) -> Iterable:
        session = self.session
        if session is None:
            return []
        mode = "live" if getattr(session, "playback", None) is None else "replay"
        try:
            return collect_families(session.store, session.now(), dict(session.meta), mode)
        except Exception as e:  # a bug here must not take the session (or the UI's screen) with it
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            fam = CounterMetricFamily(PREFIX + "exporter_errors", "Scrapes that failed inside gputop's "
                                      "exporter (a bug: please report it with the error label).", labels=["error"])
            fam.add_metric([self.last_error[:200]], self.errors)
            return [fam]


def parse_address(text: str) -> tuple[str, int]:
    """``--prometheus [HOST:]PORT`` -> (host, port); host defaults to 127.0.0.1. ValueError (one
    line for the user) for anything else."""
    usage = "give [HOST:]PORT, for example 9464 (this machine only) or 0.0.0.0:9464 (all interfaces)"
    t = (text or "").strip()
    if not t:
        raise ValueError(f"--prometheus needs an address: {usage}")
    if "://" in t or "/" in t:
        raise ValueError(f"--prometheus takes HOST:PORT, not a URL ({text!r}): {usage}")
    if t.startswith("["):  # [IPv6]:PORT
        host, sep, port = t[1:].partition("]")
        if not sep or not port.startswith(":") or not host:
            raise ValueError(f"--prometheus {text!r}: an IPv6 address goes in brackets, e.g. [::1]:9464")
        port = port[1:]
    elif t.count(":") == 0:
        host, port = DEFAULT_HOST, t
    elif t.count(":") == 1:
        host, port = t.split(":")
        if not host:
            raise ValueError(f"--prometheus {text!r} has no host: {usage}")
    else:
        raise ValueError(f"--prometheus {text!r}: an IPv6 address goes in brackets, e.g. [::1]:9464")
    if not port.isdigit():
        raise ValueError(f"--prometheus {text!r}: the port must be a number: {usage}")
    n = int(port)
    if not 1 <= n <= 65535:
        raise ValueError(f"--prometheus {text!r}: the port must be between 1 and 65535")
    if any(c.isspace() for c in host):
        raise ValueError(f"--prometheus {text!r}: the host has a space in it")
    return host, n



class PrometheusExporter:
    """Listens at once (so a port in use is reported before anything else starts); serves the
    session given to ``serve`` on ``/metrics``. Port 0 picks a free port (tests, benchmarks)."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, session=None, *,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, answer_timeout_s: float = ANSWER_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, collector=None) -> None:
        # collector: another source of families (the node agent's, over many sessions)
        self.collector = collector if collector is not None else SessionCollector(session)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        # gputop's own CPU and memory, so a dashboard shows what watching costs.
        ProcessCollector(namespace="gputop_self", registry=self.registry)
        # No gzip: metrics go to a Prometheus on this machine or the cluster network, where
        # ~60 KB per scrape is nothing and compressing it costs gputop ~2 ms of CPU per scrape.
        self._metrics_app = make_wsgi_app(self.registry, disable_compression=True)
        try:
            self._server = listen(host, port)
        except OSError as e:  # socket.gaierror is an OSError too
            raise ExporterError(bind_problem(host, port, e)) from None
        self._server.set_app(self._app)
        self._server.request_timeout_s = request_timeout_s
        self._server.answer_timeout_s = max(answer_timeout_s, request_timeout_s)
        self._server.max_connections = max(1, max_connections)
        self._server.on_tick = self._maybe_health
        self.registry.register(ServerCollector(self._server))
        self.host = host
        self.port = self._server.server_address[1]
        self._stopping = threading.Event()
        self._health_said: tuple | None = None
        self._health_at = 0.0
        self._thread = threading.Thread(target=self._serve_forever, name="gputop-prometheus", daemon=True)
        self._thread.start()

    def _serve_forever(self) -> None:
        """serve_forever, restarted after anything it raises (it says so in health): the
        exporter may stop answering for a moment, but never takes the session with it."""
        while not self._stopping.is_set():
            try:
                self._server.serve_forever()
                return   # stop() was called
            except Exception as e:
                self._server.stats["errors"] += 1
                self._server.last_error = f"server thread: {type(e).__name__}: {e}"[:200]
                self._stopping.wait(0.5)

    def health(self) -> dict:
        """What the exporter's ``health`` sample (source "exporter") says now."""
        from gputop.model import health_data
        srv = self._server
        st = dict(srv.stats)
        closed = st["evicted"] + st["timed_out"]
        state, msg = HEALTH_OK, f"serving {self.url}"
        if closed:
            msg += (f"; closed {closed} connection(s) before answering ({st['evicted']} idle evicted at the cap of "
                    f"{srv.max_connections}, {st['timed_out']} too slow)")
        if st["errors"] or st["accept_errors"]:
            state = HEALTH_DEGRADED
            msg += f"; {st['errors'] + st['accept_errors']} error(s), the last: {srv.last_error}"
        return health_data(state, msg, rate_hz=None, connections=srv.open_connections(), **st)

    def _maybe_health(self) -> None:
        """On the server thread (every 0.5 s): a health sample on change and every 5 s."""
        from gputop.model import Sample
        session = getattr(self.collector, "session", None)
        bus = getattr(session, "bus", None)
        if bus is None or getattr(session, "playback", None) is not None:
            return   # a replay's store holds only the recording's health
        now = time.monotonic()
        st = self._server.stats
        key = (st["errors"], st["accept_errors"], st["evicted"] + st["timed_out"] > 0)
        # on change (at most once a second) and every 5 s, like the sources' health
        if not (now - self._health_at >= HEALTH_EVERY_S or (key != self._health_said and now - self._health_at >= 1.0)):
            return
        self._health_said, self._health_at = key, now
        try:
            bus.publish(Sample(session.now(), KIND_HEALTH, EXPORTER_SOURCE, self.health()))
        except Exception:
            pass   # the session is stopping

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/metrics"

    def _app(self, environ, start_response):
        # Always the classic text format (0.0.4), even when the scraper prefers OpenMetrics as
        # Prometheus does: prometheus_client renders it in half the CPU time, and for gauges and
        # counters without exemplars both formats say exactly the same.
        environ["HTTP_ACCEPT"] = "text/plain;version=0.0.4"
        return self._metrics_app(environ, start_response)

    def serve(self, session) -> None:
        self.collector.session = session

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2)
