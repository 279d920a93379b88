"""FLOP/s, MFU and energy: the probe's FLOP count of one step, the steps/s of its windows, the
dense peak of the GPU (gputop/gpu_peaks.py) and NVML's energy counter, one function per quantity.

- achieved FLOP/s = FLOPs per step (probe) x steps/s (``pool_steps``, while training)
- MFU = achieved / dense peak of the GPU for the dtype the step computes in; a step that mixes
  dtypes gets the FLOP-weighted peak (the time the step would take at peak, dtype by dtype)
- cross-check: GPM tensor-pipe activity of the job's GPUs over the same span, side by side
- energy per GPU from the total energy counter (last - first reading), else power x time
  (the trapezoid of power_w; labelled ``power x time``); J/step = mean power / steps/s, J/sample
  = mean power / samples/s, kWh = energy / 3.6e6 J, CO2e = kWh x grid intensity (gCO2e/kWh)

Every quantity is None with a reason when it cannot be known (no probe, torch.compile, unknown
GPU, no counter). ``efficiency(by_kind)`` takes samples grouped as {kind: {key: [Sample...]}}
(time-ordered), so the live views, the exporter and the report share it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gputop import gpu_peaks
from gputop.catalogue import KIND_EFFICIENCY, KIND_GPU, KIND_GPU_INFO, KIND_PROBE_CONFIG, KIND_PROBE_STEP, MetricSpec
from gputop.derive.steps import pool_steps
from gputop.probe.flops import settings_dtype_class
from gputop.sources.nvml_fields import ENERGY_EVERY_S

FROM_SETTINGS = "dtype from the job's settings"
NO_COUNT_RECORDED = "recorded before gputop's probe counted FLOPs: this file has step times, no FLOP count"
WINDOW_S = 10.0             # the live views and the exporter: the newest 10 s (as the verdicts pool)
# How far back the live views look for two energy-counter readings (the slow loop's jitter can
# stretch a gap well past ENERGY_EVERY_S: up to ~13 s at the agent's 1 Hz GPU loop).
POWER_WINDOW_S = 6 * ENERGY_EVERY_S
J_PER_KWH = 3.6e6
METHOD_COUNTER = "energy counter"
METHOD_POWER = "power x time"
KINDS = (KIND_PROBE_STEP, KIND_PROBE_CONFIG, KIND_GPU, KIND_GPU_INFO)

# What the exporter serves from this module (computed at scrape time, so no sample field).

METRICS: list[MetricSpec] = [
    MetricSpec(KIND_EFFICIENCY, "achieved_flops_per_s", "FLOP/s", "achieved FLOP/s",
               "FLOPs per step (probe) x steps/s over the newest 10 s", aggregate=False,
               prom="achieved_flops_per_second",
               prom_help="Model FLOPs per second: the probe's FLOPs per step x steps per second, newest 10 s."),
    MetricSpec(KIND_EFFICIENCY, "mfu", "", "MFU", "achieved FLOP/s / the GPU's dense peak for the compute dtype",
               aggregate=False, prom="mfu_ratio",
               prom_help="Model FLOPs utilisation, 0-1: achieved FLOP/s over the GPU's dense peak for the dtype "
                         "the step computes in (gputop/gpu_peaks.py)."),
    MetricSpec(KIND_EFFICIENCY, "joules_per_step", "J", "J/step",
               "GPU energy per training step (mean power / steps/s), per GPU of the job", aggregate=False,
               prom="gpu_energy_per_step_joules",
               prom_help="GPU energy per training step over the newest 10 s, in joules (energy counter, or "
                         "power x time where the counter is missing: the method label says which)."),
    MetricSpec(KIND_EFFICIENCY, "joules_per_sample", "J", "J/sample", "GPU energy per sample, all the job's GPUs",
               aggregate=False, prom="energy_per_sample_joules",
               prom_help="Energy of all the job's GPUs per training sample over the newest 10 s, in joules."),
]


@dataclass(frozen=True)
class Energy:
    joules: float | None
    seconds: float
    method: str | None         # METHOD_COUNTER / METHOD_POWER / None
    why: str | None = None

    @property
    def watts(self) -> float | None:
        return self.joules / self.seconds if (self.joules is not None and self.seconds > 0) else None


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


_FLOAT_OR_NONE = frozenset({float, type(None)})


def _nums(col: list) -> list:
    """``[_num(v) for v in col]``; the column itself when it holds only floats and None (nearly
    always: an hour's 36k readings are then not converted one call at a time)."""
    return col if set(map(type, col)) <= _FLOAT_OR_NONE else list(map(_num, col))


def flops_per_step(windows) -> tuple[int | None, dict, str | None]:
    """(FLOPs per step, {dtype class: FLOPs}, why none) from the newest window that says."""
    for s in reversed(list(windows)):
        f = s.data.get("flops_per_step")
        if isinstance(f, int) and not isinstance(f, bool) and f > 0:
            by = s.data.get("flops_by_dtype")
            by = {k: v for k, v in by.items() if isinstance(v, int) and v > 0} if isinstance(by, dict) else {}
            return f, by or {str(s.data.get("flops_dtype") or "?"): f}, None
        if "flops_off" in s.data and s.data.get("flops_off"):
            return None, {}, str(s.data["flops_off"])
    # Windows without even a ``flops_off`` field were recorded before the probe counted FLOPs
    # (every probe_step sample made since says why it has no count): a file's age, not a fault
    # of the gputop reading it. The bundled demo recordings are such files.
    return None, {}, ("no probe window in this span" if not windows else NO_COUNT_RECORDED)


def settings_dtype(cfg: dict) -> str | None:
    """The compute dtype the job's recorded settings (probe_config) say (see
    probe/flops.settings_dtype_class). For a count whose ops carried no dtype ("?", from a probe
    before the fix)."""
    auto = cfg.get("amp_autocast") if isinstance(cfg.get("amp_autocast"), list) else []
    opt = cfg.get("optimizer") if isinstance(cfg.get("optimizer"), dict) else {}
    dts = opt.get("param_dtypes") if isinstance(opt.get("param_dtypes"), list) else []
    return settings_dtype_class(auto, dts, tf32=cfg.get("tf32_matmul") is True)


def with_known_dtype(by: dict, cfg: dict) -> tuple[dict, str | None]:
    """``by`` with its unknown-dtype FLOPs ("?" or a name the peak table lacks) given the
    settings' dtype, and a note saying so (None when every dtype was known)."""
    unknown = [k for k in by if k not in gpu_peaks.DTYPES and k != "fp64"]
    guess = settings_dtype(cfg) if unknown else None
    if not guess:
        return by, None
    out = {k: v for k, v in by.items() if k not in unknown}
    out[guess] = out.get(guess, 0) + sum(by[k] for k in unknown)
    return out, FROM_SETTINGS


def achieved_flops_per_s(flops: int | None, steps_per_s: float | None) -> float | None:
    return flops * steps_per_s if (flops is not None and steps_per_s) else None


def effective_peak(device_name: str | None, by_dtype: dict) -> tuple[float | None, str]:
    """Dense peak in FLOP/s for a step's dtype mix (FLOP-weighted harmonic mean), and its source."""
    total = sum(by_dtype.values())
    if not total:
        return None, "no FLOP count"
    time_at_peak = 0.0
    sources = []
    for dt, f in sorted(by_dtype.items(), key=lambda kv: -kv[1]):
        peak, src = gpu_peaks.dense_peak(device_name, dt)
        if peak is None:
            return None, src
        time_at_peak += f / (peak * 1e12)
        sources.append(src)
    return total / time_at_peak, "; ".join(sources)


def mfu(achieved: float | None, peak: float | None) -> float | None:
    return achieved / peak if (achieved is not None and peak) else None


@dataclass(frozen=True)
class GpuReadings:
    """What this module reads of one GPU's samples, as columns (time-ordered): the report
    merges an hour of them from the summary frames without making a sample of each."""
    t: list
    energy_j: list
    power_w: list
    tensor_active: list

    @classmethod
    def of(cls, samples) -> "GpuReadings":
        return cls([s.t for s in samples], *([s.data.get(f) for s in samples]
                                            for f in ("energy_j", "power_w", "tensor_active")))

    def between(self, t0: float, t1: float) -> "GpuReadings":
        ts = self.t
        cols = (ts, self.energy_j, self.power_w, self.tensor_active)
        if all(a <= b for a, b in zip(ts, ts[1:])):   # time-ordered (as they always are): two bisects
            i, j = bisect.bisect_left(ts, t0), bisect.bisect_right(ts, t1)
            return GpuReadings(*(col[i:j] for col in cols))
        keep = [i for i, t in enumerate(ts) if t0 <= t <= t1]
        return GpuReadings(*([col[i] for i in keep] for col in cols))


NO_READINGS = GpuReadings([], [], [], [])


def gpu_energy(samples) -> Energy:
    """One GPU's energy over its samples: the counter where it was read twice, else power x time."""
    return readings_energy(GpuReadings.of(samples))


def _first_reading(vals) -> tuple[int, float] | None:
    return next(((i, e) for i, e in enumerate(_nums(vals)) if e is not None), None)


def readings_energy(g: GpuReadings) -> Energy:
    # the counter's first and last readings (an hour holds 36k: found from either end)
    first = _first_reading(g.energy_j)
    last = _first_reading(g.energy_j[::-1])
    if first is not None and last is not None and len(g.t) - 1 - last[0] > first[0]:
        (i, e0), (j, e1) = first, (len(g.t) - 1 - last[0], last[1])
        if e1 >= e0 and g.t[j] > g.t[i]:
            return Energy(e1 - e0, g.t[j] - g.t[i], METHOD_COUNTER)
    ws = _nums(g.power_w)
    keep = [i for i, w in enumerate(ws) if w is not None]
    if len(keep) < 2:
        return Energy(None, 0.0, None, "no energy counter and too few power readings")
    ts, ws = [g.t[i] for i in keep], [ws[i] for i in keep]
    joules = sum((t1 - t0) * (w0 + w1) / 2 for t0, t1, w0, w1 in zip(ts, ts[1:], ws, ws[1:]) if t1 - t0 < 5.0)
    return Energy(joules, ts[-1] - ts[0], METHOD_POWER)


def joules_per(watts: float | None, per_s: float | None) -> float | None:
    """Joules per step (or sample): mean power / steps (samples) per second."""
    return watts / per_s if (watts is not None and per_s) else None


def kwh(joules: float | None) -> float | None:
    return joules / J_PER_KWH if joules is not None else None


def emissions_g(kwh_: float | None, grid_g_per_kwh: float | None) -> float | None:
    return kwh_ * grid_g_per_kwh if (kwh_ is not None and grid_g_per_kwh is not None) else None


def job_gpus(infos: dict, gpu_keys) -> list[str]:
    """The GPUs the job uses: those NVML watches (gpu_info.watched), else every GPU sampled."""
    watched = [k for k, s in infos.items() if s.data.get("watched")]
    return sorted(watched or list(gpu_keys), key=lambda k: (len(k), k))


def _mean(vals) -> float | None:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _training_span(steps: dict) -> tuple[float, float] | None:
    """From the start of the first probe window that timed a step to the end of the last one."""
    timed = [w for windows in steps.values() for w in windows if (_num(w.data.get("steps")) or 0) > 0]
    if not timed:
        return None
    first = min(timed, key=lambda w: w.t)
    return first.t - (_num(first.data.get("window_s")) or 0.0), max(w.t for w in timed)


def efficiency(by_kind: dict, grid_g_per_kwh: float | None = None, power_gpus: dict | None = None,
               gpu_readings: dict | None = None) -> dict:
    """Everything above for one span of samples, JSON-able (docs/report.md, "efficiency").
    ``power_gpus``: GPU samples to take the mean power from instead of those of the training
    span (the live views: see ``live``). ``gpu_readings``: {key: GpuReadings} instead of the
    GPU samples of ``by_kind``."""
    steps = by_kind.get(KIND_PROBE_STEP, {})
    configs = by_kind.get(KIND_PROBE_CONFIG, {})
    gpus = gpu_readings if gpu_readings is not None else \
        {k: GpuReadings.of(v) for k, v in by_kind.get(KIND_GPU, {}).items()}
    infos = {k: v[-1] for k, v in by_kind.get(KIND_GPU_INFO, {}).items() if v}
    used = job_gpus(infos, gpus.keys())
    names = sorted({str(infos[k].data.get("name")) for k in used if k in infos and infos[k].data.get("name")})
    ranks = []
    for pid, windows in steps.items():
        pool = pool_steps(w.data for w in windows)
        if not pool.steps:
            continue
        cfg = configs.get(pid, [])
        cfg = cfg[-1].data if cfg else {}
        dev = cfg.get("device_name") or (names[0] if len(names) == 1 else None)
        flops, by, why = flops_per_step(windows)
        by, dtype_note = with_known_dtype(by, cfg)
        sps = pool.steps_per_training_s
        achieved = achieved_flops_per_s(flops, sps)
        peak, peak_src = effective_peak(dev, by) if flops else (None, why or "no FLOP count")
        ranks.append({"pid": pid, "rank": windows[-1].data.get("rank"), "device_name": dev,
                      "flops_per_step": flops, "flops_by_dtype": by or None,
                      "dtype": max(by, key=by.get) if by else None, "dtype_note": dtype_note,
                      "flops_off": why,
                      "steps_per_s": sps, "steps_per_observed_s": pool.steps_per_observed_s,
                      "samples_per_s": pool.samples_per_s,
                      "achieved_tflops": achieved / 1e12 if achieved is not None else None,
                      "peak_tflops": peak / 1e12 if peak is not None else None, "peak_source": peak_src,
                      "mfu": mfu(achieved, peak), "mfu_off": None if peak else (why or peak_src)})
    out: dict = {"ranks": ranks}
    achieved = [r["achieved_tflops"] for r in ranks]
    peaks = [r["peak_tflops"] for r in ranks]
    if ranks and all(a is not None for a in achieved) and all(p for p in peaks):
        out["achieved_tflops"], out["mfu"], out["mfu_off"] = sum(achieved), sum(achieved) / sum(peaks), None
    else:
        known = [a for a in achieved if a is not None]
        out["achieved_tflops"] = sum(known) if known else None
        out["mfu"] = None
        out["mfu_off"] = (next((r["mfu_off"] for r in ranks if r["mfu_off"]), None)
                          or ("no probe: FLOPs per step come from the in-process probe (gputop run)"
                              if not steps else "no training steps in this span"))
    # GPM cross-check: the tensor pipes' activity on the job's GPUs over the span MFU divides by
    # (the probe windows that timed steps: start-up and the end are not training time).
    span = _training_span(steps)
    out["tensor_active_pct"] = _mean(_mean(_nums((gpus.get(k, NO_READINGS).between(*span) if span
                                                      else gpus.get(k, NO_READINGS)).tensor_active))
                                     for k in used)
    # Energy, per GPU of the job: the session's joules and kWh over every sample; J/step and
    # J/sample from the mean power over the training span (as MFU) / steps per training second,
    # so start-up and the idle end do not count against the steps (one number: report, diff,
    # live views and Prometheus all read it from here).
    job_sps = _mean(r["steps_per_s"] for r in ranks)
    sample_rates = [r["samples_per_s"] for r in ranks]
    job_samples = sum(sample_rates) if sample_rates and all(v is not None for v in sample_rates) else None
    rows = []
    for k in used:
        if power_gpus is not None:   # live: energy and power both over the power window
            e = et = gpu_energy(power_gpus.get(k, []))
        else:
            e = readings_energy(gpus.get(k, NO_READINGS))
            et = readings_energy(gpus[k].between(*span)) if span and k in gpus else e
        if et.watts is None:
            et = e
        kw = kwh(e.joules)
        rows.append({"gpu": k, "name": infos[k].data.get("name") if k in infos else None,
                     "joules": e.joules, "seconds": e.seconds, "method": e.method, "why": e.why,
                     "watts": et.watts, "session_watts": e.watts, "joules_per_step": joules_per(et.watts, job_sps),
                     "kwh": kw, "co2e_g": emissions_g(kw, grid_g_per_kwh)})
    out["gpus"] = rows
    watts = [r["watts"] for r in rows]
    all_w = sum(watts) if rows and all(w is not None for w in watts) else None
    methods = sorted({r["method"] for r in rows if r["method"]})
    out["energy_method"] = " + ".join(methods) if methods else None
    out["watts"] = all_w
    out["joules_per_step"] = joules_per(all_w, job_sps)
    out["joules_per_sample"] = joules_per(all_w, job_samples)
    joules = [r["joules"] for r in rows]
    out["kwh"] = kwh(sum(joules)) if rows and all(j is not None for j in joules) else None
    out["grid_g_per_kwh"] = grid_g_per_kwh
    out["co2e_g"] = emissions_g(out["kwh"], grid_g_per_kwh)
    out["energy_off"] = (None if out["joules_per_step"] is not None else
                         ("no GPU samples" if not rows else
                          "no probe steps (steps/s comes from the probe)" if not job_sps else
                          next((r["why"] for r in rows if r["why"]), "no energy reading")))
    return out


def live(store, now: float, window_s: float = WINDOW_S) -> dict:
    """``efficiency`` over the newest ``window_s`` of a SampleStore (gpu_info: the latest).
    The energy and mean power of each GPU come from its two newest energy-counter readings on
    instead (at least ``window_s``, at most POWER_WINDOW_S back): the counter is read every
    ENERGY_EVERY_S at a jittered slow-loop tick, so a 10 s window holds one reading or two,
    and its J/step would flip between the counter and power x time from one second to the next."""
    since = now - window_s
    by_kind = {k: store.window(k, since) for k in (KIND_PROBE_STEP, KIND_GPU)}
    by_kind[KIND_PROBE_CONFIG] = {k: [s] for k, s in store.latest_of_kind(KIND_PROBE_CONFIG).items()}
    by_kind[KIND_GPU_INFO] = {k: [s] for k, s in store.latest_of_kind(KIND_GPU_INFO).items()}
    power = {}
    for k, ss in store.window(KIND_GPU, now - max(window_s, POWER_WINDOW_S)).items():
        read_at = [i for i, s in enumerate(ss) if _num(s.data.get("energy_j")) is not None]
        first = read_at[-2] if len(read_at) >= 2 else len(ss)
        # from the second newest reading, or the newest window_s where that is more recent
        start = min(first, next((i for i, s in enumerate(ss) if s.t >= since), len(ss)))
        power[k] = ss[start:]
    return efficiency(by_kind, power_gpus=power)


def group(samples) -> dict:
    """Samples (time-ordered) -> {kind: {key: [Sample...]}} of the kinds ``efficiency`` reads."""
    out: dict = {}
    for s in samples:
        if s.kind in KINDS:
            out.setdefault(s.kind, {}).setdefault(s.key, []).append(s)
    return out


# -- words: one home for how these numbers read (the report, the Steps view, the overview) -------

def fmt_flops(f: float | None) -> str:
    if f is None:
        return "n/a"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if f >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f:.0f} FLOP"


