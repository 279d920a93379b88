"""The Stall view (key s): the stall snapshot — where every thread of every rank was when the
training loop stopped making progress, the GPU's state then and the last step's time
(gputop.derive.stall finds the stall, gputop.sources.stall_snapshot takes the snapshot).

The view exists in a live session and in a replay of a recording made with the snapshot source
(its metadata lists it), so the views of older recordings are unchanged.
"""

from __future__ import annotations

from rich.text import Text

from gputop.catalogue import KIND_STALL, KIND_STALL_SNAPSHOT
from gputop.derive.stall import snapshot_lines
from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel, register_view
from gputop.ui.snapshot import Snapshot

VIEW_ID = "stall"


def has_stall_view(app) -> bool:
    session = getattr(app, "session", None)
    if getattr(session, "playback", None) is None:
        return True
    sources = (getattr(session, "meta", None) or {}).get("sources")
    return isinstance(sources, dict) and "stall_snapshot" in sources


register_view(VIEW_ID, "Stall", order=96, only_if=has_stall_view, short="Stl")


@register_panel
class StallPanel(TextPanel):
    VIEW = VIEW_ID
    ORDER = 10
    NEEDS = (KIND_STALL, KIND_STALL_SNAPSHOT)
    TITLE = "Stall snapshot"

    def draw(self, snap: Snapshot, width: int) -> Text:
        t = Text()
        st = snap.latest(KIND_STALL, "job")
        if st is not None and st.get("stalled") is True:
            t.append("STALLED now", style="bold red")
            since = st.get("since")
            known = isinstance(since, (int, float))
            t.append(f": no progress for {fmt.duration(snap.now - since)}\n" if known else "\n")
        elif st is not None:
            t.append("progressing" if not st.get("ended") else "the job has ended", style="bold")
            last = st.get("last_step_t")
            if isinstance(last, (int, float)):
                t.append(f" (last step {fmt.duration(max(0.0, snap.now - last))} ago)")
            t.append("\n")
        shot = snap.latest(KIND_STALL_SNAPSHOT, "job")
        if shot is None:
            t.append("No stall snapshot yet: one is taken (py-spy dump, never pausing the job) when the loop "
                     "stops stepping.", style="dim")
            return t
        for i, line in enumerate(snapshot_lines(shot.data, width=max(40, width))):
            t.append(fmt.clip(fmt.clean(line), width) + "\n", style="bold" if i == 0 else "")
        return t
