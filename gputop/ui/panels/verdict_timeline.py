"""The Verdicts view's timeline: when each verdict turned on and off, and jumps to a change.

In a replay the timeline covers the whole file: the session's store alone would not do (it
keeps 300 s, and a seek back clears it). One pass over the recording
(``Snapshot.replay_whole_file``, gputop/session/whole_replay.py) runs in a Textual worker
thread and reports by messages (``Progress``, ``Done``, ``Failed``); meanwhile the panel says
"Reading the whole recording… N%" and lists the changes seen while playing. The pass gives both
the recomputed changes and the recorded ones. A live session shows every change since its
verdicts started (verdicts.SessionVerdicts follows them past the store's 300 s).

The rows are each verdict's on and off, and each change of the primary verdict ("primary"): the
strip's story, so that its "for N s" counts from the latest "on … primary" row at or before the
position (when it is the same verdict) and its "no verdict now" is the latest "off … primary".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.text import Text
from textual import work
from textual.message import Message
from textual.worker import Worker, get_current_worker

from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel
from gputop.ui.panels.verdicts import (STYLE_DIM, STYLE_LABEL, Change, change_of, has_verdicts,
                                       jump_to, primary_changes, session_verdicts, severity_style, severity_word)
from gputop.ui.snapshot import Snapshot
from gputop.verdicts import default_processors
from gputop.verdicts.engine import KIND_VERDICT_CHANGE as KIND_CHANGE
from gputop.verdicts.engine import KIND_VERDICT_PRIMARY as KIND_PRIMARY


@dataclass(frozen=True)
class WholeFileTimeline:
    """The verdict changes of a whole recording: recomputed by this gputop's rules, and as the
    live session recorded them (what was read before an error, when ``error`` is set)."""

    recomputed: list[Change]
    recorded: list[Change]
    covers_to: float | None   # how far into the file the pass got
    error: str | None
    seconds: float            # how long the pass took
    primary: list[Change] = field(default_factory=list)           # the primary's changes, recomputed
    recorded_primary: list[Change] = field(default_factory=list)  # ... and as recorded


def in_order(*lists: list[Change]) -> list[Change]:
    """Changes in time order; at one time a verdict's on comes before its becoming the primary."""
    return sorted((c for cs in lists for c in cs), key=lambda c: (c.t, c.primary, c.id))


