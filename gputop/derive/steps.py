"""Training steps as the in-process probe saw them: the one step pool, the report's section and
the panel's split.

Pure functions over ``probe_*`` samples (gputop/sources/probe_client.py). ``pool_steps`` is the
one place that adds step windows up (the verdict signals, the Steps view, the ranks table and
the report call it); its rates say what they divide by (``StepPool``). Statistics over a
whole run are built from the windows' sums, never from averages of averages: mean step time is
sum(step time) / number of timed steps; the data-wait share is sum(data wait) / sum(step time);
percentiles come from the merged step-time histograms (1/8-octave buckets, so within ~4.5%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gputop.model import KIND_HEALTH, Sample
from gputop.probe import wire
from gputop.catalogue import KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_STEP, KIND_PROBE_SYNC
from gputop.sources.probe_fields import COPY_WAYS, COPY_WHATS

CONFIG_FACTS = ("torch", "cuda", "cudnn", "device_name", "amp_autocast", "tf32_matmul", "tf32_cudnn",
                "float32_matmul_precision", "cudnn_benchmark", "deterministic_algorithms", "anomaly_detection",
                "compile", "cuda_launch_blocking", "sync_debug_mode_job", "world_size", "dist_backend",
                "optimizer", "loaders", "step_source", "hooks")


def _n(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int too big for a float (a damaged file)
        return None
    return f if math.isfinite(f) else None


def _int(v) -> int:
    """A count from a window: 0 when it is missing, negative or not a finite number."""
    f = _n(v)
    return 0 if f is None or f < 0 else int(v) if isinstance(v, int) else int(f)


def _dur(v) -> float | None:
    """A duration from a window (seconds): None when it is missing, negative or not finite."""
    f = _n(v)
    return None if f is None or f < 0 else f


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
    hooks = config.get("hooks")
    h = hooks.get(hook) if isinstance(hooks, dict) else None
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


# the steps' excess over the median step is a recompile's cost where dynamo's clock explains this
# share of it (StepPool.recompile_cost_share)
RECOMPILE_EXCESS_EXPLAINED = 0.5


EXCESS_MIN_STEPS = 10   # timed steps a median of the step time needs (StepPool.slow_step_excess)


@dataclass(frozen=True)
class StepPool:
    """Probe step windows pooled into sums, and the rates that follow from them, each named for
    what it divides by. One place, so every view's "steps/s" means what its label says:

    - ``steps_per_observed_s``: every step boundary / every second the probe watched (idle and
      start-up windows included): the probe's own per-window ``steps_per_s``, the live panels.
    - ``steps_per_training_s``: timed steps / their summed durations = 1 / mean step time: the
      rate while training, what ``gputop report`` prints as steps/s.
    """

    windows: int = 0
    steps: int = 0                      # step boundaries (the first of a run is not timed)
    timed_steps: int = 0                # steps with a duration (``step_n``)
    step_s_sum: float = 0.0
    observed_s: float = 0.0             # Σ window_s of every window
    training_s: float = 0.0             # Σ window_s of the windows in which a step ended
    fed_s: float = 0.0                  # Σ window_s of the windows in which a batch was fetched
    data_wait_s_sum: float | None = None   # None: no window timed its waits
    gpu_n: int = 0
    gpu_s_sum: float = 0.0
    syncs: int | None = None            # None: no window counted syncs
    sync_steps: int = 0                 # timed steps of the windows that counted syncs
    batches: int = 0
    step_batches: int | None = None     # batches fetched by the steps (None: never said)
    step_samples: int = 0
    samples: int | None = None          # None: some batch had no known size
    step_hist: dict = field(default_factory=dict)   # merged 1/8-octave buckets -> count
    step_ms_max: float | None = None
    # torch.compile (gputop/probe/compiles.py): None where no window read dynamo's compilations
    compile_s: float | None = None      # Σ seconds compiling
    recompile_s: float = 0.0            # Σ seconds of those that were recompiles (a guard failed)
    compile_observed_s: float = 0.0     # Σ window_s of the windows that read them
    recompiles: int = 0
    recompile_windows: int = 0          # windows with a recompile (one is an event, not a pattern)
    recompile_limit_hits: int = 0
    recompile_top: dict | None = None   # the window's function with most recompiles (newest such)
    # GradScaler (gputop/probe/amp_scaler.py): None where no window saw a scaler step
    scaler_steps: int | None = None
    skipped_steps: int = 0
    skipped_unknown: int = 0            # steps of fused optimizers: skips not seen
    loss_scales: list = field(default_factory=list)   # each window's loss scale, in order (None: not known)

    @property
    def skipped_share(self) -> float | None:
        """Share of the GradScaler steps whose skip was seen that were skipped (0-1)."""
        seen = (self.scaler_steps or 0) - self.skipped_unknown
        return self.skipped_steps / seen if seen > 0 else None

    @property
    def compile_share(self) -> float | None:
        """Share of the watched time spent compiling (0-1), over windows that read dynamo."""
        if self.compile_s is None or not self.compile_observed_s:
            return None
        return min(1.0, self.compile_s / self.compile_observed_s)

    @property
    def recompile_share(self) -> float | None:
        """Share of the watched time spent recompiling (0-1): compiles whose guard failed."""
        if self.compile_s is None or not self.compile_observed_s:
            return None
        return min(1.0, self.recompile_s / self.compile_observed_s)

    @property
    def recompile_cost_share(self) -> float | None:
        """What recompiling cost, as a share of the watched time (0-1): dynamo's own clock of the
        recompiles (``recompile_share``), or the steps' excess over a typical step, 1 - median
        step / mean step, where dynamo's clock explains at least half of that excess
        (``RECOMPILE_EXCESS_EXPLAINED``: a checkpoint's slow steps are not a recompile's). While
        fewer than half the steps recompile, the median step is one whose guard held, what every
        step costs once the shapes are fixed, and the mean's excess over it is what the recompiles
        cost, including what dynamo's clock leaves out (inductor's Triton builds in its worker
        processes, autotuning the new kernels, each new graph's first run): on the H100's
        compile_varlen dynamo's clock said 82% of a minute, the steps 99.4% (median 11.1 ms, mean
        1737 ms), and padding to one length measured 124x. When most steps recompile, the median
        is a recompiling step and dynamo's clock stands. (The pool is the rule's 60 s horizon,
        warm-up included when it is that recent: the first step, which waits for the first
        compile, is not timed, and first compiles are not recompiles, so they explain nothing.
        On the H200's compile_varlen, comparing dynamo's share of the watched time -- the first
        compile's 15 s without a step included -- with the excess share of the steps' time held
        the cost at 45% for the first 15 s the rule held: seconds are compared with seconds.)"""
        share = self.recompile_share
        p50 = self.step_ms_percentile(50)
        if share is None or p50 is None or not self.step_s_sum:
            return share
        # (seconds against seconds: dynamo's share is of the watched time, which holds the stretch
        # before the first step, compiling, while the excess is of the steps' time)
        excess_s = max(0.0, self.step_s_sum - self.timed_steps * p50 / 1000.0)
        if self.recompile_s < RECOMPILE_EXCESS_EXPLAINED * excess_s:
            return share
        return max(share, excess_s / self.step_s_sum)

    @property
    def steps_per_observed_s(self) -> float | None:
        return self.steps / self.observed_s if self.observed_s else None

    @property
    def steps_per_training_s(self) -> float | None:
        return self.timed_steps / self.step_s_sum if self.step_s_sum else None

    @property
    def step_s_mean(self) -> float | None:
        return self.step_s_sum / self.timed_steps if self.timed_steps else None

    @property
    def step_ms_mean(self) -> float | None:
        return 1000.0 * self.step_s_sum / self.timed_steps if self.timed_steps else None

    def step_ms_percentile(self, q: float) -> float | None:
        v = hist_percentile(self.step_hist, q) if self.step_hist else None
        return None if v is None else v * 1000

    @property
    def slow_step_excess(self) -> float | None:
        """The share of step time above the median step (0-1): what the steps would save if
        every one ran at the median, ``1 - p50 / mean``. A cost that falls on some steps only (a
        checkpoint every N steps, a debug dump) is all in it, whatever the main thread did
        around it; one that falls on every step is in the median, so not in it. None under
        ``EXCESS_MIN_STEPS`` timed steps. (The histogram has 8 buckets an octave: the median is
        within ~4%.)"""
        mean, p50 = self.step_ms_mean, self.step_ms_percentile(50)
        if self.timed_steps < EXCESS_MIN_STEPS or not mean or not p50:
            return None
        return max(0.0, 1.0 - p50 / mean)

    @property
    def data_wait_share(self) -> float | None:
        """Σ data wait / Σ step time."""
        if self.data_wait_s_sum is None or not self.step_s_sum:
            return None
        return self.data_wait_s_sum / self.step_s_sum

    @property
    def data_wait_ms_per_step(self) -> float | None:
        if not self.timed_steps:
            return None
        return (self.data_wait_s_sum or 0.0) / self.timed_steps * 1000

    @property
    def gpu_ms_per_step(self) -> float | None:
        return self.gpu_s_sum / self.gpu_n * 1000 if self.gpu_n else None

    @property
    def gpu_share(self) -> float | None:
        """Mean GPU span of the steps timed on the GPU / mean step time."""
        if not self.gpu_n or not self.timed_steps or not self.step_s_sum:
            return None
        return (self.gpu_s_sum / self.gpu_n) / (self.step_s_sum / self.timed_steps)

    @property
    def data_idle_share(self) -> float | None:
        """The share of step time the GPU idled while the loop waited for its batch: the GPU had
        nothing of the step to do before the batch's event, so it idled ``step - span`` of each
        step, and that while the loop waited: min(data wait, 1 - GPU span) / step. None without
        a timed wait or a GPU span. (benchmarks/corpus_split.py compares it with the budget.)"""
        wait, gpu = self.data_wait_share, self.gpu_share
        if wait is None or gpu is None:
            return None
        return min(wait, max(0.0, 1.0 - gpu))

    @property
    def other_ms_per_step(self) -> float | None:
        mean_s = self.step_s_mean
        if mean_s is None:
            return None
        return max(0.0, mean_s * 1000 - (self.data_wait_ms_per_step or 0.0) - (self.gpu_ms_per_step or 0.0))

    @property
    def syncs_per_step(self) -> float | None:
        """Syncs / timed steps of the windows that counted syncs."""
        return self.syncs / self.sync_steps if self.sync_steps else None

    @property
    def syncs_per_timed_step(self) -> float | None:
        """Syncs / every timed step, windows without counting adding steps but no syncs: lower
        than ``syncs_per_step`` while counting was off for part of the pool. What the verdict
        rules read (``probe.syncs_per_step``), kept so that their findings do not move."""
        return self.syncs / self.timed_steps if (self.syncs is not None and self.timed_steps) else None

    @property
    def batches_per_step(self) -> float | None:
        return self.step_batches / self.steps if (self.steps and self.step_batches is not None) else None

    @property
    def batches_per_s(self) -> float | None:
        """Batches per step × steps per training second; per second of the windows that fetched
        batches when no step said how many it fetched."""
        if self.step_s_sum and self.steps and self.step_batches:
            return self.step_batches / self.steps * self.timed_steps / self.step_s_sum
        return self.batches / self.fed_s if self.fed_s else None

    @property
    def samples_per_s(self) -> float | None:
        """Like ``batches_per_s``, in samples; None when some batch had no known size."""
        if self.samples is None:
            return None
        if self.step_s_sum and self.steps and self.step_samples:
            return self.step_samples / self.steps * self.timed_steps / self.step_s_sum
        return self.samples / self.fed_s if self.fed_s else None


def pool_collectives(windows) -> tuple[float, float] | None:
    """(exposed collective time, all collective time), each over step time, pooled over probe
    windows that carry the probe's collective timing (gputop/probe/collectives.py); None when
    none does (older recordings, jobs without torch.distributed). One pooling for the ranks
    table and the verdicts' signals."""
    exposed = total = step = 0.0
    for w in windows:
        d = w.data if isinstance(w, Sample) else w
        e, c, st = d.get("collective_exposed_s_sum"), d.get("collective_s_sum"), d.get("step_s_sum")
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (e, c, st)) and st > 0:
            exposed, total, step = exposed + e, total + c, step + st
    return (min(1.0, exposed / step), min(1.0, total / step)) if step > 0 else None


