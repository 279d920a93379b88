"""The summary frames carry only what the report reads of the verdicts (verdicts/summary.py,
``summary_rows``): over real recordings' verdict samples, cut into stretches of any length,
the trimmed rows summarize exactly as every sample does, and they are much smaller."""

from __future__ import annotations

import json
import os

import pytest

from gputop.session.whole_replay import replay_whole
from gputop.verdicts import default_processors
from gputop.verdicts.recording_summary import SUMMARY_VERDICT_KINDS
from gputop.verdicts.summary import summarize_verdicts, summary_rows

DATA = os.path.join(os.path.dirname(__file__), "data", "h200")
# real training code with verdicts that come and go, phases and a stall
FILES = ["real/hf_trainer-run.gtrec", "real/eval_phase-pid.gtrec", "issue15/stall_sleep_lock.gtrec"]


@pytest.mark.parametrize("name", FILES)
def test_trimmed_rows_summarize_as_every_sample(name):
    got = replay_whole(os.path.join(DATA, name), default_processors())
    samples = [s for s in got.samples if s.kind in SUMMARY_VERDICT_KINDS]
    assert any(s.get("active") for s in samples if s.kind == "verdict"), "a file with verdicts"
    want = summarize_verdicts(samples, got.t_start, got.t_end)
    for stretch_s in (7.0, 60.0):
        rows, start = [], 0
        while start < len(samples):
            end = start
            while end < len(samples) and samples[end].t < samples[start].t + stretch_s:
                end += 1
            rows += summary_rows(samples[start:end])
            start = end
        assert summarize_verdicts(rows, got.t_start, got.t_end) == want, (name, stretch_s)
        full = len(json.dumps([s.data for s in samples]))
        trimmed = len(json.dumps([s.data for s in rows]))
        assert trimmed < 0.6 * full, (full, trimmed)
