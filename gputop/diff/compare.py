"""``gputop diff A B``: what changed between two recordings, as one JSON-able dict.

Steps/s with an interval (stats.py), the time budgets side by side (the report's ``budget``,
from derive/budget.py), verdicts that appeared or vanished (the report's active shares, from the
whole-file replay), settings that changed (probe config, GPU info, command line), GPU counters
over the training part and energy per step. docs/report.md ("gputop diff") documents the shape.
"""

from __future__ import annotations

import math
import os

from gputop.derive.budget import CATEGORIES, LABELS
from gputop.diff import stats
from gputop.diff.load import Side
from gputop.sources import metric_specs

DIFF_VERSION = 1
EQUIVALENCE = 0.02      # a change whose whole interval lies within +-2% is "no significant change"
PRESENT_SHARE = 0.10    # a verdict is present when active >= 10% of the judged (training) time
LOADER_FACTS = ("dataset", "batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                "drop_last")
CONFIG_FACTS = ("torch", "cuda", "cudnn", "amp_autocast", "tf32_matmul", "tf32_cudnn", "float32_matmul_precision",
                "cudnn_benchmark", "deterministic_algorithms", "anomaly_detection", "cuda_launch_blocking",
                "world_size", "dist_backend", "step_source")
OPTIMIZER_FACTS = ("class", "params", "param_dtypes", "fused", "foreach")
GPU_INFO_FACTS = ("name", "driver", "power_limit_w", "clock_sm_max_mhz", "clock_mem_max_mhz", "mig")
# The settings the conclusion names first (those that most often explain a change of speed).
CONCLUSION_ORDER = ("num_workers", "batch_size", "amp_autocast", "optimizer param_dtypes", "tf32_matmul",
                    "float32_matmul_precision", "torch.compile calls", "GPU", "GPU count", "world_size", "torch",
                    "pin_memory", "cudnn_benchmark", "GPU power_limit_w", "GPU clock_sm_max_mhz", "model parameters")
NOT_IN_CONCLUSION = ("host", "gputop version", "command line", "program")
# What names a job: recordings that differ in one of these are of different jobs (a warning).
IDENTITY = ("program", "GPU", "model parameters")


def compare(a: Side, b: Side) -> dict:
    out: dict = {"diff_version": DIFF_VERSION, "a": _side_facts(a), "b": _side_facts(b)}
    settings = _settings(a, b)
    out["settings"] = settings
    out["warnings"] = _warnings(a, b, settings)
    out["steps"] = _steps(a, b)
    out["step_split"] = _step_split(a, b)
    out["budget"] = _budget(a, b)
    out["verdicts"] = _verdicts(a, b)
    out["gpu"] = _gpu(a, b)
    out["energy"] = _energy(a, b)
    out["conclusion"] = conclusion(out)
    return out


def _side_facts(s: Side) -> dict:
    sess = s.report.get("session") or {}
    target = sess.get("target") if isinstance(sess.get("target"), dict) else {}
    pool = s.pool
    span = s.span
    return {"file": s.path, "command": _cmdline(s), "pid": target.get("pid"), "duration_s": sess.get("duration_s"),
            "damage": sess.get("damage"), "probe_process": s.process,
            "training_s": round(span[1] - span[0], 3) if span else None,
            "steps": pool.timed_steps, "steps_per_s": _r(pool.steps_per_training_s, 3),
            "step_ms_mean": _r(pool.step_ms_mean, 3)}


def _cmdline(s: Side) -> str | None:
    target = (s.report.get("session") or {}).get("target")
    cmd = target.get("cmdline") if isinstance(target, dict) else None
    return " ".join(str(c) for c in cmd) if isinstance(cmd, list) and cmd else None


def _program(s: Side) -> str | None:
    """What the command runs, without its options: the script (``train.py``), the module after
    ``-m``, else the executable's name. Two recordings of one program with other arguments are
    one job with a changed setting; two programs are two jobs."""
    target = (s.report.get("session") or {}).get("target")
    cmd = target.get("cmdline") if isinstance(target, dict) else None
    if not isinstance(cmd, list) or not cmd:
        return None
    args = [str(c) for c in cmd]
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return "-m " + args[i + 1]
        if arg.endswith(".py"):
            return os.path.basename(arg)
    return os.path.basename(args[0])


# -- steps -------------------------------------------------------------------------------------

def _steps(a: Side, b: Side) -> dict:
    pa, pb = a.pool, b.pool
    ra, rb = pa.steps_per_training_s, pb.steps_per_training_s
    out: dict = {"a": _r(ra, 3), "b": _r(rb, 3), "level": stats.LEVEL,
                 "method": "Welch t-interval on log(steps/s) of fixed windows, centred on the pooled ratio",
                 "equivalence_pct": EQUIVALENCE * 100}
    if not ra or not rb:
        missing = [n for n, r in (("A", ra), ("B", rb)) if not r]
        out["why_none"] = f"no training steps from the probe in {' and '.join(missing)}"
        out["result"] = "unknown"
        return out
    length = stats.window_length(_span_len(a), _span_len(b))
    wa, wb = stats.window_rates(a.windows, length), stats.window_rates(b.windows, length)
    ci = stats.ratio_interval(ra, rb, wa, wb)
    out.update({"window_s": round(length, 3), "windows_a": ci.n_a, "windows_b": ci.n_b,
                "window_rates_a": [round(r, 3) for r in wa], "window_rates_b": [round(r, 3) for r in wb],
                "ratio": _r(ci.ratio, 4), "change_pct": _pct(ci.ratio)})
    # Step time is the inverse of steps/s while training (StepPool): its change and interval follow.
    out["step_ms"] = {"a": _r(pa.step_ms_mean, 3), "b": _r(pb.step_ms_mean, 3), "change_pct": _pct(1 / ci.ratio)}
    if ci.low is None:
        out["why_none"] = ci.why_none
        out["result"] = "unknown"
        return out
    out["ci_pct"] = [_pct(ci.low), _pct(ci.high)]
    out["df"] = _r(ci.df, 1) if ci.df is not None and math.isfinite(ci.df) else None
    out["step_ms"]["ci_pct"] = [_pct(1 / ci.high), _pct(1 / ci.low)]
    within = 1 - EQUIVALENCE <= ci.low and ci.high <= 1 + EQUIVALENCE
    if ci.low <= 1 <= ci.high or within:
        out["result"] = "no_change"
        out["within_equivalence"] = within
    else:
        out["result"] = "slower" if ci.high < 1 else "faster"
    # B's slowdown (fewer steps/s) as the interval's ends: what --fail-above compares.
    out["slowdown_pct"] = {"point": -_pct(ci.ratio), "low": -_pct(ci.high), "high": -_pct(ci.low)}
    return out


def _span_len(s: Side) -> float:
    span = s.span
    return (span[1] - span[0]) if span else 0.0


def _step_split(a: Side, b: Side) -> list[dict]:
    """Where a step's time goes (probe), per step, side by side."""
    rows = []
    for name, unit, get in (
            ("step time", "ms", lambda p: p.step_ms_mean),
            ("data wait per step", "ms", lambda p: p.data_wait_ms_per_step),
            ("GPU time per step", "ms", lambda p: p.gpu_ms_per_step),
            ("other host time per step", "ms", lambda p: p.other_ms_per_step),
            ("data wait share", "%", lambda p: None if p.data_wait_share is None else p.data_wait_share * 100),
            ("samples/s", "/s", lambda p: p.samples_per_s),
            ("syncs per step", "", lambda p: p.syncs_per_step)):
        va, vb = get(a.pool), get(b.pool)
        if va is not None or vb is not None:
            rows.append({"name": name, "unit": unit, "a": _r(va, 3), "b": _r(vb, 3)})
    return rows


# -- budget, verdicts --------------------------------------------------------------------------

def _shares(s: Side) -> dict | None:
    bud = s.report.get("budget")
    train = bud.get("training") if isinstance(bud, dict) else None
    shares = train.get("shares") if isinstance(train, dict) else None
    return shares if isinstance(shares, dict) else None


def _budget(a: Side, b: Side) -> dict:
    sa, sb = _shares(a), _shares(b)
    rows = []
    for cat in CATEGORIES:
        va, vb = (sa or {}).get(cat), (sb or {}).get(cat)
        if (va or 0) >= 0.005 or (vb or 0) >= 0.005:
            rows.append({"category": cat, "label": LABELS[cat], "a": va, "b": vb,
                         "delta": None if va is None or vb is None else round(vb - va, 4)})
    return {"a": sa is not None, "b": sb is not None, "rows": rows}


def _verdict_shares(s: Side) -> dict[str, dict]:
    v = s.report.get("verdicts")
    return {k: x for k, x in v.items() if isinstance(x, dict)} if isinstance(v, dict) else {}


def _verdicts(a: Side, b: Side) -> dict:
    va, vb = _verdict_shares(a), _verdict_shares(b)
    rows = []
    for vid in sorted(set(va) | set(vb)):
        sa = _num((va.get(vid) or {}).get("active_share")) or 0.0
        sb = _num((vb.get(vid) or {}).get("active_share")) or 0.0
        title = (vb.get(vid) or va.get(vid) or {}).get("title")
        rows.append({"id": vid, "title": title, "a": round(sa, 3), "b": round(sb, 3)})
    appeared = [r["id"] for r in rows if r["b"] >= PRESENT_SHARE > r["a"]]
    vanished = [r["id"] for r in rows if r["a"] >= PRESENT_SHARE > r["b"]]
    prim = {k: ((s.report.get("primary_verdict") or {}).get("id")) for k, s in (("a", a), ("b", b))}
    return {"present_share": PRESENT_SHARE, "rows": rows, "appeared": appeared, "vanished": vanished, "primary": prim}


# -- settings ----------------------------------------------------------------------------------

def _config(s: Side) -> dict:
    probe = s.report.get("probe")
    ranks = probe.get("ranks") if isinstance(probe, dict) else None
    for r in ranks or []:
        if isinstance(r, dict) and str(r.get("pid")) == str(s.process):
            return r.get("config") if isinstance(r.get("config"), dict) else {}
    return {}


def _facts(s: Side) -> dict[str, object]:
    """Every setting the recording carries, by a name people know. None: not recorded."""
    cfg = _config(s)
    sess = s.report.get("session") or {}
    out: dict[str, object] = {"program": _program(s), "command line": _cmdline(s), "host": sess.get("host"),
                              "gputop version": sess.get("gputop_version")}
    gpus = s.watched_gpus()
    out["GPU count"] = len(gpus) if gpus else None
    infos = [s.gpu_info.get(k, {}) for k in gpus]
    for fact in GPU_INFO_FACTS:
        vals = sorted({str(i.get(fact)) for i in infos if i.get(fact) is not None})
        out["GPU" if fact == "name" else f"GPU {fact}"] = ", ".join(vals) if vals else None
    for fact in CONFIG_FACTS:
        out[fact] = _plain(cfg.get(fact))
    opt = cfg.get("optimizer") if isinstance(cfg.get("optimizer"), dict) else {}
    for fact in OPTIMIZER_FACTS:
        out["model parameters" if fact == "params" else f"optimizer {fact}"] = _plain(opt.get(fact))
    comp = cfg.get("compile") if isinstance(cfg.get("compile"), dict) else {}
    out["torch.compile calls"] = comp.get("calls")
    loaders = cfg.get("loaders") if isinstance(cfg.get("loaders"), list) else []
    loaders = [ld for ld in loaders if isinstance(ld, dict)]
    for i, ld in enumerate(loaders[:4]):
        prefix = "" if i == 0 else f"DataLoader {i + 1} "
        for fact in LOADER_FACTS:
            out[prefix + fact] = _plain(ld.get(fact))
    return out


def _plain(v):
    if isinstance(v, list):
        return ", ".join(str(x) for x in v) if v else None
    return v


def _settings(a: Side, b: Side) -> dict:
    fa, fb = _facts(a), _facts(b)
    names = [n for n in dict.fromkeys([*fa, *fb]) if fa.get(n) is not None or fb.get(n) is not None]
    changed = [{"name": n, "a": fa.get(n), "b": fb.get(n)} for n in names if fa.get(n) != fb.get(n)]
    return {"compared": names, "changed": changed}


def _warnings(a: Side, b: Side, settings: dict) -> list[str]:
    out = []
    for s, name in ((a, "A"), (b, "B")):
        dmg = (s.report.get("session") or {}).get("damage")
        if dmg:
            out.append(f"{name} ({s.path}) is damaged: {dmg}; compared what was read")
    differ = [c["name"] for c in settings["changed"] if c["name"] in IDENTITY and c["a"] is not None
              and c["b"] is not None]
    if differ:
        out.append(f"A and B look like different jobs ({', '.join(differ)} differ): comparing what is comparable")
    return out


# -- GPU counters, energy ----------------------------------------------------------------------

def _gpu(a: Side, b: Side) -> list[dict]:
    from gputop.catalogue import KIND_GPU

    specs = {m.field: m for m in metric_specs() if m.kind == KIND_GPU}
    ma, mb = a.gpu_means(), b.gpu_means()
    rows = []
    for name in dict.fromkeys([*ma, *mb]):
        spec = specs.get(name)
        rows.append({"field": name, "label": spec.label if spec else name, "unit": spec.unit if spec else "",
                     "a": _r(ma.get(name), 3), "b": _r(mb.get(name), 3)})
    return rows


def _energy(a: Side, b: Side) -> dict:
    """Joules per training step: the report's own figure (derive/efficiency.py: the energy
    counter where the recording has it, else power x time, over the training span), so the
    diff shows the number `gputop report` shows."""
    methods = []
    out: dict = {}
    for key, s in (("a", a), ("b", b)):
        eff = s.report.get("efficiency") if isinstance(s.report.get("efficiency"), dict) else {}
        out[key] = _r(eff.get("joules_per_step"), 3)
        if eff.get("energy_method"):
            methods.append(f"{key.upper()}: {eff['energy_method']}")
    out["method"] = "; ".join(methods) or None
    if out["a"] is None and out["b"] is None:
        out["why_none"] = "no energy per step in either recording (no probe steps, or no GPU power readings)"
    return out


# -- the one line ------------------------------------------------------------------------------

def conclusion(d: dict) -> str:
    st = d["steps"]
    res = st.get("result")
    if res == "unknown":
        head = f"steps/s not compared ({st.get('why_none')})"
    elif res == "no_change":
        lo, hi = st["ci_pct"]
        band = f"within +-{EQUIVALENCE * 100:.0f}%" if st.get("within_equivalence") else "interval includes 0"
        head = f"no significant change in steps/s ({_signed(st['change_pct'])}, {stats.LEVEL * 100:.0f}% CI " \
               f"{_signed(lo)} to {_signed(hi)}: {band})"
    else:
        lo, hi = sorted(abs(x) for x in st["ci_pct"])
        head = f"B is {abs(st['change_pct']):.0f}% {res} ({stats.LEVEL * 100:.0f}% CI {lo:.0f}-{hi:.0f}%)"
    why = [f"{v} appeared" for v in d["verdicts"]["appeared"]] + [f"{v} vanished" for v in d["verdicts"]["vanished"]]
    changed = [c for c in d["settings"]["changed"] if c["name"] not in NOT_IN_CONCLUSION]
    order = {name: i for i, name in enumerate(CONCLUSION_ORDER)}
    changed.sort(key=lambda c: order.get(c["name"], len(order)))
    why += [f"{c['name']} {_show(c['a'])} -> {_show(c['b'])}" for c in changed[:4]]
    return head + (": " + "; ".join(why) if why else "")


def _signed(v: float) -> str:
    return f"{v:+.1f}%"


def _show(v) -> str:
    return "n/a" if v is None else str(v)


def _pct(ratio: float) -> float:
    return round((ratio - 1) * 100, 2)


def _r(x, nd: int):
    return None if x is None else round(x, nd)


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