def mfu_words(res: dict) -> str:
    """'MFU 41.2% (405 of 989 TFLOP/s bf16 dense), tensor active 47%' or 'MFU n/a (why)'."""
    tensor = res.get("tensor_active_pct")
    gpm = f", GPM tensor active {tensor:.0f}%" if tensor is not None else ""
    if res.get("mfu") is None:
        got = res.get("achieved_tflops")
        ach = f"{got:.3g} TFLOP/s achieved; " if got is not None else ""
        return f"{ach}MFU n/a ({res.get('mfu_off')}){gpm}"
    ranks = res.get("ranks") or []
    peak = sum(r["peak_tflops"] for r in ranks)
    dts = sorted({r["dtype"] for r in ranks if r.get("dtype")})
    note = f", {FROM_SETTINGS}" if any(r.get("dtype_note") for r in ranks) else ""
    return (f"MFU {res['mfu'] * 100:.1f}% ({res['achieved_tflops']:.3g} of {peak:.4g} TFLOP/s "
            f"{'/'.join(dts)} dense{note}){gpm}")


def energy_words(res: dict) -> str:
    """'9.5 J/step, 0.3 J/sample, 692 W (power x time)' or 'energy n/a (why)'."""
    if res.get("watts") is None:
        return f"energy n/a ({res.get('energy_off')})"
    parts = []
    if res.get("joules_per_step") is not None:
        parts.append(f"{res['joules_per_step']:.3g} J/step")
    if res.get("joules_per_sample") is not None:
        parts.append(f"{res['joules_per_sample']:.3g} J/sample")
    parts.append(f"{res['watts']:.0f} W ({res.get('energy_method')})")
    if res.get("joules_per_step") is None:
        parts.append(f"per step n/a ({res.get('energy_off')})")
    return ", ".join(parts)


