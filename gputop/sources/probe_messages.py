"""What probe messages become: values checked and clipped (gputop/sources/probe_client.py).

Nothing from a probe socket is trusted: every number is checked, every string clipped, every
nested value bounded in depth and size.
"""

from __future__ import annotations

import math

from gputop.probe import wire

from gputop.sources.probe_fields import COPY_FIELDS, COPY_WAYS, COPY_WHATS

MAX_STR = 400


def _num(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _int(x) -> int | None:
    if isinstance(x, bool) or not isinstance(x, int):
        return None
    return x


def _count(x) -> int | None:
    v = _int(x)
    return v if v is not None and v >= 0 else None


def _secs(x) -> float | None:
    v = _num(x)
    return v if v is not None and v >= 0 else None


def _bucket(k) -> int | None:
    """A step-time histogram's bucket key ("0" to str(wire.MAX_HIST_BUCKET)) as an int."""
    if not (isinstance(k, str) and 0 < len(k) <= 3 and k.isascii() and k.isdigit()):
        return None
    return int(k) if int(k) <= wire.MAX_HIST_BUCKET else None


def _str(x) -> str | None:
    return x[:MAX_STR] if isinstance(x, str) else None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _clean(v, depth: int = 0):
    """A JSON value from a probe, made safe for a sample: bounded depth, sizes and strings."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v[:MAX_STR]
    if depth >= 4:
        return None
    if isinstance(v, list):
        return [_clean(x, depth + 1) for x in v[:64]]
    if isinstance(v, dict):
        return {str(k)[:80]: _clean(x, depth + 1) for k, x in list(v.items())[:64]}
    return None


def step_data(c, w: dict) -> dict:
    from gputop.sources.probe_collectives import collective_step_data   # (it imports this module)

    """A ``probe_step`` sample's data from a window message ``w`` of connection ``c`` (its
    ``rank``, and ``last_cpu`` which this updates)."""
    t0, t1 = _num(w.get("t0")), _num(w.get("t1"))
    window_s = (t1 - t0) if (t0 is not None and t1 is not None and t1 > t0) else None
    # (counts and durations are never negative: a damaged or hostile window's are no value)
    steps = _count(w.get("steps")) or 0
    step_n = _count(w.get("step_n")) or 0
    step_sum = _secs(w.get("step_sum"))
    mean = step_sum / step_n if (step_n and step_sum is not None) else None
    wait = _secs(w.get("step_wait"))
    if wait is not None and step_sum is not None and wait > step_sum:
        wait = None   # (a wait longer than the steps it is part of)
    wait_ms = wait / step_n * 1000 if (step_n and wait is not None) else None
    share = wait / step_sum if (wait is not None and step_sum) else None
    gpu_n = _count(w.get("gpu_n")) or 0
    gpu_sum = _secs(w.get("gpu_sum"))
    gpu_ms = gpu_sum / gpu_n * 1000 if (gpu_n and gpu_sum is not None) else None
    step_ms = mean * 1000 if mean is not None else None
    other_ms = None
    if step_ms is not None and wait_ms is not None:
        other_ms = max(0.0, step_ms - wait_ms - (gpu_ms or 0.0))
    batches = _count(w.get("batches"))
    samples = _count(w.get("samples"))
    if _int(w.get("unsized")):
        # Some batches had no tensor and the loader no batch_size: the count would be short.
        samples = None
    syncs = _count(w.get("step_syncs"))
    top = w.get("sync_top") if isinstance(w.get("sync_top"), list) else []
    top0 = top[0] if top and isinstance(top[0], list) and len(top[0]) == 2 else None
    hist = w.get("step_hist") if isinstance(w.get("step_hist"), dict) else {}
    hist = {k: v for k, v in list(hist.items())[:200]
            if _count(v) is not None and _bucket(k) is not None}

    def per_s(n):
        return _r(n / window_s) if (n is not None and window_s) else None

    cpu, probe_cpu_pct = _num(w.get("probe_cpu_s")), None
    if cpu is not None and t1 is not None:
        if c.last_cpu is not None and t1 > c.last_cpu[1] and cpu >= c.last_cpu[0]:
            probe_cpu_pct = _r((cpu - c.last_cpu[0]) / (t1 - c.last_cpu[1]) * 100, 3)
        c.last_cpu = (cpu, t1)

    return {
        "rank": c.rank,
        "window_s": _r(window_s),
        "steps": steps,
        "step_total": _int(w.get("step_total")),
        "steps_per_s": per_s(steps),
        "step_n": step_n,
        "step_s_sum": _r(step_sum, 6),
        "step_ms_mean": _r(step_ms),
        "step_ms_p50": _r(_num(w.get("step_p50")) * 1000) if _num(w.get("step_p50")) is not None else None,
        "step_ms_max": _r(_num(w.get("step_max")) * 1000) if _num(w.get("step_max")) is not None else None,
        "step_hist": hist,
        "data_wait_ms": _r(wait_ms),
        "data_wait_s_sum": _r(wait, 6),
        "data_wait_share": _r(share, 4),
        "gpu_ms_mean": _r(gpu_ms),
        "gpu_n": gpu_n,
        "gpu_s_sum": _r(gpu_sum, 6),
        "other_ms": _r(other_ms),
        "batches": batches,
        "batches_per_s": per_s(batches),
        "samples": samples,
        "samples_per_s": per_s(samples),
        "batch_total": _int(w.get("batch_total")),
        "sample_total": _int(w.get("sample_total")),
        "step_batches": _int(w.get("step_batches")),
        "step_samples": None if samples is None else _int(w.get("step_samples")),
        "syncs": syncs,
        "syncs_per_step": _r(syncs / step_n) if (syncs is not None and step_n) else None,
        "sync_top": top0[0][:MAX_STR] if top0 and isinstance(top0[0], str) else None,
        "sync_top_count": _int(top0[1]) if top0 else None,
        "dropped": _int(w.get("dropped")),
        "probe_cpu_pct": probe_cpu_pct,
        **flops_data(w.get("flops")),
        **compile_data(w),                             # torch.compile's compilations (issue 30)
        **amp_data(c, w),                              # GradScaler's skipped steps (issue 30)
        **kernel_data(w),                              # the kernels' time per step, from a trace (issue 29)
        **collective_step_data(w, step_n, step_sum),   # DDP/FSDP collectives (issue 17)
    }


def amp_data(c, w: dict) -> dict:
    """GradScaler's steps and skips in the window (gputop/probe/amp_scaler.py sends totals since
    the probe loaded: the window's are the differences from connection ``c``'s last ones)."""
    f = w.get("amp")
    none = {"scaler_steps": None, "skipped_steps": None, "skipped_unknown": None, "loss_scale": None,
            "loss_scale_read": None}
    if not isinstance(f, dict):
        return none
    tot = {k: _int(f.get(k)) for k in ("steps", "skipped", "unknown")}
    if any(v is None or v < 0 for v in tot.values()):
        return none
    last = getattr(c, "last_amp", None)
    c.last_amp = tot
    if last is None or any(tot[k] < last[k] for k in tot):
        # the connection's first word (or a new process behind it) is the baseline: the steps
        # before this monitor came are not this window's (a late attach got them all at once)
        return none
    scale = _num(f.get("scale"))
    return {"scaler_steps": tot["steps"] - last["steps"], "skipped_steps": tot["skipped"] - last["skipped"],
            "skipped_unknown": tot["unknown"] - last["unknown"],
            "loss_scale": scale if scale is not None and scale >= 0 else None,
            "loss_scale_read": bool(f.get("scale_read")) if scale is not None else None}


def kernel_data(w: dict) -> dict:
    """The probe's latest kernel trace (gputop/probe/kernel_sample.py) as probe_step fields: the
    kernels' time per step (the union of their intervals over the steps the trace saw) and the
    sample's age, or why there is none."""
    f = w.get("kernel")
    if not isinstance(f, dict):
        return {"kernel_ms_per_step": None, "kernel_sample_age_s": None,
                "kernel_off": "off: this probe does not sample kernels (a gputop older than that)"}
    ms, age = _num(f.get("ms_per_step")), _num(f.get("age_s"))
    ok = ms is not None and ms > 0 and age is not None and age >= 0
    return {"kernel_ms_per_step": _r(ms, 4) if ok else None, "kernel_sample_age_s": _r(age, 1) if ok else None,
            "kernel_off": None if ok else (_str(f.get("off")) or "no kernel sample")}


