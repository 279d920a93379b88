"""Nested values of the wrong type or absurd size inside fields whose top-level type is right
(the sanitizer checks the top level only): every panel draws, the report and the verdicts'
replay hold, and a panel that fails anyway costs that panel, never the UI.

Each case was an audit's reproduction: a probe config ``loaders: [1]`` ended the UI at the Steps
view key; a step-time histogram bucket "9000" made the verdicts fail on every run (2**1125 us
overflows a float); a thread's ``stacks: 1`` cost the report its threads, budget and ranks.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from gputop.cli import _processors
from gputop.session.replay import ReplaySession
from gputop.ui.app import GputopApp
from test_hostile_values import check_report, write_hostile

NESTED = {
    "loaders_of_ints": (("field", "probe_config", "loaders"), [1, "x"]),
    "compile_uses_int": (("field", "probe_config", "compile"), {"calls": 2, "uses": 5, "graphs": [1]}),
    "optimizer_dtypes_int": (("field", "probe_config", "optimizer"), {"class": "AdamW", "param_dtypes": 5}),
    "hist_past_a_float": (("field", "probe_step", "step_hist"), {"9000": 1}),
    "hist_junk_buckets": (("field", "probe_step", "step_hist"), {"-4": 1, "x": 2, "12": -5, "100": 1}),
    "negative_wait_share": (("field", "probe_step", "data_wait_share"), -1e15),
    "negative_step_sum": (("field", "probe_step", "step_s_sum"), -3.0),
    "stacks_not_a_list": (("field", "stacks", "threads"), [{"tid": 1, "stacks": 1}, {"tid": 2, "stacks": [{}]}]),
    "frame_line_a_list": (("field", "stacks", "frames"), [["f", "a.py", [1]], ["g", "b.py", {}]]),
}


def _draw_every_view(path) -> list[str]:
    """Every view of the real app over a replay, at its middle and its end: the display errors."""
    async def go():
        session = ReplaySession(str(path), processors=_processors(), start_playing=False)
        errors = []
        try:
            async with GputopApp(session).run_test(size=(120, 40)) as pilot:
                app = pilot.app
                for frac in (0.5, 1.0):
                    session.seek(session.t_start + frac * (session.t_end - session.t_start))
                    for i, spec in enumerate(app.view_specs):
                        app.action_view(i + 1)
                        await pilot.pause()
                        if app.last_tick_error:
                            errors.append(f"{spec.id} at {frac}: {app.last_tick_error}")
                            app.last_tick_error = None
                assert app.is_running
        finally:
            session.stop()
        return errors
    return asyncio.run(go())


@pytest.mark.parametrize("case", sorted(NESTED))
def test_nested_hostile_values_draw_and_report(tmp_path, case):
    where, value = NESTED[case]
    path = tmp_path / "r.gtrec"
    write_hostile(path, where, value)
    got = check_report(path)
    assert got is not None
    report, _ = got
    if where[1] == "stacks":
        # a damaged thread entry costs that entry: the rest of the sample is still read
        assert report["stacks"].get("available") is not None
    if where[1] == "probe_step" and "step_s_sum" in where:
        ranks = report["probe"]["ranks"]
        assert all(r.get("steps_per_s") is None or r["steps_per_s"] >= 0 for r in ranks), ranks
    if where[1] == "probe_step" and "step_hist" in where:
        # the histogram's sane buckets still give percentiles, and the
        # probe's section is not lost to an overflow
        assert "error" not in report["probe"] and report["probe"]["ranks"], report["probe"]
        for r in report["probe"]["ranks"]:
            p50 = (r.get("step_ms") or {}).get("p50")
            assert p50 is None or math.isfinite(p50)
    assert _draw_every_view(path) == []


def test_a_view_key_over_a_panel_that_fails_leaves_the_ui_running(tmp_path, monkeypatch):
    """A panel that raises (a bug, or a value no check foresaw) shows one line and the banner
    says so; a key that redraws the view at once once let the exception end the app."""
    from gputop.ui.panels import probe as probe_panels

    def broken(self, snap, width):
        raise KeyError("unforeseen")

    monkeypatch.setattr(probe_panels.ProbeSettings, "draw", broken)
    path = tmp_path / "r.gtrec"
    write_hostile(path, ("field", "probe_config", "loaders"), [1])

    async def go():
        session = ReplaySession(str(path), processors=_processors(), start_playing=False)
        session.seek(session.t_end)
        async with GputopApp(session).run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await pilot.press("7")   # the Steps view, where the probe's panels are
            await pilot.pause()
            await pilot.press("1")
            await pilot.press("7")
            await pilot.pause()
            app = pilot.app
            panel = app.query_one(probe_panels.ProbeSettings)
            assert app.is_running and app.current_view == "steps"
            assert app.tick_errors >= 1 and "KeyError" in (app.last_tick_error or "")
            assert panel.text.plain.startswith("this panel could not be drawn: KeyError")
            # the others drew
            steps = app.query_one(probe_panels.StepsPanel)
            assert steps.text.plain and "could not be drawn" not in steps.text.plain
        session.stop()

    asyncio.run(go())


def test_an_absurd_local_world_size_lists_no_missing_ranks_and_a_huge_rank_is_none():
    """LOCAL_WORLD_SIZE=10**12 in a target's environment once froze the Ranks view building a set
    of that many local ranks (and ran out of memory); RANK of 23 digits was written into the
    recording past what its reader takes."""
    from gputop.derive.ranks import MAX_LOCAL_WORLD, STATE_RUNNING, rank_overview
    from gputop.sources.ranks import rank_env

    def row(lws):
        return {"state": STATE_RUNNING, "world_size": 2, "local_world_size": lws, "local_rank": 0, "node": "n"}

    assert rank_overview([row(4)])["missing_local_ranks"] == [1, 2, 3]
    assert rank_overview([row(MAX_LOCAL_WORLD + 1)])["missing_local_ranks"] is None
    assert rank_overview([row(10 ** 12)])["missing_local_ranks"] is None
    env = rank_env({"RANK": "9" * 23, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(10 ** 12)})
    assert env is None or (env.get("rank") is None and env.get("local_world_size") is None), env


def test_a_probe_windows_negative_or_inconsistent_times_are_no_values():
    from gputop.sources.probe_messages import step_data

    class Conn:   # (what step_data reads of a connection)
        rank, last_cpu = None, None

    d = step_data(Conn(), {"t0": 1.0, "t1": 2.0, "steps": 5, "step_n": 5, "step_sum": 0.5, "step_wait": -1e15,
                           "gpu_n": -3, "gpu_sum": -1.0, "batches": -2, "step_hist": {"9000": 1, "12": 4, "x": 1}})
    assert d["data_wait_share"] is None and d["data_wait_ms"] is None
    assert d["gpu_ms_mean"] is None and d["batches"] is None
    assert d["step_hist"] == {"12": 4}
    d = step_data(Conn(), {"t0": 1.0, "t1": 2.0, "steps": 5, "step_n": 5, "step_sum": 0.5, "step_wait": 0.9})
    assert d["data_wait_share"] is None   # (a wait longer than the steps it is part of)
    d = step_data(Conn(), {"t0": 1.0, "t1": 2.0, "steps": 5, "step_n": 5, "step_sum": 0.5, "step_wait": 0.1})
    assert d["data_wait_share"] == 0.2