def pool_steps(windows) -> StepPool:
    """Pool ``probe_step`` window samples (in time order) into a StepPool, from the windows'
    sums. The one place that adds windows up: signals, the Steps view, the ranks table and the
    report all read these numbers."""
    windows = list(windows)
    steps = timed = gpu_n = batches = step_samples = sync_steps = 0
    step_s = observed = fed = gpu_s = 0.0
    training: float = 0   # stays the int 0 without a training window, as the report's JSON has said
    wait: float | None = None
    syncs: int | None = None
    step_batches: int | None = None
    samples: int | None = 0
    hist: dict[int, int] = {}
    step_max: float | None = None
    compile_s: float | None = None
    compile_w = recompile_s = 0.0
    recompiles = limit_hits = recompile_windows = 0
    top: dict | None = None
    scaler_steps: int | None = None
    skipped = skipped_unknown = 0
    scales: list = []
    for s in windows:
        n = _int(s.get("step_n"))
        w = _dur(s.get("window_s")) or 0.0
        steps += _int(s.get("steps"))
        timed += n
        step_s += _dur(s.get("step_s_sum")) or 0.0
        observed += w
        if s.get("steps"):
            training += w
        if s.get("batches"):
            fed += w
            if s.get("samples") is None:
                samples = None
            elif samples is not None:
                samples += _int(s.get("samples"))
        dw = _dur(s.get("data_wait_s_sum"))
        if dw is not None:
            wait = dw if wait is None else wait + dw
        gpu_n += _int(s.get("gpu_n"))
        gpu_s += _dur(s.get("gpu_s_sum")) or 0.0
        if s.get("syncs") is not None:
            syncs = (syncs or 0) + _int(s.get("syncs"))
            sync_steps += n
        batches += _int(s.get("batches"))
        if s.get("step_batches") is not None:
            step_batches = (step_batches or 0) + _int(s.get("step_batches"))
        step_samples += _int(s.get("step_samples"))
        h = s.get("step_hist")
        if isinstance(h, dict):
            for b, c in h.items():
                try:
                    b, c = int(b), int(c)
                except (TypeError, ValueError, OverflowError):
                    continue
                if 0 <= b <= wire.MAX_HIST_BUCKET and c >= 0:   # (else damage: its time overflows)
                    hist[b] = hist.get(b, 0) + c
        mx = _n(s.get("step_ms_max"))
        if mx is not None and (step_max is None or mx > step_max):
            step_max = mx
        cs = _n(s.get("compile_s"))
        if cs is not None and cs >= 0:
            compile_s = (compile_s or 0.0) + cs
            compile_w += w
            recompile_s += max(0.0, _n(s.get("recompile_s")) or 0.0)
            recompiles += _int(s.get("recompiles"))
            recompile_windows += _int(s.get("recompiles")) > 0
            limit_hits += _int(s.get("recompile_limit_hits"))
            if s.get("recompile_fn") is not None or s.get("recompile_reason") is not None:
                top = {"function": s.get("recompile_fn"), "where": s.get("recompile_where"),
                       "reason": s.get("recompile_reason"), "count": _int(s.get("recompile_count")),
                       "limit": bool(_int(s.get("recompile_limit_hits")))}
        ss = s.get("scaler_steps")
        if type(ss) is int and ss > 0:
            scaler_steps = (scaler_steps or 0) + ss
            skipped += _int(s.get("skipped_steps"))
            skipped_unknown += _int(s.get("skipped_unknown"))
            scales.append(_n(s.get("loss_scale")))
    return StepPool(windows=len(windows), steps=steps, timed_steps=timed, step_s_sum=step_s, observed_s=observed,
                    training_s=training, fed_s=fed, data_wait_s_sum=wait, gpu_n=gpu_n, gpu_s_sum=gpu_s,
                    syncs=syncs, sync_steps=sync_steps, batches=batches, step_batches=step_batches,
                    step_samples=step_samples, samples=samples, step_hist=hist, step_ms_max=step_max,
                    compile_s=compile_s, recompile_s=recompile_s, compile_observed_s=compile_w,
                    recompiles=recompiles, recompile_windows=recompile_windows,
                    recompile_limit_hits=limit_hits, recompile_top=top, scaler_steps=scaler_steps,
                    skipped_steps=skipped, skipped_unknown=skipped_unknown, loss_scales=scales)


