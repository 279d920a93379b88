"""Mixed precision that throws its steps away (issue 30, item 3): an fp16 forward that overflows
makes GradScaler skip every optimizer step while the loop runs at full speed. The probe counts
the GradScaler.step calls during which the optimizer did not step (no sync: the scaler has read
found_inf itself); ``skipped_steps`` names the share skipped and what the loss scale did, and is
absent with bf16 autocast. Real torch (CPU autocast and GradScaler("cpu")), the real probe, real
gputop: ``gputop run --headless --json``."""

from __future__ import annotations

import pytest

from run_helpers import headless_reports


# (alone: beside other tests' jobs cpu_oversubscribed is the honest co-verdict. The fixed job runs
# beside the one as it is, one core each: that saves the serial part 15 s)
@pytest.mark.serial
def test_every_step_skipped_is_named_and_bf16_is_not():
    # (30 s: on a box busier than its cores, 20 s ended with no verdict at all, the job's imports
    # and warm-up stretched: run 9 of the suite beside two CPU hogs)
    rep, fixed = headless_reports(("amp_overflow_train.py", (), 30), ("amp_overflow_train.py", ("--fixed",), 15))
    v = rep["verdicts"].get("skipped_steps")
    assert v is not None, rep["verdicts"].keys()
    assert rep["primary_verdict"]["id"] == "skipped_steps", rep["primary_verdict"]
    ev = v["evidence"]
    assert ev["skipped_pct"] >= 98.0, ev            # every step overflows: within 2 points of 100%
    assert ev["loss_scale_last"] == 0.0 and "every step overflows" in v["summary"], v["summary"]
    assert rep["primary_verdict"]["gain_pct"] is None   # no steps/s gain: the steps are thrown away
    assert "bf16 autocast" in v["advice"]
    assert "skipped_steps" not in fixed["verdicts"], fixed["verdicts"].keys()
