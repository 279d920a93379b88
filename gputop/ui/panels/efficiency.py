"""FLOPs, MFU and energy (gputop/derive/efficiency.py) in the Overview (one line) and the Steps
view (a small panel): the newest 10 s, the same span as the exporter's series."""

from __future__ import annotations

from rich.text import Text

from gputop.derive import efficiency as ef
from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel
from gputop.ui.snapshot import Snapshot

STYLE_LABEL, STYLE_DIM = "bold", "dim"


def _result(snap: Snapshot) -> dict:
    return ef.live(snap.store, snap.now)


def _has_steps(snap: Snapshot) -> bool:
    return any((s.get("step_total") or 0) > 0 for s in snap.latest_of_kind("probe_step").values())


@register_panel
class EfficiencyOverview(TextPanel):
    VIEW = "overview"
    ORDER = 31                      # right under the probe's steps line
    NEEDS = ("probe_step",)
    TITLE = "Efficiency (newest 10 s)"
    METRICS = ef.METRICS

    # The Overview's first job is the verdict strip: at 80x24 one more line cuts its advice. So
    # this line appears only where there is room and only with a FLOP count to show; the Steps
    # view always has the panel below, n/a and its reason included.
    MIN_HEIGHT = 30

    def shown(self, snap: Snapshot) -> bool:
        if "probe_step" not in snap.kinds or not _has_steps(snap):
            return False
        if self.is_attached and self.app.size.height < self.MIN_HEIGHT:
            return False
        return any(s.get("flops_per_step") is not None for s in snap.latest_of_kind("probe_step").values())

    def draw(self, snap: Snapshot, width: int) -> Text:
        res = _result(snap)
        t = Text()
        if res.get("mfu") is not None:
            t.append(fmt.clean(ef.mfu_words(res)), style=STYLE_LABEL)
        else:
            t.append("MFU n/a", style=STYLE_DIM)
            if res.get("tensor_active_pct") is not None:
                t.append(f" · GPM tensor active {res['tensor_active_pct']:.0f}%")
        t.append(" · ")
        t.append(fmt.clean(ef.energy_words(res)))
        if res.get("mfu") is None:
            t.append(f" · MFU: {fmt.clean(res.get('mfu_off'))}", style=STYLE_DIM)
        return fmt.fit(t, width)


@register_panel
class EfficiencyPanel(TextPanel):
    VIEW = "steps"
    ORDER = 15
    NEEDS = ("probe_step", "gpu")
    TITLE = "FLOPs, MFU and energy (newest 10 s; gputop/gpu_peaks.py has the dense peaks)"
    METRICS = []

    def draw(self, snap: Snapshot, width: int) -> Text:
        res = _result(snap)
        t = Text()
        if not res["ranks"]:
            t.append("FLOPs/step n/a: ", style=STYLE_LABEL)
            t.append("no probe steps (FLOPs per step and steps/s come from the in-process probe)", style=STYLE_DIM)
        for r in res["ranks"][:4]:
            who = f"rank {r['rank']}" if r.get("rank") is not None else f"PID {r['pid']}"
            t.append(f"{who}: ", style=STYLE_LABEL)
            if r.get("flops_per_step") is None:
                t.append(f"FLOPs/step n/a ({fmt.clean(r.get('flops_off'))})", style=STYLE_DIM)
            else:
                w = snap.latest("probe_step", r["pid"])
                cost = w.get("flops_count_ms") if w is not None else None
                t.append(f"{ef.fmt_flops(r['flops_per_step'])}/step {fmt.clean(r.get('dtype'))}")
                if cost is not None:
                    t.append(f" (counted at step {w.get('flops_step')}, that step took {cost:.0f} ms)", style=STYLE_DIM)
                ach = r.get("achieved_tflops")
                t.append(f"  {ach:.3g} TFLOP/s" if ach is not None else "  no steps/s")
            t.append("\n")
        t.append_text(fmt.fit(Text(fmt.clean(ef.mfu_words(res))), width))
        t.append("\n")
        t.append_text(fmt.fit(Text("energy: " + fmt.clean(ef.energy_words(res))), width))
        for g in res["gpus"][:8]:
            if g.get("joules_per_step") is not None:
                t.append(f"\n  GPU{fmt.clean(g['gpu'])}: {g['joules_per_step']:.3g} J/step, {g['watts']:.0f} W",
                         style=STYLE_DIM)
        return t