def copies_of(sample) -> dict | None:
    """The counted step's copies between host and GPU from a probe_step sample (gputop/probe/
    flops.py): {"d2h": {...}, "h2d": {...}}, each with bytes, pageable_bytes, ms and n per step;
    None where the probe counted none (no count yet, an older probe, torch.compile in use)."""
    out = {}
    for way, _words in COPY_WAYS:
        row = {what: sample.get(f"copy_{way}_{what}") for what in COPY_WHATS}
        if type(row["bytes"]) not in (int, float):
            return None
        out[way] = {k: (v if type(v) in (int, float) else None) for k, v in row.items()}
    return out


def latest_copies(windows: list) -> dict | None:
    """The copies the probe's newest window carries (a count repeats in every window until the
    next one, and a withdrawn count carries none): what the report, the verdicts and the Steps
    view all show."""
    return copies_of(windows[-1]) if windows else None


def copies_text(copies: dict | None) -> str:
    """One clause for the copies of ``copies_of`` ("device->host 512 MB, all pageable, 41 ms;
    host->device ..."), the ways under 1 MB a step left out; "" when none is. The report's probe
    section and the verdicts' evidence say it in these words."""
    parts = []
    for way, words in COPY_WAYS:
        row = (copies or {}).get(way) or {}
        n, pageable, ms = row.get("bytes"), row.get("pageable_bytes"), row.get("ms")
        if not isinstance(n, (int, float)) or n < 1e6:
            continue
        kind = ""
        if isinstance(pageable, (int, float)):
            kind = ("all pageable" if pageable >= n else "all pinned" if pageable <= 0
                    else f"{pageable / n * 100:.0f}% pageable")
        parts.append(f"{words} {n / 1e6:.0f} MB" + (f", {kind}" if kind else "")
                     + (f", {ms:.0f} ms" if isinstance(ms, (int, float)) else ""))
    return "; ".join(parts)