class _WorkerCancelled:
    """The whole-file pass's cancel flag: the worker's own (set when the panel unmounts, or a
    newer pass replaces it)."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def is_set(self) -> bool:
        return self._worker.is_cancelled


@register_panel
class VerdictTimeline(TextPanel):
    """When each verdict turned on and off; in a replay, enter jumps to the chosen change."""

    VIEW = "verdicts"
    ORDER = 20
    NEEDS = ()
    TITLE = "Timeline of verdict changes"
    FOCUS_ON_SHOW = True
    can_focus = True
    BINDINGS = [("up", "move(-1)", "Previous change"), ("down", "move(1)", "Next change"),
                ("enter", "jump", "Jump there")]  # j, to the primary's start, is the app's (every view)
    REOPEN_GAP_S = 3.0  # no draw for this long: the view was closed (a growing file: read it again)

    class Progress(Message):
        """The whole-file pass has read ``fraction`` of the recording."""

        def __init__(self, fraction: float) -> None:
            super().__init__()
            self.fraction = fraction

    class Done(Message):
        """The whole-file pass ended (``timeline.error`` says if it ended early)."""

        def __init__(self, timeline: WholeFileTimeline) -> None:
            super().__init__()
            self.timeline = timeline

    class Failed(Message):
        """The whole-file pass itself broke (a bug, not a damaged file: that is ``Done`` with an error)."""

        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self) -> None:
        super().__init__()
        self.timeline: WholeFileTimeline | None = None  # the last finished whole-file pass
        self.reading: float | None = None                # fraction done while a pass runs
        self.entries: list[tuple[str, Change]] = []  # (section, change) in drawn order
        self.selected: tuple[str, Change] | None = None
        self._row_of: list[int] = []                  # line of each entry in the drawn text
        self._last_draw = 0.0

    def shown(self, snap: Snapshot) -> bool:
        return has_verdicts(snap)

    @property
    def selected_index(self) -> int | None:
        try:
            return self.entries.index(self.selected) if self.selected is not None else None
        except ValueError:
            return None

    # -- keys -------------------------------------------------------------------------------
    def action_move(self, step: int) -> None:
        if not self.entries:
            return
        i = self.selected_index
        if i is None:
            i = 0 if step > 0 else len(self.entries) - 1
        elif not self._visible(i):  # the first key shows where the selection is
            self._keep_visible(i)
            return
        else:
            if i + step < 0 and self.parent is not None:  # above the first: the view's top again
                self.parent.scroll_home(animate=False, immediate=True)
            i = min(max(i + step, 0), len(self.entries) - 1)
        self.selected = self.entries[i]
        self._redraw()
        if i + step >= 0:
            self._keep_visible(i)

    def action_jump(self) -> None:
        snap = self.last_snapshot
        if snap is None or snap.playback is None:
            self.app.notify("enter jumps in a replay only: a live session cannot go back", severity="warning")
            return
        if self.selected is None:
            self.app.bell()  # nothing to jump to yet
            return
        jump_to(snap.playback, self.selected[1].t)
        self.app.redraw_now()

    def _redraw(self) -> None:
        if self.last_snapshot is not None:
            self.update_view(self.last_snapshot)

    def _row_y(self, i: int) -> int | None:
        """The selected row's line in the view's scrollable area."""
        if i >= len(self._row_of):
            return None
        return self.virtual_region.y + 1 + self._row_of[i]  # + 1: the border line above the text

    def _visible(self, i: int) -> bool:
        y, view = self._row_y(i), self.parent
        if y is None or view is None:
            return True
        return view.scroll_offset.y <= y < view.scroll_offset.y + view.scrollable_content_region.height

    def _keep_visible(self, i: int) -> None:
        from textual.geometry import Region

        y = self._row_y(i)
        if y is None or self.parent is None:
            return
        self.parent.scroll_to_region(Region(0, y, 1, 1), animate=False, immediate=True)

    # -- data -------------------------------------------------------------------------------
    def _start_pass_if_due(self, snap: Snapshot) -> bool:
        """Start the whole-file pass for a replay, once, and again when the view reopens on a
        file that grew past what the last pass covered. False: live, there is no file."""
        if snap.replay_path is None:
            return False
        wall = time.monotonic()
        reopened, self._last_draw = wall - self._last_draw > self.REOPEN_GAP_S, wall
        tl = self.timeline
        first = tl is None and self.reading is None
        grew = (reopened and tl is not None and self.reading is None and snap.playback.growing
                and (tl.covers_to or 0.0) < snap.playback.t_end)
        if first or grew:
            self.timeline, self.reading = None, 0.0
            self._read_whole_file(snap)
        return True

    @work(thread=True, exclusive=True, group="whole-file")
    def _read_whole_file(self, snap: Snapshot) -> None:
        """One pass over the whole file, with its own reader, store and processors (nothing
        shared with the replay on screen). Runs on a worker thread; it tells the panel by
        messages. Unmounting the panel cancels the worker, and the pass stops within a second."""
        worker = get_current_worker()
        shown = [-1]

        def progress(fraction: float) -> None:
            pct = int(fraction * 100)
            if pct != shown[0] and not worker.is_cancelled:  # a message per percent, not per second
                shown[0] = pct
                self.post_message(self.Progress(fraction))

        try:
            kinds = (KIND_CHANGE, snap.recorded_kind(KIND_CHANGE), KIND_PRIMARY, snap.recorded_kind(KIND_PRIMARY))
            got = snap.replay_whole_file(default_processors(), kinds, progress=progress,
                                         cancel=_WorkerCancelled(worker))
            if got is None or got.cancelled or worker.is_cancelled:
                return
            self.post_message(self.Done(WholeFileTimeline(
                recomputed=[change_of(s) for s in got.of_kind(KIND_CHANGE)],
                recorded=[change_of(s) for s in got.recorded(KIND_CHANGE)],
                covers_to=got.covers_to, error=got.error, seconds=got.seconds,
                primary=primary_changes(got.of_kind(KIND_PRIMARY)),
                recorded_primary=primary_changes(got.recorded(KIND_PRIMARY)))))
        except Exception as e:
            if not worker.is_cancelled:
                self.post_message(self.Failed(f"{type(e).__name__}: {e}"))

    def on_verdict_timeline_progress(self, message: Progress) -> None:
        if self.reading is not None:
            self.reading = message.fraction
            self._redraw_if_shown()

    def on_verdict_timeline_done(self, message: Done) -> None:
        self.timeline, self.reading = message.timeline, None
        if self.last_snapshot is not None:  # the strip's "for N s" and j read the whole file's primary too
            session_verdicts(self.last_snapshot).whole = message.timeline
        self._redraw_if_shown()

    def on_verdict_timeline_failed(self, message: Failed) -> None:
        self.timeline = WholeFileTimeline([], [], None, message.error, 0.0)
        self.reading = None
        self._redraw_if_shown()

    def _redraw_if_shown(self) -> None:
        # a hidden view is drawn when it opens (and a draw counts as "open" for REOPEN_GAP_S)
        if self.parent is not None and self.parent.display:
            self._redraw()

    def sections(self, snap: Snapshot) -> list[tuple[str, list[Change]]]:
        replay = self._start_pass_if_due(snap)
        known = session_verdicts(snap)
        known.follow(snap)
        seen = in_order(known.changes, known.primary.changes)
        if not replay:
            return [("Live session: every change since its verdicts started", seen)]
        tl = self.timeline
        if tl is None:
            return [(f"Reading the whole recording… {(self.reading or 0.0) * 100:.0f}%; meanwhile the changes seen "
                     "while playing", seen)]
        if tl.error:
            return [(f"Reading the recording failed ({tl.error}); the changes seen while playing", seen)]
        so_far = ", so far" if snap.playback.growing else ""
        return [(f"Recomputed by this gputop's rules from the raw samples (whole recording{so_far})",
                 in_order(tl.recomputed, tl.primary)),
                (f"Recorded by the live session (whole recording{so_far})", in_order(tl.recorded, tl.recorded_primary))]

    # -- drawing ------------------------------------------------------------------------------
    def draw(self, snap: Snapshot, width: int) -> Text:
        width -= 1  # the scroll bar's column (see VerdictDetail.draw)
        sections = self.sections(snap)
        self.entries = [(title, c) for title, cs in sections for c in cs]
        if self.selected_index is None and self.entries:
            # start at the first section's latest change at or before now: what explains the screen
            first = [e for e in self.entries if e[0] == self.entries[0][0]]
            before = [e for e in first if e[1].t <= snap.now + 1e-6]
            self.selected = before[-1] if before else first[0]
        out = Text()
        if snap.playback is not None:
            out.append("↑↓ choose · enter: jump the replay there · j: to where the primary became it", style=STYLE_DIM)
        else:
            out.append("a live session: the timeline only (jumping needs a replay)", style=STYLE_DIM)
        row, self._row_of = 0, []
        for title, changes in sections:
            out.append("\n")
            row += 1
            out.append(fmt.clip(title, width), style=STYLE_LABEL)
            if not changes:
                out.append("\n  none", style=STYLE_DIM)
                row += 1
            for c in changes:
                out.append("\n")
                row += 1
                self._row_of.append(row)
                out.append_text(self._row(c, (title, c) == self.selected, snap, width))
        return out

    @staticmethod
    def _row(c: Change, selected: bool, snap: Snapshot, width: int) -> Text:
        t = Text()
        t.append("▸ " if selected else "  ", style="bold")
        t.append(f"{fmt.duration(c.t):>7} ")
        if c.active:
            t.append("on  ", style=severity_style(c.severity))
        else:
            t.append("off ")
        t.append(fmt.clean(c.id).ljust(20), style="bold")
        if c.primary:  # the primary's changes: "primary" where a verdict's row has its severity
            t.append(" " + "primary".ljust(8), style=STYLE_LABEL)
            if c.active:
                if c.before:
                    t.append(f" after {fmt.clean(c.before)}")
                t.append("  " + c.title, style=STYLE_DIM)
            else:
                t.append(" none now" + (f": {c.why}" if c.why else ""))
        elif c.active:
            t.append(" " + severity_word(c.severity).ljust(8), style=severity_style(c.severity))
            if c.since is not None:
                t.append(f" held from {fmt.duration(c.since)}")
            t.append("  " + c.title, style=STYLE_DIM)
        else:
            t.append(" ended   ")
            if c.since is not None:
                t.append(f" on since {fmt.duration(c.since)}")
            t.append("  " + c.title, style=STYLE_DIM)
        if selected:
            t.stylize("reverse")
        elif snap.playback is not None and c.t > snap.now + 1e-6:
            t.stylize(STYLE_DIM)  # after the replay's position
        t.truncate(width, overflow="ellipsis")
        return t
