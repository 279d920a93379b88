"""Training steps as the in-process probe saw them: the report's section and the panel's split.

Pure functions over ``probe_*`` samples (gputop/sources/probe_client.py). Statistics over a
whole run are built from the windows' sums, never from averages of averages: mean step time is
sum(step time) / number of timed steps; the data-wait share is sum(data wait) / sum(step time);
percentiles come from the merged step-time histograms (1/8-octave buckets, so within ~4.5%).
"""

from __future__ import annotations

import math

from gputop.model import KIND_HEALTH, Sample
from gputop.probe import wire
from gputop.sources.probe_client import KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_STEP, KIND_PROBE_SYNC

CONFIG_FACTS = ("torch", "cuda", "cudnn", "device_name", "amp_autocast", "tf32_matmul", "tf32_cudnn",
                "float32_matmul_precision", "cudnn_benchmark", "deterministic_algorithms", "anomaly_detection",
                "compile", "cuda_launch_blocking", "sync_debug_mode_job", "world_size", "dist_backend",
                "optimizer", "loaders", "step_source", "hooks")


def _n(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def hist_percentile(hist: dict[int, int], q: float) -> float | None:
    """The q-th percentile (0..100), in seconds, of a merged step-time histogram."""
    total = sum(hist.values())
    if total <= 0:
        return None
    want = q / 100.0 * total
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= want:
            return wire.hist_value(b)
    return wire.hist_value(max(hist))


def off_reason(config: dict | None, hook: str) -> str:
    """Why a probe measurement (hook ``cuda_events`` = GPU time, ``syncs``, ``dataloader``...)
    has no value, from the probe's config sample (reasons travel there, not in every window)."""
    if not config:
        return "no settings from the probe yet"
    if config.get("torch") is None:
        return str(config.get("torch_info") or "torch is not imported")
    h = (config.get("hooks") or {}).get(hook)
    if isinstance(h, list) and len(h) == 2 and h[1]:
        return str(h[1])
    return "not measured"


def step_split(data: dict) -> dict | None:
    """One probe_step sample's step time, split for a bar: data wait / GPU / other host time
    (ms, and shares of the step). GPU time is None without CUDA; the split then has two parts."""
    step = _n(data.get("step_ms_mean"))
    if step is None or step <= 0:
        return None
    wait = _n(data.get("data_wait_ms")) or 0.0
    gpu = _n(data.get("gpu_ms_mean"))
    other = max(0.0, step - wait - (gpu or 0.0))
    return {"step_ms": step, "data_wait_ms": wait, "gpu_ms": gpu, "other_ms": other,
            "data_wait_share": min(1.0, wait / step), "gpu_share": None if gpu is None else min(1.0, gpu / step),
            "other_share": other / step}


def _rank_section(key: str, windows: list[Sample], configs: list[Sample], memory: list[Sample],
                  syncs: list[Sample]) -> dict:
    steps = sum(int(s.get("steps") or 0) for s in windows)
    window_s = sum(_n(s.get("window_s")) or 0.0 for s in windows)
    # Rates over the windows in which the job was training (a step ended), not over the time it
    # spent starting up, evaluating or waiting before or after.
    busy_s = sum(_n(s.get("window_s")) or 0.0 for s in windows if s.get("steps"))
    fed = [s for s in windows if s.get("batches")]
    fed_s = sum(_n(s.get("window_s")) or 0.0 for s in fed)
    step_n = sum(int(s.get("step_n") or 0) for s in windows)
    step_sum = sum(_n(s.get("step_s_sum")) or 0.0 for s in windows)
    wait_sum = sum(_n(s.get("data_wait_s_sum")) or 0.0 for s in windows if s.get("step_n"))
    gpu_n = sum(int(s.get("gpu_n") or 0) for s in windows)
    gpu_sum = sum(_n(s.get("gpu_s_sum")) or 0.0 for s in windows)
    batches = sum(int(s.get("batches") or 0) for s in windows)
    step_batches = sum(int(s.get("step_batches") or 0) for s in windows)
    step_samples = sum(int(s.get("step_samples") or 0) for s in windows)
    # A window whose batches had no known size has samples None: then the total is unknown too.
    samples = None if any(s.get("batches") and s.get("samples") is None for s in windows) \
        else sum(int(s.get("samples") or 0) for s in fed)
    sync_windows = [s for s in windows if s.get("syncs") is not None]
    sync_n = sum(int(s.get("syncs") or 0) for s in sync_windows)
    sync_steps = sum(int(s.get("step_n") or 0) for s in sync_windows)
    hist: dict[int, int] = {}
    for s in windows:
        h = s.get("step_hist")
        if isinstance(h, dict):
            for b, c in h.items():
                try:
                    hist[int(b)] = hist.get(int(b), 0) + int(c)
                except (TypeError, ValueError):
                    continue
    maxes = [_n(s.get("step_ms_max")) for s in windows if _n(s.get("step_ms_max")) is not None]
    mean_s = step_sum / step_n if step_n else None
    gpu_ms = gpu_sum / gpu_n * 1000 if gpu_n else None
    wait_ms = wait_sum / step_n * 1000 if step_n else None
    last = windows[-1].data if windows else {}
    cfg = configs[-1].data if configs else {}
    out: dict = {
        "pid": key,
        "rank": last.get("rank") if last.get("rank") is not None else cfg.get("rank"),
        "windows": len(windows),
        "observed_s": _r(window_s),
        "steps": steps,
        "step_total_at_end": last.get("step_total"),
        "step_source": cfg.get("step_source"),
        "training_s": _r(busy_s),
        # While training: timed steps over their summed durations (consecutive boundaries, so
        # exactly the time from the first to the last step).
        "steps_per_s": _r(step_n / step_sum) if step_sum else None,
        "step_ms": {
            "n": step_n,
            "mean": _r(mean_s * 1000) if mean_s is not None else None,
            "p50": _r(hist_percentile(hist, 50) * 1000) if hist else None,
            "p90": _r(hist_percentile(hist, 90) * 1000) if hist else None,
            "p99": _r(hist_percentile(hist, 99) * 1000) if hist else None,
            "max": _r(max(maxes)) if maxes else None,
        },
        "data_wait_ms_per_step": _r(wait_ms),
        "data_wait_share": _r(wait_sum / step_sum, 4) if step_sum else None,
        "gpu_ms_per_step": _r(gpu_ms),
        "gpu_steps_timed": gpu_n,
        "gpu_info": None if gpu_n else off_reason(cfg, "cuda_events"),
        "other_ms_per_step": (_r(max(0.0, mean_s * 1000 - (wait_ms or 0.0) - (gpu_ms or 0.0)))
                              if mean_s is not None else None),
        "batches": batches,
        "batches_per_s": (_r(step_batches / steps * step_n / step_sum) if (step_sum and steps and step_batches)
                          else _r(batches / fed_s) if fed_s else None),
        "samples": samples,
        "samples_per_s": (None if samples is None else
                          _r(step_samples / steps * step_n / step_sum) if (step_sum and steps and step_samples)
                          else _r(samples / fed_s) if fed_s else None),
        "syncs_per_step": _r(sync_n / sync_steps) if sync_steps else None,
        "sync_info": None if sync_windows else off_reason(cfg, "syncs"),
        "sync_lines": list(syncs[-1].get("lines") or [])[:5] if syncs else [],
    }
    if memory:
        peaks = [_n(m.get("peak_allocated")) for m in memory if _n(m.get("peak_allocated")) is not None]
        res = [_n(m.get("peak_reserved")) for m in memory if _n(m.get("peak_reserved")) is not None]
        out["memory"] = {"peak_allocated_bytes": int(max(peaks)) if peaks else None,
                         "peak_reserved_bytes": int(max(res)) if res else None,
                         "alloc_retries": memory[-1].get("alloc_retries"), "ooms": memory[-1].get("ooms")}
    else:
        out["memory"] = None
    out["config"] = {k: cfg.get(k) for k in CONFIG_FACTS if k in cfg}
    return out


def report_section(samples: list[Sample]) -> dict:
    """The probe's part of ``gputop report``: JSON-able, one entry per probed process (rank).

    ``found`` is False when the recording has no probe data; ``message`` then says why (the
    probe source's last health message) and how to enable the probe.
    """
    by_kind: dict[str, dict[str, list[Sample]]] = {}
    health: Sample | None = None
    for s in samples:
        if s.kind == KIND_HEALTH and s.key == "probe":
            health = s
        elif s.kind in (KIND_PROBE_STEP, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_SYNC):
            by_kind.setdefault(s.kind, {}).setdefault(s.key, []).append(s)
    for series in by_kind.values():
        for lst in series.values():
            lst.sort(key=lambda s: s.t)
    steps = by_kind.get(KIND_PROBE_STEP, {})
    if not steps:
        msg = health.get("message") if health is not None else None
        return {"found": False, "message": msg or "no probe data in this recording", "ranks": []}
    ranks = []
    for key in steps:
        ranks.append(_rank_section(key, steps[key], by_kind.get(KIND_PROBE_CONFIG, {}).get(key, []),
                                   by_kind.get(KIND_PROBE_MEMORY, {}).get(key, []),
                                   by_kind.get(KIND_PROBE_SYNC, {}).get(key, [])))
    ranks.sort(key=lambda r: (r["rank"] is None, r["rank"] if r["rank"] is not None else 0, r["pid"]))
    training = [r for r in ranks if r["steps"]]
    summary: dict = {"probes": len(ranks), "training": len(training)}
    if training:
        rates = [r["steps_per_s"] for r in training if r["steps_per_s"] is not None]
        shares = [r["data_wait_share"] for r in training if r["data_wait_share"] is not None]
        means = [(r["step_ms"]["mean"], r) for r in training if r["step_ms"]["mean"] is not None]
        summary["steps_per_s_min"] = min(rates) if rates else None
        summary["steps_per_s_max"] = max(rates) if rates else None
        summary["data_wait_share_max"] = max(shares) if shares else None
        if means:
            slow = max(means, key=lambda m: m[0])[1]
            summary["slowest"] = {"pid": slow["pid"], "rank": slow["rank"], "step_ms_mean": slow["step_ms"]["mean"]}
    return {"found": True, "message": health.get("message") if health is not None else None,
            "summary": summary, "ranks": ranks}


# The sample kinds report_section reads (for gputop/report.py's ReportSection.kinds).
REPORT_KINDS = (KIND_PROBE_STEP, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_SYNC, KIND_HEALTH)


def _fmt(v, unit: str = "", nd: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}{unit}"


def report_lines(section: dict) -> list[str]:
    """The section as text lines for ``gputop report`` (no colours, no widths beyond ~100)."""
    if not section.get("found"):
        return [f"probe: {section.get('message') or 'no probe data'}"]
    out = []
    for r in section.get("ranks", []):
        who = f"rank {r['rank']} (PID {r['pid']})" if r.get("rank") is not None else f"PID {r['pid']}"
        sm = r["step_ms"]
        if not r["steps"]:
            out.append(f"{who}: no steps in this recording")
            continue
        out.append(f"{who}: {r['steps']} steps, {_fmt(r['steps_per_s'], '/s', 2)}; step mean {_fmt(sm['mean'], ' ms')}, "
                   f"p50 {_fmt(sm['p50'], ' ms')}, p90 {_fmt(sm['p90'], ' ms')}, max {_fmt(sm['max'], ' ms')}")
        wait = r["data_wait_share"]
        gpu = (f"GPU {_fmt(r['gpu_ms_per_step'], ' ms')}" if r["gpu_ms_per_step"] is not None
               else f"GPU n/a ({r['gpu_info']})")
        out.append(f"  per step: data wait {_fmt(r['data_wait_ms_per_step'], ' ms')}"
                   f" ({_fmt(None if wait is None else wait * 100, '%', 0)}), {gpu}, other {_fmt(r['other_ms_per_step'], ' ms')}")
        samples = f", {_fmt(r['samples_per_s'], ' samples/s', 1)}" if r.get("samples_per_s") is not None else ""
        out.append(f"  data: {_fmt(r['batches_per_s'], ' batches/s', 1)}{samples}")
        if r["syncs_per_step"] is not None:
            top = r["sync_lines"][0] if r["sync_lines"] else None
            out.append(f"  syncs: {_fmt(r['syncs_per_step'], '/step', 2)}"
                       + (f", most at {top[0]} ({top[1]}x)" if top else ""))
        else:
            out.append(f"  syncs: n/a ({r['sync_info']})")
        cfg = r.get("config") or {}
        loaders = cfg.get("loaders") or []
        for ld in loaders[:2]:
            out.append(f"  DataLoader: batch_size {ld.get('batch_size')}, num_workers {ld.get('num_workers')}, "
                       f"pin_memory {ld.get('pin_memory')}, prefetch_factor {ld.get('prefetch_factor')}, "
                       f"persistent_workers {ld.get('persistent_workers')}")
        facts = []
        if cfg.get("amp_autocast"):
            facts.append("AMP " + ",".join(cfg["amp_autocast"]))
        if cfg.get("tf32_matmul") is not None:
            facts.append(f"TF32 matmul {'on' if cfg['tf32_matmul'] else 'off'}")
        if cfg.get("cudnn_benchmark") is not None:
            facts.append(f"cudnn.benchmark {'on' if cfg['cudnn_benchmark'] else 'off'}")
        comp = cfg.get("compile") or {}
        if comp.get("calls"):
            facts.append(f"torch.compile x{comp['calls']}")
        if cfg.get("cuda_launch_blocking") not in (None, ""):
            facts.append(f"CUDA_LAUNCH_BLOCKING={cfg['cuda_launch_blocking']}")
        if cfg.get("anomaly_detection"):
            facts.append("anomaly detection ON")
        if cfg.get("torch"):
            facts.insert(0, f"torch {cfg['torch']}")
        if facts:
            out.append("  settings: " + ", ".join(facts))
        mem = r.get("memory")
        if mem and mem.get("peak_allocated_bytes") is not None:
            out.append(f"  CUDA memory peak: {mem['peak_allocated_bytes'] / 2**30:.2f} GiB allocated, "
                       f"{(mem['peak_reserved_bytes'] or 0) / 2**30:.2f} GiB reserved, alloc retries {mem.get('alloc_retries')}")
    return out
