"""Ranks joined with what the other sources say about them: one row per rank process.

Pure functions over samples (live store or a recording); nothing here does I/O.

``rank_table(source, now)`` -- the rows the Ranks view draws and the straggler verdict reads.
``source`` is a ``SampleStore`` (live or replay) or a plain list of samples (then only samples
with ``t <= now`` count). One row per ``rank`` sample key (a rank *process*: after an elastic
restart the old process's row says "exited" and the new one's "running"), sorted by rank,
running before exited. Every value is None where it is not known; nothing is a stand-in zero.

| field | from |
|---|---|
| rank, local_rank, world_size, local_world_size, node, source, launcher_pid, restart_count, name, why | the ``rank`` sample (gputop/sources/ranks.py) |
| pid, state, t | the ``rank`` sample: "running" or "exited"; t = when it was last said |
| gpu, gpu_from, gpus, gpu_mem | NVML ``gpu_procs``: the GPU(s) whose compute processes include the PID (``gpu`` = the one where it holds most memory, ``gpu_from`` "nvml"); else the environment's ``gpu_hint`` (CUDA_VISIBLE_DEVICES / LOCAL_RANK, an index or a UUID matched against ``gpu_info``) when the session has GPUs at all (``gpu_from`` "env"); else None |
| sm_active, util_gpu | the newest non-None value of that GPU's ``gpu`` series (``SampleStore.latest_value``) -- the whole GPU, shared by every rank on it |
| steps_per_s, step_ms, data_wait_share, collective_wait_share, collective_ms | the newest ``probe_step`` window of the PID (in-process probe; the collective fields only where it times DDP/FSDP collectives) |
| gil_pct, data_pct, cuda_pct, collective_pct, running_pct, idle_pct, cpu_wait_pct, unknown_pct, thread_cpu_pct, where | ``thread_state`` "PID:PID": the rank's main thread over the last 10 s (py-spy + kernel; gputop/derive/threads.py) |
| cpu_pct | ``proc``: the whole process's CPU (100 = one core) |

A running rank's values must be fresh (``FRESH_S``: GPU 3 s, probe 5 s, thread states 12 s,
process 4 s, measured back from ``now``); an exited rank's are its last ones before it ended.
"""

from __future__ import annotations

import math

from gputop.model import KIND_GPU, KIND_GPU_INFO, KIND_GPU_PROCS, KIND_PROC, Sample
from gputop.derive.steps import pool_collectives
from gputop.session.store import SampleStore
from gputop.sources.nvml_fields import GPM_HOLD_S   # GPM values come every 0.5 s (2 s while calm)
from gputop.sources.ranks import KIND_RANK, STATE_EXITED, STATE_RUNNING

from gputop.catalogue import KIND_PROBE_STEP, KIND_STACKS, KIND_THREAD_KERNEL, KIND_THREAD_STATE

# local ranks listed one by one as missing at most up to this LOCAL_WORLD_SIZE: a node holds at
# most a few hundred ranks (one per core); a larger one is damage or a hostile environment (a
# set of range(10**12) froze the UI and ran out of memory)
MAX_LOCAL_WORLD = 4096
FRESH_S = {KIND_GPU: 3.0, KIND_GPU_PROCS: 5.0, KIND_PROBE_STEP: 5.0, KIND_THREAD_STATE: 12.0, KIND_PROC: 4.0}
THREAD_FIELDS = ("running_pct", "gil_pct", "data_pct", "cuda_pct", "collective_pct", "idle_pct", "cpu_wait_pct",
                 "unknown_pct")

NO_RANKS = ("no process of the target's tree is a rank: gputop looks for RANK (torchrun), "
            "OMPI_COMM_WORLD_RANK (mpirun), PMI_RANK or SLURM_PROCID (srun) in each process's environment, "
            "and for an in-process probe that reports a rank")


