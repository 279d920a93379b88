"""The in-process probe's panels: training steps, their split, syncs and speed settings.

- Overview (ORDER 30, between the GPUs and the host): one line per training rank -- steps/s,
  step time and its split into data wait / GPU time / other host time, syncs per step -- or,
  with more than two ranks, the spread and the slowest rank.
- The "Steps" view: per rank the full story (rates, split bar, batches and samples, the line
  that syncs most, sparklines), the settings that matter for speed, and syncs by source line.
  Without a probe it says what the probe would add and how to enable it (the probe source's
  health message).

All numbers come from ``probe_*`` samples (gputop/sources/probe_client.py; docs/metrics.md).
"""

from __future__ import annotations

import os

from rich.text import Text

from gputop.derive.steps import copies_text, latest_copies, off_reason, pool_steps, step_split
from gputop.catalogue import KIND_PROBE_STEP
from gputop.sources.probe_fields import METRICS as PROBE_METRICS
from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel, register_view
from gputop.ui.snapshot import Snapshot
from gputop.verdicts.signals import KERNEL_SAMPLE_STALE_S

register_view("steps", "Steps", order=50, short="Stp")

STALE_S = 3.0
STYLE_WAIT, STYLE_GPU, STYLE_OTHER = "yellow", "green", "cyan"
STYLE_BAD, STYLE_DIM, STYLE_LABEL = "bold red", "dim", "bold"
STYLE_WARN_DIM = "yellow"

# The probe_step fields this panel shows; their help is in the catalogue (sources/probe_fields.py).
SHOWN_FIELDS = ("steps_per_s", "step_ms_mean", "data_wait_share", "gpu_ms_mean", "other_ms", "batches_per_s",
                "samples_per_s", "syncs_per_step")
_BY_FIELD = {m.field: m for m in PROBE_METRICS if m.kind == KIND_PROBE_STEP}
METRICS = [_BY_FIELD[f] for f in SHOWN_FIELDS]


def _ms(v) -> str:
    f = fmt.to_float(v)
    if f is None:
        return fmt.NA
    return f"{f:.0f} ms" if f >= 100 else f"{f:.1f} ms" if f >= 10 else f"{f:.2f} ms"


def _rate(v) -> str:
    f = fmt.to_float(v)
    if f is None:
        return fmt.NA
    return f"{f:.0f}" if f >= 100 else f"{f:.1f}" if f >= 10 else f"{f:.2f}"


def _who(snap: Snapshot, key: str) -> str:
    s = snap.latest("probe_step", key) or snap.latest("probe_config", key)
    rank = s.get("rank") if s is not None else None
    return f"rank {rank}" if rank is not None else f"PID {key}"


def probe_keys(snap: Snapshot) -> list[str]:
    """Probed processes with step windows, ranks first in rank order."""
    latest = snap.latest_of_kind("probe_step")

    def order(k):
        r = latest[k].get("rank")
        return (r is None, r if r is not None else 0, int(k) if k.isdigit() else 0)
    return sorted(latest, key=order)


def last_window_with_steps(snap: Snapshot, key: str):
    """The newest window that had a timed step (the newest window may be an idle one)."""
    for s in reversed(snap.series("probe_step", key)):
        if s.get("step_ms_mean") is not None:
            return s
    return None


def training_keys(snap: Snapshot) -> list[str]:
    return [k for k in probe_keys(snap) if (snap.latest("probe_step", k).get("step_total") or 0) > 0]


def short_path(path: str, width: int) -> str:
    """"…/pkg/train.py:88": the file name and line, with as much of the directory as fits."""
    path = fmt.clean(path)
    if len(path) <= width:
        return path
    head, line = (path.rsplit(":", 1) + [""])[:2] if ":" in path else (path, "")
    base = os.path.basename(head) + (f":{line}" if line else "")
    return fmt.clip("…/" + base, width)


def split_text(split: dict, info: str | None) -> Text:
    t = Text()
    t.append(f"data wait {split['data_wait_share'] * 100:.0f}%", style=STYLE_WAIT)
    if split["gpu_ms"] is not None:
        t.append(" · ")
        t.append(f"GPU {split['gpu_share'] * 100:.0f}%", style=STYLE_GPU)
    t.append(" · ")
    t.append(f"other {split['other_share'] * 100:.0f}%", style=STYLE_OTHER)
    return t


def _list(v) -> list:
    return v if isinstance(v, list) else []


