"""The rule that reads mixed precision's loss scaler (the probe's ``scaler_steps``,
``skipped_steps`` and ``loss_scale``, gputop/probe/amp_scaler.py): ``skipped_steps``.

``GradScaler`` skips an optimizer step whose gradients hold an inf or NaN and halves the loss
scale. A few skips while the scale calibrates (its first steps, and one after each growth) are
how it works. A job whose fp16 forward overflows skips most steps: its GPU stays busy and its
steps/s look healthy while it learns nothing. So this verdict is not gated by the GPU's busy
share, and it has no steps/s gain (verdicts/causal.py: NO_GAIN): a skipped step is lost however
busy the GPU was while it ran, and fixing it gains learning, not speed.

(This module imports nothing from rules.py, which imports it to register this rule.)
"""

from __future__ import annotations

from gputop.verdicts.finding import SEVERITY_CRITICAL, Finding, pct
from gputop.verdicts.registry import verdict
from gputop.verdicts.signals import Signals

SKIPPED_SHARE = 0.05        # of the scaler's steps in the window: skipped
SKIPPED_MIN = 3             # skipped steps in the window: a calibration's one or two are normal


def _scale(v: float) -> str:
    return f"{v:g}" if v == 0 or 1e-3 <= v < 1e7 else f"{v:.1e}"


@verdict(title="Skipped steps: mixed precision throws optimizer steps away", severity=SEVERITY_CRITICAL,
         order=5, meaning="GradScaler skipped >= {SKIPPED_SHARE:.0%} of the optimizer steps (inf/NaN gradients)")
def skipped_steps(sig: Signals) -> Finding | None:
    share = sig.get("probe.skipped_share")
    if share is None:
        return None
    skipped = sig.get("probe.skipped_steps") or 0.0
    steps = sig.get("probe.scaler_seen_steps") or 0.0   # (the share's denominator: steps whose skip was seen)
    level = share / SKIPPED_SHARE if skipped >= SKIPPED_MIN else 0.0
    scales = sig.facts.get("loss_scale")
    scale_text = ""
    if isinstance(scales, tuple) and len(scales) == 3:
        first, last, low = scales
        course = f"{_scale(first)} -> {_scale(last)}" if first != last else _scale(last)
        scale_text = f"; loss scale {course}"
        if low <= 1.0:
            scale_text += " (at or under 1: every step overflows)"
    summary = f"{pct(share)}% of optimizer steps skipped ({int(skipped)} of {int(steps)}): inf/NaN gradients" \
              + scale_text
    advice = ("The steps run and are thrown away: the model learns nothing in them. An fp16 forward or backward "
              "overflows: use bf16 autocast where the GPU has it (no GradScaler needed); find the op that "
              "overflows (torch.autograd.set_detect_anomaly, or the max of each layer's activations); lower the "
              "learning rate or warm it up; clip gradients after scaler.unscale_(optimizer). A loss scale that "
              "keeps falling below 1 means every step overflows whatever the scale.")
    return skipped_steps.spec.finding(
        level=level, lost_share=share, confidence=0.95,
        evidence={"skipped_pct": pct(share), "skipped_steps": int(skipped), "scaler_steps": int(steps),
                  "loss_scale_first": scales[0] if isinstance(scales, tuple) else None,
                  "loss_scale_last": scales[1] if isinstance(scales, tuple) else None},
        advice=advice, summary=summary, missing=())