def compile_data(w: dict) -> dict:
    """The window's torch.compile compilations (gputop/probe/compiles.py) as probe_step fields."""
    none = {"compile_s": None, "recompile_s": None, "compiles": None, "recompiles": None,
            "recompile_limit_hits": None, "graph_breaks": None, "recompiles_total": None,
            "recompile_limit_hits_total": None, "recompile_fn": None, "recompile_where": None,
            "recompile_reason": None, "recompile_count": None, "recompile_limit_fn": None,
            "recompile_limit_where": None}
    if "compile" not in w:
        return {**none, "compile_off": "this probe does not read compilations (a gputop older than that)"}
    f = w.get("compile")
    if not isinstance(f, dict):
        return {**none, "compile_off": "torch.compile not in use (dynamo not loaded)"}
    secs, rsecs = _num(f.get("s")), _num(f.get("rs"))
    top = f.get("top") if isinstance(f.get("top"), dict) else {}
    limit = f.get("limit_top") if isinstance(f.get("limit_top"), dict) else {}
    return {
        "compile_s": _r(secs, 6) if secs is not None and secs >= 0 else None,
        "recompile_s": _r(rsecs, 6) if rsecs is not None and rsecs >= 0 else None,
        "recompile_limit_fn": _str(limit.get("function")), "recompile_limit_where": _str(limit.get("where")),
        "compiles": _int(f.get("n")), "recompiles": _int(f.get("recompiles")),
        "recompile_limit_hits": _int(f.get("limit_hits")), "graph_breaks": _int(f.get("breaks")),
        "recompiles_total": _int(f.get("recompiles_total")),
        "recompile_limit_hits_total": _int(f.get("limit_hits_total")),
        "recompile_fn": _str(top.get("function")), "recompile_where": _str(top.get("where")),
        "recompile_reason": _str(top.get("reason")), "recompile_count": _int(top.get("count")),
        "compile_off": None,
    }