def split_bar(split: dict, width: int) -> Text:
    """A bar of ``width`` cells: data wait, GPU time, other host time, in that order."""
    parts = [(split["data_wait_share"], STYLE_WAIT), (split["gpu_share"] or 0.0, STYLE_GPU),
             (split["other_share"], STYLE_OTHER)]
    # (a share is a fraction: one outside 0-1 from a damaged or hostile probe draws as its bound)
    cells = [int(round(min(1.0, max(0.0, share)) * width)) for share, _ in parts]
    while sum(cells) > width:
        cells[cells.index(max(cells))] -= 1
    t = Text()
    for n, (_, style) in zip(cells, parts):
        t.append("█" * n, style=style)
    t.append("·" * (width - sum(cells)), style=STYLE_DIM)
    return t


def no_probe_text(snap: Snapshot) -> Text:
    h = snap.health().get("probe")
    t = Text()
    if h is None:
        t.append("no probe data: this session has no probe source", style=STYLE_DIM)
        return t
    t.append(f"probe {fmt.clean(h.get('state'))}", style=STYLE_BAD if h.get("state") == "failed" else STYLE_LABEL)
    if h.get("message"):
        t.append(f": {fmt.clean(h.get('message'))}")
    return t


@register_panel
class ProbeOverview(TextPanel):
    VIEW = "overview"
    ORDER = 30
    NEEDS = ("probe_step",)
    TITLE = "Training steps (probe, newest ~1 s window)"
    METRICS = METRICS

    def shown(self, snap: Snapshot) -> bool:
        return "probe_step" in snap.kinds and bool(training_keys(snap))

    def draw(self, snap: Snapshot, width: int) -> Text:
        keys = training_keys(snap)
        if len(keys) > 2:
            return self._many(snap, keys, width)
        out = Text()
        for i, key in enumerate(keys):
            if i:
                out.append("\n")
            out.append_text(self._line(snap, key, width))
        return out

    def _line(self, snap: Snapshot, key: str, width: int) -> Text:
        latest = snap.latest("probe_step", key)
        w = last_window_with_steps(snap, key)
        t = Text()
        t.append(f"{_who(snap, key):<7} ", style=STYLE_LABEL)
        if w is None:
            t.append(" no timed step yet")
            return t
        stale = snap.now - latest.t > STALE_S
        if latest.get("steps") == 0 and not stale:
            t.append(" no step in the last window; last: ", style=STYLE_WARN_DIM)
        elif stale:
            t.append(f" no data for {fmt.duration(snap.now - latest.t)}; last: ", style=STYLE_DIM)
        t.append(f" {_rate(w.get('steps_per_s'))} steps/s  step {_ms(w.get('step_ms_mean'))}: ")
        split = step_split(w.data)
        if split is not None:
            t.append_text(split_text(split, None))
        syncs = w.get("syncs_per_step")
        if syncs is not None:
            t.append(f"  syncs {syncs:.1f}/step")
        return fmt.fit(t, width)

    def _many(self, snap: Snapshot, keys: list[str], width: int) -> Text:
        windows = [(k, last_window_with_steps(snap, k)) for k in keys]
        windows = [(k, w) for k, w in windows if w is not None]
        t = Text()
        if not windows:
            t.append(f"{len(keys)} ranks, no timed step yet")
            return t
        rates = [w.get("steps_per_s") for _, w in windows if w.get("steps_per_s") is not None]
        t.append(f"{len(keys)} ranks", style=STYLE_LABEL)
        if rates:
            t.append(f"  {_rate(min(rates))}-{_rate(max(rates))} steps/s")
        slow_key, slow = max(windows, key=lambda kw: kw[1].get("step_ms_mean") or 0)
        t.append(f"  slowest {_who(snap, slow_key)}: step {_ms(slow.get('step_ms_mean'))}: ")
        split = step_split(slow.data)
        if split is not None:
            t.append_text(split_text(split, None))
        return fmt.fit(t, width)



