"""80x24: what does not fit is wrapped between words or cut with an ellipsis (issue 12 item 6),
on a real H200 recording (tests/data/h200/input_bound.gtrec: every source, the probe too)."""

from __future__ import annotations

import asyncio
import pathlib

from gputop.session.replay import ReplaySession
from gputop.ui.app import GputopApp
from gputop.ui.panels.probe import ProbeOverview, ProbeSettings

DATA = pathlib.Path(__file__).parent / "data" / "h200"


def _app() -> GputopApp:
    s = ReplaySession(str(DATA / "input_bound.gtrec"), start_playing=False)
    s.seek(s.t_start + 0.6 * (s.t_end - s.t_start))
    return GputopApp(s)


def test_steps_view_settings_wrap_between_settings_at_80x24():
    async def go():
        app = _app()
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press(str([v.id for v in app.view_specs].index("steps") + 1))
            await pilot.pause()
            settings = next(p for p in app.panels["steps"] if isinstance(p, ProbeSettings))
            width = settings.content_size.width
            return settings.text.plain.splitlines(), width
    lines, width = asyncio.run(go())
    assert width <= 80 and all(len(line) <= width for line in lines)
    flat = " · ".join(line.strip() for line in lines)
    # the settings the old panel cut ("anomaly detection off · de") are all there, whole
    for whole in ("anomaly detection off", "deterministic off", "prefetch_factor 2", "persistent_workers True",
                  "alloc retries 0"):
        assert whole in flat, (whole, lines)
    # a continuation line is indented; a line is never cut inside a word without a mark
    assert any(line.startswith("  ") for line in lines)
    for line in lines:
        assert not line.endswith(" · ") and (len(line) < width or line.endswith("…") or line[-1] != " ")


def test_overview_probe_line_marks_its_cut():
    async def go():
        app = _app()
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            panel = next(p for p in app.panels["overview"] if isinstance(p, ProbeOverview))
            return panel.text.plain, panel.content_size.width
    text, width = asyncio.run(go())
    assert len(text) == width and text.endswith("…"), text  # "syncs 2.0/step" does not fit: marked