def _rank_section(key: str, windows: list[Sample], configs: list[Sample], memory: list[Sample],
                  syncs: list[Sample]) -> dict:
    pool = pool_steps(windows)
    last = windows[-1].data if windows else {}
    cfg = configs[-1].data if configs else {}
    out: dict = {
        "pid": key,
        "rank": last.get("rank") if last.get("rank") is not None else cfg.get("rank"),
        "windows": pool.windows,
        "observed_s": _r(pool.observed_s),
        "steps": pool.steps,
        "step_total_at_end": last.get("step_total"),
        "step_source": cfg.get("step_source"),
        # Rates over the windows in which the job was training (a step ended), not over the time it
        # spent starting up, evaluating or waiting before or after.
        "training_s": _r(pool.training_s),
        # While training: timed steps over their summed durations (consecutive boundaries, so
        # exactly the time from the first to the last step) = 1 / mean step time.
        "steps_per_s": _r(pool.steps_per_training_s),
        "step_ms": {
            "n": pool.timed_steps,
            "mean": _r(pool.step_ms_mean),
            "p50": _r(pool.step_ms_percentile(50)),
            "p90": _r(pool.step_ms_percentile(90)),
            "p99": _r(pool.step_ms_percentile(99)),
            "max": _r(pool.step_ms_max),
        },
        # the share of step time above the median step (io_stall's cost where larger than its budget share)
        "slow_step_excess": _r(pool.slow_step_excess, 4),
        "data_wait_ms_per_step": _r(pool.data_wait_ms_per_step),
        "data_wait_share": _r(pool.data_wait_share, 4),
        # the share of step time the GPU idled while the loop waited for its batch (input_bound's cost)
        "data_idle_share": _r(pool.data_idle_share, 4),
        "gpu_ms_per_step": _r(pool.gpu_ms_per_step),
        "gpu_steps_timed": pool.gpu_n,
        "gpu_info": None if pool.gpu_n else off_reason(cfg, "cuda_events"),
        "other_ms_per_step": _r(pool.other_ms_per_step),
        "batches": pool.batches,
        "batches_per_s": _r(pool.batches_per_s),
        "samples": pool.samples,
        "samples_per_s": _r(pool.samples_per_s),
        "syncs_per_step": _r(pool.syncs_per_step),
        "sync_info": None if pool.syncs is not None else off_reason(cfg, "syncs"),
        "sync_lines": list(syncs[-1].get("lines") or [])[:5] if syncs else [],
        # the last counted step's copies between host and GPU (per step; None: none counted)
        "copies": latest_copies(windows),
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
    return "n/a" if _n(v) is None else f"{v:.{nd}f}{unit}"


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
        out.append(f"{who}: {r['steps']} steps, {_fmt(r['steps_per_s'], ' steps/s', 2)} while training; "
                   f"step mean {_fmt(sm['mean'], ' ms')}, "
                   f"p50 {_fmt(sm['p50'], ' ms')}, p90 {_fmt(sm['p90'], ' ms')}, max {_fmt(sm['max'], ' ms')}")
        if r.get("step_source") == "forward":
            out.append("  steps are the model's calls: the job steps no optimizer (inference, or evaluation alone)")
        wait = r["data_wait_share"]
        gpu = (f"GPU {_fmt(r['gpu_ms_per_step'], ' ms')}" if r["gpu_ms_per_step"] is not None
               else f"GPU n/a ({r['gpu_info']})")
        out.append(f"  per step: data wait {_fmt(r['data_wait_ms_per_step'], ' ms')}"
                   f" ({_fmt(None if wait is None else wait * 100, '%', 0)}), {gpu}, other {_fmt(r['other_ms_per_step'], ' ms')}")
        samples = f", {_fmt(r['samples_per_s'], ' samples/s', 1)}" if r.get("samples_per_s") is not None else ""
        out.append(f"  data: {_fmt(r['batches_per_s'], ' batches/s', 1)}{samples}")
        if r["syncs_per_step"] is not None:
            top = r["sync_lines"][0] if r["sync_lines"] else None
            if not (isinstance(top, list) and len(top) >= 2):
                top = None  # not the [line, count] pair the probe writes
            out.append(f"  syncs: {_fmt(r['syncs_per_step'], '/step', 2)}"
                       + (f", most at {top[0]} ({top[1]}x)" if top else ""))
        else:
            out.append(f"  syncs: n/a ({r['sync_info']})")
        if r.get("copies") is not None:
            out.append(f"  copies per step (one counted step): {copies_text(r['copies']) or 'none over 1 MB'}")
        cfg = r.get("config") or {}
        loaders = cfg.get("loaders") if isinstance(cfg.get("loaders"), list) else []
        for ld in [ld for ld in loaders if isinstance(ld, dict)][:2]:
            out.append(f"  DataLoader: batch_size {ld.get('batch_size')}, num_workers {ld.get('num_workers')}, "
                       f"pin_memory {ld.get('pin_memory')}, prefetch_factor {ld.get('prefetch_factor')}, "
                       f"persistent_workers {ld.get('persistent_workers')}")
        facts = []
        if cfg.get("amp_autocast") and isinstance(cfg["amp_autocast"], list):
            facts.append("AMP " + ",".join(str(a) for a in cfg["amp_autocast"]))
        if cfg.get("tf32_matmul") is not None:
            facts.append(f"TF32 matmul {'on' if cfg['tf32_matmul'] else 'off'}")
        if cfg.get("cudnn_benchmark") is not None:
            facts.append(f"cudnn.benchmark {'on' if cfg['cudnn_benchmark'] else 'off'}")
        comp = cfg.get("compile") if isinstance(cfg.get("compile"), dict) else {}
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
