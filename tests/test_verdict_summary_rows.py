"""The summary frames carry only what the report reads of the verdicts (verdicts/summary.py,
``summary_rows``): over real recordings' verdict samples, cut into stretches of any length
(1 s puts a cut between nearly every two samples: between a verdict's last active sample and
its later inactive ones too), the trimmed rows summarize exactly as every sample does, and
they are much smaller. One file has no primary verdict at all, so the "why none" a primary
sample carries is read from the trimmed rows too."""

from __future__ import annotations

import json
import os

import pytest

from gputop.session.whole_replay import replay_whole
from gputop.verdicts import default_processors
from gputop.verdicts.recording_summary import SUMMARY_VERDICT_KINDS
from gputop.verdicts.summary import summarize_verdicts, summary_rows

DATA = os.path.join(os.path.dirname(__file__), "data")
# real training code with verdicts that come and go, phases and a stall; a session without a verdict
FILES = ["h200/real/hf_trainer-run.gtrec", "h200/real/eval_phase-pid.gtrec", "h200/issue15/stall_sleep_lock.gtrec",
         "host_cpu_demo.gtrec"]


def _stretches(samples, stretch_s: float):
    start = 0
    while start < len(samples):
        end = start
        while end < len(samples) and samples[end].t < samples[start].t + stretch_s:
            end += 1
        yield samples[start:end]
        start = end


@pytest.mark.parametrize("name", FILES)
def test_trimmed_rows_summarize_as_every_sample(name):
    got = replay_whole(os.path.join(DATA, name), default_processors())
    samples = [s for s in got.samples if s.kind in SUMMARY_VERDICT_KINDS]
    want = summarize_verdicts(samples, got.t_start, got.t_end)
    with_verdicts = any(s.get("active") for s in samples if s.kind == "verdict")
    if name == "host_cpu_demo.gtrec":
        assert want["primary_verdict"] is None and want["no_verdict_why"], want
    else:
        assert with_verdicts and want["primary_verdict"] is not None, "a file with verdicts"
    for stretch_s in (1.0, 7.0, 60.0):
        rows = [r for part in _stretches(samples, stretch_s) for r in summary_rows(part)]
        assert summarize_verdicts(rows, got.t_start, got.t_end) == want, (name, stretch_s)
        if with_verdicts and stretch_s > 1.0:
            full = len(json.dumps([s.data for s in samples]))
            trimmed = len(json.dumps([s.data for s in rows]))
            assert trimmed < 0.6 * full, (full, trimmed)