def copies_data(c) -> dict:
    """The counted step's copies between host and GPU (gputop/probe/flops.py) as probe_step
    fields, per step; all None where the probe counted none (an older probe, no count yet). A
    way with valid bytes gets each other field checked on its own (a bad one is 0), and its
    pageable bytes never above its bytes."""
    out = dict.fromkeys(COPY_FIELDS)
    if not isinstance(c, dict):
        return out
    for way, _words in COPY_WAYS:
        n = _num(c.get(f"{way}_bytes"))
        if n is None or n < 0:
            out.update({f"copy_{way}_{what}": 0 for what in COPY_WHATS})   # counted: nothing that way
            continue
        vals = {}
        for what in COPY_WHATS[1:]:
            v = _num(c.get(f"{way}_{what}"))
            vals[what] = v if v is not None and v >= 0 else 0
        out[f"copy_{way}_bytes"] = _r(n, 1)
        out[f"copy_{way}_pageable_bytes"] = _r(min(vals["pageable_bytes"], n), 1)
        out[f"copy_{way}_ms"] = _r(vals["ms"], 3)
        out[f"copy_{way}_n"] = _r(vals["n"], 1)
    return out


def flops_data(f) -> dict:
    """The probe's FLOP count of one step (gputop/probe/flops.py) as probe_step fields."""
    if not isinstance(f, dict):
        return {"flops_per_step": None, "flops_dtype": None, "flops_by_dtype": None, "flops_step": None,
                "flops_count_ms": None, "flops_varies": None,
                "flops_off": "this probe does not count FLOPs (a gputop older than the FLOP count)",
                **copies_data(None)}
    by = f.get("by_dtype") if isinstance(f.get("by_dtype"), dict) else {}
    by = {str(k)[:16]: v for k, v in list(by.items())[:8] if _int(v) is not None and v >= 0}
    flops = _int(f.get("flops"))
    flops = flops if flops is not None and flops >= 0 else None
    return {"flops_per_step": flops, "flops_dtype": _str(f.get("dtype")) if flops is not None else None,
            "flops_by_dtype": by or None, "flops_step": _int(f.get("step")),
            "flops_count_ms": _r(_num(f.get("count_ms"))),
            "flops_varies": bool(f.get("varies")) if flops is not None else None,
            "flops_off": None if flops is not None else (_str(f.get("off")) or "no count yet"),
            **(copies_data(f.get("copies")) if flops is not None else copies_data(None))}