@register_panel
class StepsPanel(TextPanel):
    VIEW = "steps"
    ORDER = 10
    NEEDS = ()  # always shown: without a probe it says what one would add and how to enable it
    TITLE = "Training steps (in-process probe; numbers: newest ~1 s window; history: last minute)"
    METRICS = []

    def draw(self, snap: Snapshot, width: int) -> Text:
        keys = probe_keys(snap)
        if not keys:
            return no_probe_text(snap)
        out = Text()
        shown = 0
        for key in keys:
            latest = snap.latest("probe_step", key)
            if not latest.get("step_total") and len(keys) > 1:
                continue  # a launcher (torchrun) or helper process with a probe but no steps
            if shown:
                out.append("\n")
            out.append_text(self._block(snap, key, width))
            shown += 1
        idle = [k for k in keys if not snap.latest("probe_step", k).get("step_total")]
        if idle and shown:
            out.append(f"\nprobes without steps: {', '.join('PID ' + k for k in idle)}", style=STYLE_DIM)
        if not shown:
            out.append_text(self._block(snap, keys[0], width))
        return out

    def _block(self, snap: Snapshot, key: str, width: int) -> Text:
        latest = snap.latest("probe_step", key)
        w = last_window_with_steps(snap, key)
        cfg = snap.latest("probe_config", key)
        t = Text()
        t.append(f"PID {key}", style=STYLE_LABEL)
        if latest.get("rank") is not None:
            t.append(f" rank {latest.get('rank')}", style=STYLE_LABEL)
        src = cfg.get("step_source") if cfg is not None else None
        t.append(f"  {latest.get('step_total') or 0} steps"
                 + {"optimizer": " (optimizer.step)", "marker": " (gputop.probe.step())",
                    "forward": " (model calls: no optimizer step)"}.get(src, ""))
        age = snap.now - latest.t
        if age > STALE_S:
            t.append(f"  no data for {fmt.duration(age)}", style=STYLE_BAD)
        if w is None:
            t.append("\n")
            if cfg is not None and cfg.get("torch") is None:
                t.append(fmt.clean(cfg.get("torch_info") or "torch is not imported"), style=STYLE_DIM)
            else:
                t.append("no timed step yet: steps are counted at optimizer.step(), gputop.probe.step(), or a "
                         "job's model calls when it steps no optimizer", style=STYLE_DIM)
            return t
        d = w.data
        if w is not latest and latest.get("steps") == 0:
            t.append(f"  (idle for {fmt.duration(latest.t - w.t)}; numbers from the last window with steps)",
                     style=STYLE_WARN_DIM)
        t.append("\n")
        t.append(f"{_rate(d.get('steps_per_s'))} steps/s", style=STYLE_LABEL)
        t.append(f"  step {_ms(d.get('step_ms_mean'))} (p50 {_ms(d.get('step_ms_p50'))}, max {_ms(d.get('step_ms_max'))})")
        split = step_split(d)
        if split is not None:
            t.append("\n")
            kms = fmt.to_float(d.get("kernel_ms_per_step")) if split["gpu_ms"] is not None else None
            if kms is not None and (fmt.to_float(d.get("kernel_sample_age_s")) or 0.0) > KERNEL_SAMPLE_STALE_S:
                kms = None   # (too old to stand for this step: the verdicts do not read it either)
            # (the traced kernels' words after the GPU's span: the bar gives them room)
            # (and at 80 columns a shorter bar: the line stays one line)
            kernels = f" (kernels {_ms(kms)})" if kms is not None else ""
            bar_w = max(6 if kernels else 10, min(40, width - 50 - len(kernels)))
            t.append_text(split_bar(split, bar_w))
            t.append(" ")
            t.append(f"data wait {_ms(split['data_wait_ms'])}", style=STYLE_WAIT)
            t.append(" · ")
            if split["gpu_ms"] is not None:
                t.append(f"GPU {_ms(split['gpu_ms'])}", style=STYLE_GPU)
                # (the GPU's span runs from the batch to the step's end, launch gaps included;
                # the trace's kernels are its busy part: on a launch-bound loop a third of it)
                t.append(kernels, style=STYLE_DIM)
            else:
                why = off_reason(cfg.data if cfg is not None else None, "cuda_events").split(":")[0]
                t.append(f"GPU n/a ({fmt.clean(why)})", style=STYLE_DIM)
            t.append(" · ")
            t.append(f"other {_ms(split['other_ms'])}", style=STYLE_OTHER)
        t.append("\n")
        per_step = pool_steps([w]).batches_per_step
        bps = None if per_step is None else round(per_step, 2)
        samples = _rate(d.get("samples_per_s")) + "/s" if d.get("samples_per_s") is not None else "n/a (batch size unknown)"
        if cfg is not None and not cfg.get("loaders") and not d.get("batches_per_s"):
            # (an inference loop over tensors already on the GPU, a synthetic benchmark: "0 batches/s"
            # would read as a stalled input pipeline)
            t.append("batches n/a (no DataLoader seen)", style=STYLE_DIM)
        else:
            t.append(f"batches {_rate(d.get('batches_per_s'))}/s  samples {samples}")
            if bps is not None:
                t.append(f"  {bps:g} batch/step")
        batch = None
        loaders = cfg.get("loaders") if cfg is not None else None
        if isinstance(loaders, list) and loaders and isinstance(loaders[0], dict):
            batch = loaders[0].get("batch_size")
        if batch is not None:
            t.append(f"  batch size {batch}")
        t.append("\n")
        if d.get("syncs_per_step") is not None:
            t.append(f"syncs {d.get('syncs_per_step'):.1f}/step")
            if d.get("sync_top"):
                t.append(f"  hottest {short_path(d.get('sync_top'), max(20, width - 40))} "
                         f"(×{d.get('sync_top_count')} in the window)")
        else:
            t.append(f"syncs n/a ({fmt.clean(off_reason(cfg.data if cfg is not None else None, 'syncs'))})", style=STYLE_DIM)
        copies = latest_copies(snap.series("probe_step", key))
        if copies is not None:
            t.append(f"\ncopies/step {fmt.clean(copies_text(copies) or 'none over 1 MB')}")
        spark_w = max(10, min(60, width - 24))
        series = snap.series("probe_step", key)
        cells = fmt.cell_means(series, ("steps_per_s", "data_wait_share", "gpu_ms_mean"), snap.now,
                               snap.history_s, spark_w)
        t.append("\nsteps/s    ")
        t.append(fmt.spark_cells(cells["steps_per_s"]), style=STYLE_LABEL)
        t.append("\ndata wait  ")
        t.append(fmt.spark_cells(cells["data_wait_share"], 0.0, 1.0), style=STYLE_WAIT)
        if any(v is not None for v in cells["gpu_ms_mean"]):
            t.append("\nGPU ms     ")
            t.append(fmt.spark_cells(cells["gpu_ms_mean"]), style=STYLE_GPU)
        return t