def report_section(samples, report: dict | None = None, gpu_readings: dict | None = None) -> dict:
    """The ``efficiency`` part of ``gputop report``: the whole file (docs/report.md)."""
    res = efficiency(group(samples), gpu_readings=gpu_readings)
    res["window"] = "whole recording"
    return res


def add_emissions(section: dict | None, grid_g_per_kwh: float) -> None:
    """``--grid-intensity G``: CO2e (grams) of the session's GPU energy, per GPU and in all."""
    if not section:
        return
    section["grid_g_per_kwh"] = grid_g_per_kwh
    for g in section.get("gpus") or []:
        g["co2e_g"] = emissions_g(g.get("kwh"), grid_g_per_kwh)
    section["co2e_g"] = emissions_g(section.get("kwh"), grid_g_per_kwh)


def report_lines(res: dict) -> list[str]:
    out = ["efficiency (FLOPs and MFU from the probe, GPU energy; whole recording):"]
    for r in res.get("ranks") or []:
        who = f"rank {r['rank']} (PID {r['pid']})" if r.get("rank") is not None else f"PID {r['pid']}"
        if r.get("flops_per_step") is None:
            out.append(f"  {who}: FLOPs/step n/a ({r.get('flops_off')})")
            continue
        by = r.get("flops_by_dtype") or {}
        mix = ", ".join(f"{k} {v / r['flops_per_step'] * 100:.0f}%"
                        for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
        if r.get("dtype_note"):
            mix += f"; {r['dtype_note']}"
        out.append(f"  {who}: {fmt_flops(r['flops_per_step'])}/step ({mix}) x {r['steps_per_s']:.3g} steps/s = "
                   f"{r['achieved_tflops']:.3g} TFLOP/s on {r.get('device_name') or 'an unknown GPU'}")
        out.append(f"    peak: {r['peak_tflops']:.4g} TFLOP/s dense" if r.get("peak_tflops") is not None
                   else f"    peak n/a: {r.get('peak_source')}")
    out.append("  " + mfu_words(res))
    out.append("  energy: " + energy_words(res))
    for g in res.get("gpus") or []:
        if g.get("joules") is None:
            out.append(f"    GPU{g['gpu']}: n/a ({g.get('why')})")
            continue
        co2 = f", {g['co2e_g']:.3g} gCO2e" if g.get("co2e_g") is not None else ""
        jps = f", {g['joules_per_step']:.3g} J/step" if g.get("joules_per_step") is not None else ""
        out.append(f"    GPU{g['gpu']}: {g['joules'] / 1000:.4g} kJ = {g['kwh']:.4g} kWh over {g['seconds']:.0f} s, "
                   f"{g['watts']:.0f} W mean while training{jps}{co2} ({g['method']})")
    if res.get("kwh") is not None:
        co2 = (f", {res['co2e_g']:.3g} gCO2e at {res['grid_g_per_kwh']:g} g/kWh" if res.get("co2e_g") is not None
               else " (emissions: gputop report --grid-intensity G, in gCO2e/kWh)")
        out.append(f"    session: {res['kwh']:.4g} kWh{co2}")
    return out
