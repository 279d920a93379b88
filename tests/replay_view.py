"""Render one view of a recording, replayed at a moment, as the terminal would show it (the real
app through ``App.run_test``): for tests that read what a user reads."""

from __future__ import annotations

import asyncio
import io


def view_text(rec: str, t: float, view_id: str, size: tuple[int, int]) -> str:
    from rich.console import Console

    from gputop.session.replay import ReplaySession
    from gputop.ui import panels
    from gputop.ui.app import GputopApp

    session = ReplaySession(rec, start_playing=False)
    session.seek(t)
    panels.load_panel_modules()
    key = str([v.id for v in panels.views()].index(view_id) + 1)

    async def go():
        async with GputopApp(session).run_test(size=size) as pilot:
            await pilot.pause()
            await pilot.press(key)
            await pilot.pause()
            console = Console(width=size[0], height=size[1], file=io.StringIO(), record=True, force_terminal=True)
            console.print(pilot.app.screen._compositor.render_update(full=True))
            return console.export_text()

    return asyncio.run(go())