def _count(n) -> str:
    f = fmt.to_float(n)
    if f is None:
        return fmt.NA
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if f >= div:
            return f"{f / div:.1f}{unit}"
    return f"{f:.0f}"


def _onoff(v) -> str:
    return fmt.NA if v is None else ("on" if v else "off")


@register_panel
class ProbeSettings(TextPanel):
    VIEW = "steps"
    ORDER = 20
    NEEDS = ("probe_config",)
    TITLE = "Settings that matter for speed (from the probe)"

    def draw(self, snap: Snapshot, width: int) -> Text:
        keys = [k for k in training_keys(snap)] or sorted(snap.latest_of_kind("probe_config"))
        key = next((k for k in keys if snap.latest("probe_config", k) is not None), None)
        if key is None:
            return Text("no settings reported yet", style=STYLE_DIM)
        c = snap.latest("probe_config", key).data
        lines: list[Text] = []

        def line(*parts: tuple[str, str]) -> None:
            t = Text()
            for text, style in parts:
                t.append(text, style=style)
            # a line of "a · b · c" settings breaks between settings, never inside one
            lines.extend(fmt.wrap(t, width, 3, indent=2, sep=" · "))
        if c.get("torch") is None:
            line((fmt.clean(c.get("torch_info") or "torch is not imported"), STYLE_DIM))
            return Text("\n").join(lines)
        who = f"{_who(snap, key)}: " if len(keys) > 1 else ""
        cuda = c.get("cuda")
        line((who, STYLE_DIM), (f"torch {fmt.clean(c.get('torch'))}", STYLE_LABEL),
             (f" · CUDA {fmt.clean(cuda) if cuda else 'n/a (CPU build)'}", ""),
             (f" · cuDNN {c.get('cudnn')}" if c.get("cudnn") else "", ""),
             (f" · {fmt.clean(c.get('device_name'))} (cc {c.get('capability')})" if c.get("device_name") else "", ""))
        amp = c.get("amp_autocast") or []
        line(("AMP ", STYLE_LABEL), (", ".join(fmt.clean(a) for a in amp) + " autocast" if amp else "no autocast seen", ""),
             (" · TF32 ", STYLE_LABEL), (f"matmul {_onoff(c.get('tf32_matmul'))}, cuDNN {_onoff(c.get('tf32_cudnn'))}", ""),
             (f" · fp32 matmul precision {fmt.clean(c.get('float32_matmul_precision'))}", ""),
             (" · cudnn.benchmark ", STYLE_LABEL), (_onoff(c.get("cudnn_benchmark")), ""))
        comp = c.get("compile") if isinstance(c.get("compile"), dict) else {}
        calls = comp.get("calls") or 0
        uses = comp.get("uses") if isinstance(comp.get("uses"), list) else []
        modes = sorted({fmt.clean(u.get("mode")) for u in uses if isinstance(u, dict)})
        clb = c.get("cuda_launch_blocking")
        line(("torch.compile ", STYLE_LABEL),
             (f"{calls} call(s) ({', '.join(modes)})" + (f", {comp.get('graphs')} graph(s)" if comp.get("graphs") is not None else "")
              if calls else "not used", ""),
             (" · CUDA_LAUNCH_BLOCKING ", STYLE_LABEL),
             (f"={fmt.clean(clb)}" if clb not in (None, "") else "unset", STYLE_BAD if clb not in (None, "", "0") else ""),
             (" · anomaly detection ", STYLE_LABEL), (_onoff(c.get("anomaly_detection")),
                                                     STYLE_BAD if c.get("anomaly_detection") else ""),
             (" · deterministic ", STYLE_LABEL), (_onoff(c.get("deterministic_algorithms")), ""))
        loaders = c.get("loaders") if isinstance(c.get("loaders"), list) else []
        for ld in loaders[:3]:
            if not isinstance(ld, dict):
                continue
            pf = ld.get("prefetch_factor")
            line(("DataLoader", STYLE_LABEL), (f" ({fmt.clean(ld.get('dataset'))})", STYLE_DIM),
                 (f" batch {ld.get('batch_size')} · num_workers {ld.get('num_workers')}"
                  f" · pin_memory {ld.get('pin_memory')} · prefetch_factor {pf if pf is not None else 'n/a (no workers)'}"
                  f" · persistent_workers {ld.get('persistent_workers')}", ""))
        if not loaders:
            line(("DataLoader ", STYLE_LABEL), ("none iterated (data loaded another way, or not yet)", STYLE_DIM))
        opt = c.get("optimizer")
        if isinstance(opt, dict):
            n = opt.get("params")
            line(("optimizer ", STYLE_LABEL), (f"{fmt.clean(opt.get('class'))}", ""),
                 (f" · {_count(n)} params "
                  f"{'/'.join(fmt.clean(x) for x in _list(opt.get('param_dtypes')))}", ""),
                 (f" · foreach {opt.get('foreach')} · fused {opt.get('fused')}", ""))
        mem = snap.latest("probe_memory", key)
        if mem is not None:
            line(("CUDA memory ", STYLE_LABEL),
                 (f"allocated {fmt.size(mem.get('allocated'))} · reserved {fmt.size(mem.get('reserved'))} · "
                  f"peak {fmt.size(mem.get('peak_allocated'))}/{fmt.size(mem.get('peak_reserved'))} · "
                  f"alloc retries {fmt.num(mem.get('alloc_retries'))}", ""))
        step = snap.latest("probe_step", key)
        kms = step.get("kernel_ms_per_step") if step is not None else None
        kwhy = step.get("kernel_off") if step is not None else None
        if isinstance(kms, (int, float)) and not isinstance(kms, bool):
            age = fmt.to_float(step.get("kernel_sample_age_s"))
            stale = age is not None and age > KERNEL_SAMPLE_STALE_S
            line(("kernel trace ", STYLE_LABEL),
                 (f"{_ms(kms)} of kernels a step (traced {fmt.num(age)} s ago"
                  + ("; too old to judge by: the verdicts leave it out)" if stale else ")"), STYLE_DIM if stale else ""))
        elif isinstance(kwhy, str) and not kwhy.startswith("off:"):   # (asked for, and none: say why)
            line(("kernel trace ", STYLE_LABEL), (f"n/a: {fmt.clean(kwhy)}", STYLE_DIM))
        hooks = c.get("hooks") or {}
        off = [f"{k} {v[0]}: {v[1]}" for k, v in hooks.items()
               if isinstance(v, list) and len(v) == 2 and v[0] in ("failed", "unavailable")]
        for h in off:
            line(("hook ", STYLE_BAD), (fmt.clean(h), ""))
        return Text("\n").join(lines)


@register_panel
class SyncLines(TextPanel):
    VIEW = "steps"
    ORDER = 30
    NEEDS = ("probe_sync",)
    TITLE = "Implicit device syncs by source line (since the probe loaded)"

    def draw(self, snap: Snapshot, width: int) -> Text:
        out = Text()
        for key in sorted(snap.latest_of_kind("probe_sync")):
            s = snap.latest("probe_sync", key)
            total = s.get("total") or 0
            for i, item in enumerate((s.get("lines") or [])[:5]):
                if not isinstance(item, list) or len(item) != 2:
                    continue
                line, n = item
                if not isinstance(n, int) or isinstance(n, bool):
                    continue
                if out.plain:
                    out.append("\n")
                share = f"{n / total * 100:3.0f}%" if total else "   "
                out.append(f"{_who(snap, key):<8} {n:>7} {share}  ")
                out.append(short_path(str(line), max(20, width - 28)))
        return out or Text("no implicit syncs counted", style=STYLE_DIM)
