"""The sparkline cell cache gives exactly what a full recomputation gives, tick after tick."""

from __future__ import annotations

import pathlib

import pytest

from gputop.session.replay import ReplaySession
from gputop.ui.panels.gpus import SPARK_FIELDS
from gputop.ui.snapshot import Snapshot

H200 = pathlib.Path(__file__).resolve().parent / "data" / "h200"


@pytest.mark.parametrize("name", ["gpu_bound", "launch_bound"])
def test_cached_cells_equal_full_recomputation(name):
    s = ReplaySession(str(H200 / f"{name}.gtrec"), start_playing=False)
    cache: dict = {}
    t, checked = 1.0, 0
    while t < s.t_end:
        s.seek(t)  # forward in small steps, as playback does; crossing cell boundaries
        for width in (57, 23):
            cached = Snapshot(s, 60.0, cache).cells("gpu", "0", SPARK_FIELDS, width)
            full = Snapshot(s, 60.0, None).cells("gpu", "0", SPARK_FIELDS, width)
            assert cached == full, (t, width)
            checked += 1
        t += 0.17
    s.seek(3.0)  # and after a seek back
    assert Snapshot(s, 60.0, cache).cells("gpu", "0", SPARK_FIELDS, 57) == Snapshot(s, 60.0, None).cells("gpu", "0", SPARK_FIELDS, 57)
    assert checked > 100
