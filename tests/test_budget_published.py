"""What the budget processor publishes stays as published: its session sample's phase changes
were the tracker's own list, so samples published earlier grew with every later change (and
the recorder, which encodes a chunk after it was published, wrote changes from the future; the
tuples in it also made the recorder decode each such chunk again to summarize it)."""

from __future__ import annotations

import json
import pathlib

from gputop.derive.budget_processor import BudgetProcessor
from gputop.session.recording_format import encode_chunk_series
from gputop.session.replay import ReplaySession
from gputop.session.store import CallbackSubscriber

REAL = pathlib.Path(__file__).resolve().parent / "data" / "h200" / "real"


def test_session_samples_keep_the_changes_they_were_published_with():
    session = ReplaySession(str(REAL / "hf_trainer-pid.gtrec"), processors=[BudgetProcessor()],
                            start_playing=False, seek_window_s=0.0)
    published: list = []   # (sample, its data as JSON when published)

    def keep(samples):
        for s in samples:
            if s.kind == "budget" and s.key == "session":
                published.append((s, json.dumps(s.data, sort_keys=True)))

    session.bus.subscribe(CallbackSubscriber(keep))
    try:
        t = session.t_start
        while t < session.t_end:
            t = min(t + 1.0, session.t_end)
            session.play_to(t)
    finally:
        session.stop()
    assert len(published) >= 8
    counts = [len(s.data["changes"]) for s, _ in published]
    assert counts[-1] > counts[0], "the job changed phase (start-up, training, evaluation) while it was replayed"
    for s, then in published:
        assert json.dumps(s.data, sort_keys=True) == then, f"the sample of t={s.t} changed after it was published"
    # and every one of them is JSON as it is (lists, not tuples): the recorder writes it without
    # first making it plain (recording_format._bounded) and summarizes it without decoding
    for s, _ in published[-3:]:
        assert json.loads(json.dumps(s.data)) == s.data and repr(json.loads(json.dumps(s.data))) == repr(s.data)
        assert encode_chunk_series([s])[3] is not None