def _num(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _int(x) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _reader(source, now: float):
    """A SampleStore to read: the given one, or one filled from a list of samples up to ``now``
    (a whole recording, for the report)."""
    if isinstance(source, (list, tuple)):
        store = SampleStore(horizon_s=math.inf, max_keys_per_kind=1 << 20)
        store.on_samples(sorted((x for x in source if now is None or x.t <= now), key=lambda x: x.t))
        return store
    return source


def _fresh(s: Sample | None, kind: str, ref_t: float) -> Sample | None:
    """``s`` if it is recent enough at ``ref_t`` to describe the rank then."""
    if s is None or ref_t - s.t > FRESH_S[kind]:
        return None
    return s


def _at(r, kind: str, key: str, ref_t: float, now: float) -> Sample | None:
    """The newest sample of a series at ``ref_t`` (now for a running rank; its end for an exited
    one, so what is derived after it ended does not count), if fresh then."""
    if ref_t >= now:
        return _fresh(r.latest(kind, key), kind, ref_t)
    got = None
    for s in r.series(kind, key, ref_t - FRESH_S[kind]):
        if s.t > ref_t:
            break
        got = s
    return got


def _value_at(r, kind: str, key: str, name: str, ref_t: float, now: float, max_age_s: float = 1.0):
    """The newest non-None value of one field at ``ref_t`` (see SampleStore.latest_value)."""
    newest = _at(r, kind, key, ref_t, now)
    if newest is None:
        return None
    if ref_t >= now:
        return r.latest_value(kind, key, name, max_age_s=max_age_s)
    for s in reversed(r.series(kind, key, newest.t - max_age_s)):
        if s.t <= newest.t and s.data.get(name) is not None:
            return s.data.get(name)
    return None


def _gpu_of_env(hint: str | None, gpu_keys: set[str], uuids: dict[str, str]) -> str | None:
    if hint is None:
        return None
    if hint.isdigit():
        return hint if hint in gpu_keys else None
    for key, uuid in uuids.items():   # "GPU-8fa1..." may be a prefix of the full UUID
        if uuid == hint or (len(hint) >= 8 and uuid.startswith(hint)):
            return key
    return None


def rank_table(source, now: float) -> list[dict]:
    """One row per rank process (see the module docstring for every field). Pure: reads
    ``source`` (a SampleStore or a list of samples) and nothing else."""
    r = _reader(source, now)
    ranks = r.latest_of_kind(KIND_RANK)
    if not ranks:
        return []
    gpu_latest = r.latest_of_kind(KIND_GPU)
    info = r.latest_of_kind(KIND_GPU_INFO)
    gpu_keys = set(gpu_latest) | set(info)
    uuids = {k: s.data.get("uuid") for k, s in info.items() if isinstance(s.data.get("uuid"), str)}
    procs_of = r.latest_of_kind(KIND_GPU_PROCS)
    rows = []
    for key, rs in ranks.items():
        d = rs.data
        pid = _int(d.get("pid"))
        if pid is None:
            try:
                pid = int(key)
            except ValueError:
                continue
        state = d.get("state") if d.get("state") in (STATE_RUNNING, STATE_EXITED) else None
        ref_t = now if state == STATE_RUNNING else rs.t
        row = {
            "rank": _int(d.get("rank")), "pid": pid, "state": state, "t": rs.t,
            "local_rank": _int(d.get("local_rank")), "world_size": _int(d.get("world_size")),
            "local_world_size": _int(d.get("local_world_size")), "node": d.get("node"),
            "source": d.get("source"), "launcher_pid": _int(d.get("launcher_pid")),
            "restart_count": _int(d.get("restart_count")), "name": d.get("name"), "why": d.get("why"),
        }
        # GPU: NVML's list of compute processes is the truth; the environment is a hint.
        on: list[tuple[int, str]] = []
        for gkey in procs_of:
            gs = _at(r, KIND_GPU_PROCS, gkey, ref_t, now)
            if gs is None:
                continue
            procs = gs.data.get("procs")
            entry = procs.get(str(pid)) if isinstance(procs, dict) else None
            if isinstance(entry, dict):
                on.append((_int(entry.get("mem")) or 0, gkey))
        on.sort(key=lambda x: (-x[0], x[1]))
        gpu, gpu_from = None, None
        if on:
            gpu, gpu_from = on[0][1], "nvml"
        else:
            hint = d.get("gpu") if isinstance(d.get("gpu"), str) else d.get("gpu_hint")
            gpu = _gpu_of_env(hint if isinstance(hint, str) else None, gpu_keys, uuids)
            gpu_from = "env" if gpu is not None else None
        row.update(gpu=gpu, gpu_from=gpu_from, gpus=[k for _m, k in on], gpu_mem=on[0][0] if on else None)
        sm = util = None
        if gpu is not None:
            sm = _num(_value_at(r, KIND_GPU, gpu, "sm_active", ref_t, now, max_age_s=GPM_HOLD_S))
            util = _num(_value_at(r, KIND_GPU, gpu, "util_gpu", ref_t, now))
        row.update(sm_active=sm, util_gpu=util)
        ps = _at(r, KIND_PROBE_STEP, str(pid), ref_t, now)
        row.update(steps_per_s=_num(ps.data.get("steps_per_s")) if ps else None,
                   step_ms=_num(ps.data.get("step_ms_mean")) if ps else None,
                   data_wait_share=_num(ps.data.get("data_wait_share")) if ps else None,
                   collective_wait_share=_num(ps.data.get("collective_wait_share")) if ps else None,
                   collective_ms=_num(ps.data.get("collective_ms")) if ps else None,
                   probe_t=ps.t if ps else None)
        ts = _at(r, KIND_THREAD_STATE, f"{pid}:{pid}", ref_t, now)
        for f in THREAD_FIELDS:
            row[f] = _num(ts.data.get(f)) if ts else None
        row.update(thread_cpu_pct=_num(ts.data.get("cpu_pct")) if ts else None,
                   where=ts.data.get("where") if ts else None,
                   top=ts.data.get("top") if ts else None,
                   thread_state_t=ts.t if ts else None)
        pr = _at(r, KIND_PROC, str(pid), ref_t, now)
        row["cpu_pct"] = _num(pr.data.get("cpu_pct")) if pr else None
        rows.append(row)
    rows.sort(key=lambda x: (x["rank"] is None, x["rank"] if x["rank"] is not None else 0,
                             x["state"] != STATE_RUNNING, -x["t"], x["pid"]))
    return rows


def rank_overview(rows: list[dict]) -> dict:
    """What the rows say together: how many ranks run and ended, the world size(s), the nodes,
    and which local ranks of this node were not found (LOCAL_WORLD_SIZE says how many to expect)."""
    running = [x for x in rows if x["state"] == STATE_RUNNING]
    worlds = sorted({x["world_size"] for x in rows if x["world_size"] is not None})
    lws = sorted({x["local_world_size"] for x in running if x["local_world_size"] is not None})
    missing = None
    if len(lws) == 1 and lws[0] <= MAX_LOCAL_WORLD:   # (a larger one is no node's: not listed rank by rank)
        found = {x["local_rank"] for x in running if x["local_rank"] is not None}
        missing = sorted(set(range(lws[0])) - found)
    return {"running": len(running), "exited": len(rows) - len(running), "world_sizes": worlds,
            "local_world_size": lws[0] if len(lws) == 1 else None, "missing_local_ranks": missing,
            "nodes": sorted({str(x["node"]) for x in rows if x["node"] is not None})}


# ---------------------------------------------------------------------------------------------
# The report: per rank over the whole recording


REPORT_KINDS = (KIND_RANK, KIND_PROBE_STEP, KIND_STACKS, KIND_THREAD_KERNEL, KIND_GPU_PROCS, KIND_GPU_INFO)


def report_section(samples: list[Sample], report: dict | None = None, aggs: dict | None = None) -> dict | None:
    """The "ranks" part of ``gputop report``: one row per rank process over the whole recording.
    None when the recording has no rank samples at all (a job without ranks: no section).

    Per rank: its identity and life (first seen, ended, why), its GPU (NVML membership, else the
    environment's hint) and that GPU's mean SM active over the recording (from ``report["gpus"]``),
    steps/s while training and data-wait share pooled over all its probe windows (the probe
    section's numbers, gputop.derive.steps.pool_steps), and its main thread's state
    shares over every stack and kernel sample of the recording (gputop.derive.threads; ``aggs``:
    those sums already made, from the summary frames, derive/report_partials.py)."""
    rank_samples = [s for s in samples if s.kind == KIND_RANK]
    if not rank_samples:
        return None
    from gputop.derive.steps import pool_steps
    from gputop.derive.threads import aggregate, thread_state  # heavier; only for a report

    by_pid: dict[int, list[Sample]] = {}
    for s in sorted(rank_samples, key=lambda s: s.t):
        pid = _int(s.data.get("pid"))
        if pid is not None:
            by_pid.setdefault(pid, []).append(s)
    pids = set(by_pid)
    keys = {str(p) for p in pids}
    if aggs is None:
        stacks = [s for s in samples if s.kind == KIND_STACKS and s.key in keys]
        kernel = [s for s in samples if s.kind == KIND_THREAD_KERNEL and s.key in keys]
        aggs = aggregate(stacks, kernel)
    gpu_mem: dict[int, dict[str, int]] = {}
    gpu_keys: set[str] = set()
    uuids: dict[str, str] = {}
    for s in samples:
        if s.kind == KIND_GPU_INFO:
            gpu_keys.add(s.key)
            if isinstance(s.data.get("uuid"), str):
                uuids[s.key] = s.data["uuid"]
        elif s.kind == KIND_GPU_PROCS:
            gpu_keys.add(s.key)
            procs = s.data.get("procs")
            if isinstance(procs, dict):
                for p, e in procs.items():
                    if p.isdigit() and int(p) in pids and isinstance(e, dict):
                        mine = gpu_mem.setdefault(int(p), {})
                        mine[s.key] = max(mine.get(s.key, 0), _int(e.get("mem")) or 0)
    sm_mean = {}
    for g in (report or {}).get("gpus") or []:
        st = ((g.get("metrics") or {}).get("sm_active") or {})
        sm_mean[str(g.get("index"))] = _num(st.get("mean"))
        gpu_keys.add(str(g.get("index")))
    windows: dict[int, list[Sample]] = {p: [] for p in pids}
    for s in samples:
        if s.kind == KIND_PROBE_STEP and s.key.isdigit() and int(s.key) in pids:
            windows[int(s.key)].append(s)
    rows = []
    for pid, ss in by_pid.items():
        last = ss[-1].data
        ended = next((s.t for s in ss if s.data.get("state") == STATE_EXITED), None)
        mem = gpu_mem.get(pid) or {}
        if mem:
            gpu, gpu_from = max(mem, key=lambda k: (mem[k], k)), "nvml"
        else:
            hint = last.get("gpu_hint")
            gpu = _gpu_of_env(hint if isinstance(hint, str) else None, gpu_keys, uuids)
            gpu_from = "env" if gpu is not None else None
        pool = pool_steps(sorted(windows[pid], key=lambda s: s.t))
        a = aggs.get((pid, pid))
        ts = thread_state(a) if a is not None else None
        rows.append({
            "rank": _int(last.get("rank")), "pid": pid, "local_rank": _int(last.get("local_rank")),
            "world_size": _int(last.get("world_size")), "node": last.get("node"), "source": last.get("source"),
            "state": last.get("state"), "why": last.get("why"), "restart_count": _int(last.get("restart_count")),
            "first_seen_t": round(ss[0].t, 3), "ended_t": round(ended, 3) if ended is not None else None,
            "gpu": gpu, "gpu_from": gpu_from, "gpus": sorted(mem), "sm_active_mean": sm_mean.get(gpu) if gpu else None,
            "probe_windows": pool.windows,
            # While training (1 / mean step time): the steps/s of the report's probe section.
            "steps_per_s": _round(pool.steps_per_training_s, 3),
            "data_wait_share": _round(pool.data_wait_share, 4),
            "collective_wait_share": _collective_wait(windows[pid]),
            **{f: ts.get(f) if ts else None for f in THREAD_FIELDS},
            "thread_cpu_pct": ts.get("cpu_pct") if ts else None,
            "where": ts.get("where") if ts else None,
            "stack_samples": ts.get("samples") if ts else 0,
        })
    rows.sort(key=lambda x: (x["rank"] is None, x["rank"] if x["rank"] is not None else 0, x["first_seen_t"], x["pid"]))
    worlds = sorted({x["world_size"] for x in rows if x["world_size"] is not None})
    return {
        "available": True,
        "ranks": rows,
        "processes": len(rows),
        "distinct_ranks": len({x["rank"] for x in rows if x["rank"] is not None}),
        "world_sizes": worlds,
        "nodes": sorted({str(x["node"]) for x in rows if x["node"] is not None}),
        "ended": sum(1 for x in rows if x["state"] == STATE_EXITED),
    }


def _collective_wait(windows: list[Sample]) -> float | None:
    """Exposed collective time over step time, pooled over a rank's probe windows (None without
    the probe's collective timing): the same pooling as the verdicts' (steps.pool_collectives)."""
    pooled = pool_collectives(windows)
    return round(pooled[0], 4) if pooled else None


def _round(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


def _pct(v) -> str:
    f = _num(v)
    return "n/a" if f is None else f"{f:.0f}%"


def report_lines(sec: dict) -> list[str]:
    """Plain text of the ranks section for ``gputop report``."""
    lines = ["Ranks (main thread shares over the whole recording; steps/s while training, from the probe)"]
    if not sec.get("available"):
        lines.append(f"  not available: {sec.get('why') or NO_RANKS}")
        return lines
    worlds = ", ".join(str(w) for w in sec.get("world_sizes") or []) or "n/a"
    lines.append(f"  {sec.get('distinct_ranks')} rank(s) in {sec.get('processes')} process(es), world size {worlds}, "
                 f"node(s) {', '.join(sec.get('nodes') or []) or 'n/a'}; {sec.get('ended')} ended during the session")
    lines.append(f"  {'rank':>4} {'pid':>7} {'gpu':>4} {'SM act':>6} {'steps/s':>8} {'data':>5} {'GIL':>5} "
                 f"{'sync':>5} {'coll':>5} {'run':>5} {'idle':>5}  state")
    for x in sec.get("ranks") or []:
        rank = "?" if x.get("rank") is None else str(x["rank"])
        gpu = "-" if x.get("gpu") is None else str(x["gpu"]) + ("*" if x.get("gpu_from") == "env" else "")
        sps = "n/a" if x.get("steps_per_s") is None else f"{x['steps_per_s']:.2f}"
        state = x.get("state") or "?"
        if state == STATE_EXITED and x.get("ended_t") is not None:
            state = f"ended at {x['ended_t']:.1f} s" + (f" ({x['why']})" if x.get("why") and x["why"] != "exited" else "")
        data = x.get("data_pct") if x.get("data_wait_share") is None else 100 * x["data_wait_share"]
        lines.append(f"  {rank:>4} {x['pid']:>7} {gpu:>4} {_pct(x.get('sm_active_mean')):>6} {sps:>8} "
                     f"{_pct(data):>5} {_pct(x.get('gil_pct')):>5} {_pct(x.get('cuda_pct')):>5} "
                     f"{_pct(x.get('collective_pct')):>5} {_pct(x.get('running_pct')):>5} {_pct(x.get('idle_pct')):>5}  {state}")
    if any(x.get("gpu_from") == "env" for x in sec.get("ranks") or []):
        lines.append("  * GPU from the rank's environment (CUDA_VISIBLE_DEVICES / LOCAL_RANK), not seen in NVML's process list")
    lines.append("  steps/s = 1 / mean step time (as in the probe section); data = the probe's DataLoader wait share "
                 "of step time (else the main thread's DataLoader wait from stacks); GIL/sync/coll/run/idle = the "
                 "main thread's time (py-spy + kernel)")
    return lines
