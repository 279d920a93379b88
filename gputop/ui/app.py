"""The gputop Textual app: one UI for a live session and a replay.

Entry points (what gputop/cli.py calls)::

    GputopApp(session, *, refresh_hz=5.0, history_s=60.0, start_view="overview", title=None)
    run_app(session, **options) -> int   # runs the app in this terminal; returns the exit code

``session`` is a LiveSession or a ReplaySession (docs/architecture.md, "Sessions"). The app only
reads ``store``, ``meta``, ``now()``, ``playback``, ``recording_path``, ``recording_error`` and
calls ``tick()`` (see refresh_hz); it never starts or stops the session: the caller does both
(start before ``run_app``, ``stop()`` after it returns, also on an exception).

Options:
    refresh_hz  replay ticks per second, 1-20 (default 5). Each tick calls ``session.tick()``; a
                tick where the session clock entered a new second redraws what changed. A live
                session ticks once a second, just after its clock enters a new one (the only
                ticks that draw); keys and resizes draw at once either way.
    history_s   seconds of history in the sparklines (default 60).
    start_view  id of the first view ("overview", "gpus", "procs", "threads", "sources", or one
                a panel module registered).
    title       overrides the title shown at the top left ("gputop").

Design: the tick reads the store once into a ``Snapshot`` and hands it to the panels of the
visible view (gputop/ui/panels/), when the session clock has entered a new second (every time
shown is in whole seconds) or a key changed the view or the replay position. Sources run on
their own threads and never touch widgets; nothing here blocks on them. NO_COLOR is honoured
by Textual (monochrome output) and every state is also written in words, so nothing depends on
colour.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from gputop.ui import fmt
from gputop.ui.joblog import LogTail
from gputop.ui.panels import (APP_ACTIONS, HELP_SECTIONS, LOAD_PROBLEMS, Panel, ViewSpec, all_panel_metrics,
                              load_panel_modules, panels_for, views)
from gputop.ui.snapshot import Snapshot
from gputop.ui.sourceinfo import collect_metric_specs

MIN_WIDTH, MIN_HEIGHT = 80, 24
REDRAW_AT_LEAST_S = 1.0  # redraw even without new samples, so STALE marks and live sparklines move
LIVE_TICK_LAG_S = 0.02   # a live tick comes this long after the session clock enters a new second
# Every time the UI shows is in whole seconds, so a redraw is due when the session clock enters
# a new second (live: once a second; a replay at 8x: every tick), not at every tick: the screen
# changes once, in one repaint, where a tick-rate redraw repainted the panels whose numbers moved
# five times a second.
SEEK_SHORT_S, SEEK_LONG_S, STEP_S = 10.0, 60.0, 1.0
STILL_S = 10.0  # a followed file that has not grown for this long is not being written any more

HEALTH_STYLE = {"ok": "green", "degraded": "yellow", "failed": "bold red", "off": "dim"}


def _cmdline(target: dict) -> str:
    cmd = target.get("cmdline")
    if isinstance(cmd, list) and cmd:
        # "/opt/venv/bin/python train.py" -> "python train.py": the path costs columns at 80x24
        return fmt.clean(" ".join([os.path.basename(str(cmd[0])) or str(cmd[0]), *(str(c) for c in cmd[1:])]))
    return fmt.clean(cmd or target.get("name") or "")


class Line(Static):
    """A Static that repaints only when its text changes (most ticks change nothing)."""

    _shown: Text | None = None

    def show(self, text: Text) -> None:
        if text != self._shown:
            # A new layout (the whole screen) only when the number of lines changed; otherwise
            # Textual repaints this line alone.
            relayout = self._shown is None or text.plain.count("\n") != self._shown.plain.count("\n")
            self._shown = text
            self.update(text, layout=relayout)


class HeaderBar(Line):
    """Two lines: who is watched and the session state; the health of each source."""

    def draw(self, snap: Snapshot, title: str, width: int) -> Text:
        session = snap.session
        target = snap.target
        right = Text()
        if snap.playback is not None:
            right.append(" REPLAY ", style="reverse bold")
            host = snap.meta.get("host")
            if host:
                right.append(f" {fmt.clip(host, 30)}")
        else:
            if session.recording_error:
                right.append(" REC FAILED ", style="reverse bold red")
            elif session.recording_path:
                right.append("● REC", style="bold red")
            else:
                right.append("not recording", style="dim")
            right.append(f"  {fmt.duration(snap.now)}")
        left = Text()
        left.append(title, style="bold")
        if target:
            left.append(f"  PID {target.get('pid')} ", style="bold")
            left.append(_cmdline(target))
        room = max(0, width - right.cell_len - 1)
        left.truncate(room, overflow="ellipsis")
        line1 = left + Text(" " * max(1, width - left.cell_len - right.cell_len)) + right

        line2 = Text()
        health = snap.health()
        if health:
            # problems first: if the line is cut at 80 columns, what is cut is what works
            severity = {"failed": 0, "degraded": 1, "ok": 2, "off": 3}
            order = sorted(health, key=lambda n: (severity.get(str(health[n].get("state")), 0), n))
            for i, name in enumerate(order):
                state = str(health[name].get("state") or "?")
                if i:
                    line2.append(" · ", style="dim")
                line2.append(f"{fmt.clean(name)} ")
                line2.append(state, style=HEALTH_STYLE.get(state, ""))
        else:
            line2.append("waiting for the sources' first report", style="dim")
        exited = snap.target_exit()
        status = Text()
        if exited is not None:
            status.append(" TARGET EXITED ", style="reverse bold")
        elif "target" in snap.kinds or target:
            status.append("target running", style="green")
        room = max(0, width - status.cell_len - 1)
        line2.truncate(room, overflow="ellipsis")
        line2 = line2 + Text(" " * max(1, width - line2.cell_len - status.cell_len)) + status
        return Text("\n").join([line1, line2])


class Banner(Line):
    """One line that must not be missed: the target exited, the recording failed."""

    def draw(self, snap: Snapshot, problem: str | None = None) -> Text | None:
        session = snap.session
        if problem:
            return Text(fmt.clean(problem), style="bold")
        exited = snap.target_exit()
        if exited is not None:
            pid = snap.target_pid or "?"
            code = exited.get("exit_code", exited.get("returncode"))
            text = f"Target PID {pid} exited at {fmt.duration(exited.t)}"
            if code is not None:
                text += f" (exit code {code})"
            text += ": all data is kept, browse it; q quits."
            return Text(text, style="bold")
        if session.recording_error:
            return Text(f"Recording: {session.recording_error}. Monitoring continues.", style="bold")
        return None


def view_number(n: int) -> str:
    """The key of the n-th view: 1-9, then 0 for the tenth; later views only by tab."""
    return str(n % 10) if n <= 10 else "·"


def view_key(n: int, spec: ViewSpec) -> str:
    """What the tab line shows as the n-th view's key: its number, "s" for the Stall view past
    the tenth (it has a key of its own), else "·" (reached by tab only)."""
    if n > 10 and spec.id == "stall":
        return "s"
    return view_number(n)


class TabLine(Line):
    """The views and their number keys, in one layout whatever view is current (switching views
    moves nothing): full names where they fit, else short names (``Prc`` for Processes, declared
    with ``register_view``), the longest names shortened first; roomy gaps, then closer ones; at
    worst the line is cut with "…". The current view is in brackets (and reverse video)."""

    def layout(self, specs: list[ViewSpec], width: int) -> tuple[list[str], str]:
        """The labels ("4 Processes", "4 Prc") and the spacing ("roomy", "close" or "tight") that
        fit: as few short names as can be (the ones that save the most cells first), roomy
        before close; then every short name, tight. Nothing here depends on the current view."""
        full = [f"{view_key(n, s)} {fmt.clean(s.title)}" for n, s in enumerate(specs, 1)]
        short = [f"{view_key(n, s)} {fmt.clean(s.short_title)}" for n, s in enumerate(specs, 1)]
        # biggest saving first; a tie shortens the later view first (the first views stay named)
        order = sorted(range(len(specs)), key=lambda i: (len(short[i]) - len(full[i]), -i))
        labels = list(full)
        for k in range(len(specs) + 1):
            if k:
                labels[order[k - 1]] = short[order[k - 1]]
            for spacing in ("roomy", "close"):
                if self.needs(labels, spacing) <= width:
                    return labels, spacing
        return short, "tight"

    @staticmethod
    def needs(labels: list[str], spacing: str) -> int:
        """Cells a layout takes: " label " and a gap between tabs (roomy), " label " side by side
        (close), or one cell between labels and at the ends, the brackets' (tight)."""
        if spacing == "roomy":
            return sum(len(x) + 3 for x in labels) - 1
        if spacing == "close":
            return sum(len(x) + 2 for x in labels)
        return sum(len(x) + 1 for x in labels) + 1

    def draw(self, specs: list[ViewSpec], current: str, has_data: dict[str, bool], width: int = 80) -> Text:
        labels, spacing = self.layout(specs, width)
        t = Text()
        if spacing == "tight":
            for i, (spec, label) in enumerate(zip(specs, labels)):
                now = spec.id == current
                before_now = i + 1 < len(specs) and specs[i + 1].id == current
                if i == 0:
                    t.append("[" if now else " ", style="reverse bold" if now else "")
                t.append(label, style="reverse bold" if now else ("" if has_data.get(spec.id, True) else "dim"))
                t.append("]" if now else "[" if before_now else " ", style="reverse bold" if now or before_now else "")
        else:
            gap = " " if spacing == "roomy" else ""
            for i, (spec, label) in enumerate(zip(specs, labels)):
                if i:
                    t.append(gap)
                if spec.id == current:
                    t.append(f"[{label}]", style="reverse bold")
                else:
                    t.append(f" {label} ", style="" if has_data.get(spec.id, True) else "dim")
            if t.cell_len < width:
                t.append(gap)
        if t.cell_len > width:
            t.truncate(width, overflow="ellipsis")
        return t


class ReplayBar(Line):
    """Where the replay is: play state, speed, position over length, a bar, the wall time."""

    _end_seen: tuple[float, float] | None = None  # (t_end, when it was first seen, monotonic)

    def _ends_early(self, pb) -> bool:
        """A file without an end frame is being written, or its writer died. It died if it ends
        inside a frame (the index's ``truncated``), or if nothing was added for STILL_S (a live
        recorder writes a chunk every second)."""
        index = getattr(getattr(pb, "reader", None), "index", None)
        if getattr(index, "truncated", False):
            return True
        now = time.monotonic()
        if self._end_seen is None or self._end_seen[0] != pb.t_end:
            self._end_seen = (pb.t_end, now)
        return now - self._end_seen[1] >= STILL_S

    def draw(self, snap: Snapshot, width: int) -> Text:
        pb = snap.playback
        t = Text()
        t.append(" ▶ playing " if pb.playing else " ‖ paused  ", style="reverse bold")
        t.append(f" {_speed(pb.speed):>5} ", style="bold")
        t.append(f" {fmt.duration(pb.position)} / {fmt.duration(pb.t_end)} ")
        tail = Text()
        notice = getattr(pb, "notice", None)  # damaged parts skipped (session/replay.py)
        if notice:
            tail.append(f" ⚠ {notice}", style="bold")
        if pb.growing and self._ends_early(pb):
            tail.append(" the recording ends early (gputop was killed?)", style="bold")
        elif pb.growing:
            tail.append(" following a live file", style="bold")
        elif pb.position >= pb.t_end and not pb.playing:
            tail.append(" end of recording")
        start_wall = snap.meta.get("start_wall")
        if isinstance(start_wall, (int, float)):
            clock = " " + time.strftime("%H:%M:%S", time.localtime(start_wall + pb.position))
            if t.cell_len + len(clock) + tail.cell_len <= width:  # the wall time gives way to a notice
                tail = Text(clock) + tail
        bar_w = max(0, width - t.cell_len - tail.cell_len - 1)
        if bar_w >= 5:
            span = max(pb.t_end - pb.t_start, 1e-9)
            frac = min(max((pb.position - pb.t_start) / span, 0.0), 1.0)
            done = int(round(frac * (bar_w - 1)))
            t.append("━" * done, style="bold")
            t.append("●", style="bold")
            t.append("─" * (bar_w - 1 - done), style="dim")
        t.append_text(tail)
        t.truncate(width, overflow="ellipsis")
        return t


def _speed(x: float) -> str:
    return f"{x:g}x"


class TooSmall(Static):
    pass


def key_hints(pairs: list[tuple[str, str]], width: int) -> Text:
    """The bottom line: keys in reverse video, what they do after each. Our own line and not
    Textual's Footer, so that the keys that matter fit in 80 columns."""
    t = Text()
    for keys, what in pairs:
        if t.cell_len + len(keys) + len(what) + 3 > width:
            break
        t.append(f"{keys}", style="reverse bold")
        t.append(f" {what}  ")
    return t


class KeyBar(Line):
    pass


class HelpScreen(Screen):
    """What every key does and what every number means, one line each."""

    BINDINGS = [
        Binding("escape,question_mark,q", "close", "Close help"),
    ]

    def __init__(self, content) -> None:
        super().__init__()
        self.content = content  # a Rich renderable

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-scroll"):
            yield Static(self.content, id="help-text")
        yield KeyBar(key_hints([("esc", "close help"), ("↑↓ pgup pgdn", "scroll")], 200), id="keys")

    def on_mount(self) -> None:
        self.query_one("#help-scroll").focus()

    def action_close(self) -> None:
        self.dismiss()


class GputopApp(App[int]):
    CSS_PATH = "gputop.tcss"
    TITLE = "gputop"
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("tab", "next_view", "Next view", show=False, priority=True),
        Binding("shift+tab", "prev_view", "Previous view", show=False, priority=True),
        *[Binding(view_number(n), f"view({n})", f"View {n}", show=False) for n in range(1, 11)],
        Binding("s", "view_id('stall')", "Stall view", show=False),
        # every view; live it says in a line that jumping needs a replay (panels/verdicts.py)
        Binding("j", "jump_primary", "Jump to the primary verdict's start", show=False, priority=True),
        Binding("space", "toggle_play", "Play/pause", key_display="space", priority=True),
        Binding("left", "seek(-10)", "-10s", key_display="←", priority=True),
        Binding("right", "seek(10)", "+10s", key_display="→", priority=True),
        # pgup/pgdn seek only in a replay (check_action); in a live session they scroll the view.
        Binding("left_square_bracket,shift+left,pageup", "seek(-60)", "-1m", key_display="[", priority=True),
        Binding("right_square_bracket,shift+right,pagedown", "seek(60)", "+1m", key_display="]", priority=True),
        Binding("comma", "step(-1)", "Step back", key_display=",", show=False, priority=True),
        Binding("full_stop", "step(1)", "Step", key_display=".", priority=True),
        Binding("minus", "slower", "Slower", key_display="-", priority=True),
        Binding("plus,equals_sign", "faster", "Faster", key_display="+", priority=True),
        Binding("home,g", "seek_start", "Start", key_display="home", show=False, priority=True),
        Binding("end,G", "seek_end", "End", key_display="end", show=False, priority=True),
    ]
    REPLAY_ACTIONS = {"toggle_play", "seek", "step", "slower", "faster", "seek_start", "seek_end"}

    def __init__(self, session: Any, *, refresh_hz: float = 5.0, history_s: float = 60.0,
                 start_view: str = "overview", title: str | None = None, job_log: str | None = None,
                 notice: str | None = None) -> None:
        super().__init__()
        self.job_log = LogTail(job_log) if job_log else None  # the job's output (gputop run)
        # one line the command had for the user as the UI starts (the demo without torch): a line
        # printed before would be hidden behind the screen until the user quits
        self.notice = notice
        self.session = session
        self.refresh_hz = min(max(float(refresh_hz), 1.0), 20.0)
        self.history_s = float(history_s)
        self._cell_cache: dict = {}  # sparkline cells kept between ticks (see Snapshot.cells)
        self.app_title = title or "gputop"
        load_panel_modules()
        self.view_specs = [v for v in views() if v.only_if is None or v.only_if(self)]
        ids = [v.id for v in self.view_specs]
        self.current_view = start_view if start_view in ids else ids[0]
        self.panels: dict[str, list[Panel]] = {v.id: [cls() for cls in panels_for(v.id)] for v in self.view_specs}
        # panels that keep track of something at every draw, their view shown or not (Panel.follow)
        self._followers = [p for ps in self.panels.values() for p in ps if type(p).follow is not Panel.follow]
        self.snapshot: Snapshot | None = None
        self._drawn_view: str | None = None
        self._drawn_second: int | None = None  # the session clock's whole second at the last draw
        self._drawn_at = 0.0
        self.draws = 0  # full redraws done (tests: a tick that is not due draws nothing)
        self._small = False
        # (start on the monotonic clock, seconds spent) of recent ticks: benchmarks/ui_tick.py
        self.tick_log: deque[tuple[float, float]] = deque(maxlen=100_000)
        self.tick_errors = 0
        self.session_error: str | None = None
        self.last_tick_error: str | None = None

    # -- layout ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Vertical(id="main"):
            yield HeaderBar(id="header")
            yield Banner(id="banner")
            yield TabLine(id="tabs")
            for spec in self.view_specs:
                with VerticalScroll(id=f"view-{spec.id}", classes="view"):
                    yield from self.panels[spec.id]
                    yield Static("", classes="empty-view")
            if self.session.playback is not None:
                yield ReplayBar(id="replay")
            yield KeyBar(id="keys")
        yield TooSmall(id="too-small")

    def on_mount(self) -> None:
        # looked up once: a CSS query per widget per tick cost more than drawing the header
        self._header = self.query_one(HeaderBar)
        self._banner = self.query_one(Banner)
        self._tabs = self.query_one(TabLine)
        self._keys = self.query_one("#main KeyBar", KeyBar)
        self._replay_bar = self.query_one(ReplayBar) if self.session.playback is not None else None
        self._empty = {spec.id: self.query_one(f"#view-{spec.id} .empty-view", Static) for spec in self.view_specs}
        self._apply_size(self.size.width, self.size.height)
        self._show_view(self.current_view)
        self.tick()
        if self.notice:
            self.notify(self.notice, timeout=20)
        if self.session.playback is None:
            self._live_tick_later()
        else:
            self.set_interval(1.0 / self.refresh_hz, self.tick)

    def _live_tick_later(self) -> None:
        """A live session's clock is the wall's and a draw happens only when it enters a new
        second, so one tick a second, just after that, draws as often as five ticks a second did:
        each tick that draws nothing still wakes Textual's timer and message pump (on the 2-core
        box ~0.1% of a core for the four idle ticks a second). Keys and resizes draw at once."""
        now = self.session.now()
        delay = (math.floor(now) + 1.0 - now) + LIVE_TICK_LAG_S if math.isfinite(now) else 1.0
        self.set_timer(min(max(delay, 0.01), REDRAW_AT_LEAST_S + LIVE_TICK_LAG_S), self._live_tick)

    def _live_tick(self) -> None:
        try:
            self.tick()
        finally:
            self._live_tick_later()

    def on_resize(self, event: events.Resize) -> None:
        self._apply_size(event.size.width, event.size.height)
        self._drawn_second = None  # redraw with the new widths: now (a live tick is up to 1 s away)
        self.call_after_refresh(self.tick)

    def _apply_size(self, width: int, height: int) -> None:
        small = width < MIN_WIDTH or height < MIN_HEIGHT
        self._small = small
        self.set_class(small, "-too-small")
        if small:
            self.query_one(TooSmall).update(Text(
                f"gputop needs a terminal of at least {MIN_WIDTH}x{MIN_HEIGHT}; this one is {width}x{height}.\n"
                "Make the window larger (nothing is lost meanwhile), or press q to quit.",
                justify="center"))

    # -- the tick ----------------------------------------------------------------------------
    def tick(self) -> None:
        started = time.perf_counter()
        try:
            self.session.tick()
            self.session_error = None
        except Exception as e:  # e.g. a followed file turned out damaged: say so, keep what we have
            self.session_error = f"reading the session failed: {e or type(e).__name__}"
        if self._due():
            self._draw_guarded()
        self.tick_log.append((started, time.perf_counter() - started))

    def _draw_guarded(self) -> None:
        """Draw now; a drawing bug must not kill a monitor of a long training run (at a tick, or
        at a key: Textual ends the app on an exception in a key's action)."""
        try:
            self._draw(Snapshot(self.session, self.history_s, self._cell_cache, self.job_log))
        except Exception as e:
            self.display_error(e)

    def display_error(self, e: Exception) -> None:
        self.tick_errors += 1
        self.last_tick_error = f"display error: {type(e).__name__}: {e}"
        try:
            banner = self._banner
            banner.display = True
            banner.show(Text(fmt.clean(self.last_tick_error), style="bold"))
        except Exception:
            pass

    def _due(self) -> bool:
        """Whether this tick redraws: the session clock entered a new second, the view or size
        changed, or a second of wall time passed (a paused replay, STALE marks)."""
        return (math.floor(self.session.now()) != self._drawn_second or self._drawn_view != self.current_view
                or time.monotonic() - self._drawn_at >= REDRAW_AT_LEAST_S)

    def _draw(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.draws += 1
        self._drawn_second = math.floor(snap.now)
        self._drawn_at = time.monotonic()
        self._drawn_view = self.current_view
        width = self.size.width
        header = self._header
        header.show(header.draw(snap, self.app_title, width))
        banner = self._banner
        text = banner.draw(snap, self.session_error)
        banner.display = text is not None
        if text is not None:
            banner.show(text)
        if self._replay_bar is not None:
            self._replay_bar.show(self._replay_bar.draw(snap, width))
        for panel in self._followers:  # also while the terminal is too small: they must not miss a second
            panel.follow(snap)
        if self._small:
            return
        has_data = {}
        with self.batch_update():
            for spec in self.view_specs:
                shown_any = False
                for panel in self.panels[spec.id]:
                    try:
                        shown = panel.shown(snap)
                        shown_any |= shown
                        if spec.id == self.current_view:
                            panel.display = shown
                            if shown:
                                panel.update_view(snap)
                    except Exception as e:   # (one panel's failure: it says so, the others draw)
                        if spec.id == self.current_view:
                            panel.display = True
                        panel.failed(e)
                has_data[spec.id] = shown_any
                if spec.id == self.current_view:
                    empty = self._empty[spec.id]
                    empty.display = not shown_any
                    if not shown_any:
                        needs = sorted({k for p in self.panels[spec.id] for k in p.NEEDS})
                        empty.update(Text(f"No data for this view yet (it shows samples of kind: {', '.join(needs)})."
                                          if needs else "Nothing to show yet.", style="dim"))
            self._tabs.show(self._tabs.draw(self.view_specs, self.current_view, has_data, width))
            self._keys.show(key_hints(self.hints(), width))

    def hints(self) -> list[tuple[str, str]]:
        n = len(self.view_specs)
        # keys 1-9, then 0 for the tenth view (view_number)
        views_key = "0-9" if n >= 10 else (f"1-{n}" if n > 1 else "1")
        stall = [("s", "stall")] if any(v.id == "stall" for v in self.view_specs) else []
        if self.session.playback is not None:
            return [("q", "quit"), ("?", "help"), ("space", "play"), ("←→", "±10s"), ("[]", "±1m"),
                    (",.", "step"), ("-+", "speed"), (views_key, "views"), *stall]
        return [("q", "quit"), ("?", "help"), (views_key, "views"), ("tab", "next view"), *stall, ("↑↓", "scroll")]

    def redraw_now(self) -> None:
        """After a key changed the replay position: show it without waiting for the tick."""
        self._draw_guarded()

    # -- views ---------------------------------------------------------------------------------
    def _show_view(self, view_id: str) -> None:
        self.current_view = view_id
        for spec in self.view_specs:
            self.query_one(f"#view-{spec.id}").display = spec.id == view_id
        container = self.query_one(f"#view-{view_id}")
        container.focus()
        # A panel with keys of its own takes the keyboard (a hidden one cannot: the view keeps it);
        # keys it does not bind (up, down, pgup, pgdn) still reach the view's scrolling around it.
        for panel in self.panels[view_id]:
            if panel.FOCUS_ON_SHOW:
                panel.focus(scroll_visible=False)
                break

    def action_view(self, n: int) -> None:
        if 1 <= n <= len(self.view_specs):
            self._show_view(self.view_specs[n - 1].id)
            self.redraw_now()

    def action_view_id(self, view_id: str) -> None:
        if any(v.id == view_id for v in self.view_specs):
            self._show_view(view_id)
            self.redraw_now()

    def _cycle(self, step: int) -> None:
        ids = [v.id for v in self.view_specs]
        self._show_view(ids[(ids.index(self.current_view) + step) % len(ids)])
        self.redraw_now()

    def action_next_view(self) -> None:
        self._cycle(1)

    def action_prev_view(self) -> None:
        self._cycle(-1)

    # -- help ----------------------------------------------------------------------------------
    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(self.help_text()))

    def help_text(self) -> Group:
        """Keys, symbols and every metric's one-line meaning (from the sources' METRICS)."""

        def table(rows: list[tuple[str, str]], key_w: int) -> Table:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(width=key_w, no_wrap=True, style="bold")
            grid.add_column(ratio=1)
            for k, v in rows:
                grid.add_row(fmt.clean(k), fmt.clean(v))
            return grid

        parts: list = [Text("gputop help: what each key does and what each number means (esc closes)\n",
                            style="bold")]
        parts.append(Text("Keys", style="bold underline"))
        parts.append(table([
            ("q", "quit (ctrl+c too)"),
            ("?", "this help; esc, ? or q closes it"),
            ("1-9 0, tab", "switch view: " + ", ".join(f"{view_number(n)} {v.title}" if n <= 10 else
                                                       f"{v.title} (tab)" for n, v in enumerate(self.view_specs, 1))),
            ("↑ ↓ pgup pgdn", "scroll the view (in a replay pgup/pgdn seek 1 min)"),
            *([("s", "the Stall view: every thread of every rank when the loop stopped")]
              if any(v.id == "stall" for v in self.view_specs) else []),
        ], 14))
        live = "" if self.session.playback is not None else " (this is a live session: they do nothing)"
        parts.append(Text("Replay" + live, style="bold underline"))
        parts.append(table([
            ("space", "play / pause"),
            ("← →", f"back / forward {SEEK_SHORT_S:g} s"),
            ("[ ] pgup pgdn", f"back / forward {SEEK_LONG_S / 60:g} min (also shift+← →)"),
            ("home end", "start / end of the recording (also g G)"),
            (", .", f"step back / forward {STEP_S:g} s (pauses)"),
            ("- +", "slower / faster: 0.25x 0.5x 1x 2x 4x 8x 16x"),
            ("j", "to when the primary verdict became the primary, in every view (live: a line says it "
                  "needs a replay)"),
        ], 14))
        parts.append(Text("Symbols", style="bold underline"))
        parts.append(table([
            ("n/a: reason", "the value cannot be measured here, and why; a missing value is never drawn as 0"),
            ("▁▂▃▅▇█", f"the last {self.history_s:g} s, mean per cell; a blank cell had no sample"),
            ("GPU0*", "a GPU the target's processes use"),
            ("SM TC DRAM", "overview: SM active, tensor active, DRAM bw of each GPU (below); \"util\" "
                           "instead of SM is GPU util, shown when the GPU has no GPM counters"),
            ("STALE", "no new sample for 3 s: the source stopped or fell behind"),
            ("● REC", "this session is being recorded (the Sources view says where)"),
            ("dim rows", "processes or threads that are gone: their last values"),
        ], 14))
        for title, rows in HELP_SECTIONS:  # sections panel modules add (register_help_section)
            parts.append(Text(fmt.clean(title), style="bold underline"))
            parts.append(table(rows, min(22, max([14, *(len(k) for k, _ in rows)]))))
        helped = collect_metric_specs(all_panel_metrics())
        parts.append(Text("Metrics", style="bold underline"))
        if not helped.specs:
            parts.append(Text("no source module describes its metrics in this build", style="dim"))
        by_kind: dict[str, list] = {}
        for spec in helped.specs:
            by_kind.setdefault(spec.kind, []).append(spec)
        for kind, specs in by_kind.items():
            parts.append(Text(f"{kind} samples", style="bold"))
            parts.append(table([(s.label + (f" ({s.unit})" if s.unit else ""), s.help) for s in specs], 22))
        for problem in helped.problems + LOAD_PROBLEMS:
            parts.append(Text(fmt.clean(problem), style="bold red"))
        return Group(*parts)

    # -- replay controls -----------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.REPLAY_ACTIONS:
            return self.session.playback is not None and not isinstance(self.screen, HelpScreen)
        if action == "jump_primary":
            return not isinstance(self.screen, HelpScreen)
        return True

    def action_jump_primary(self) -> None:
        """``j``, in every view: what the verdict panels registered for it (jump to where the
        primary verdict became the primary; live, a line that says jumping needs a replay)."""
        jump = APP_ACTIONS.get("jump_primary")
        if jump is None:
            self.notify("j jumps to the primary verdict's start, but this build has no verdict panels",
                        severity="warning")
            return
        if self.snapshot is not None and not self._small:
            jump(self, self.snapshot)

    def _playback(self):
        return self.session.playback

    def action_toggle_play(self) -> None:
        self._playback().toggle()
        self.redraw_now()

    def action_seek(self, dt: float) -> None:
        self._playback().seek_relative(float(dt))
        self.redraw_now()

    def action_step(self, dt: float) -> None:
        self._playback().step(float(dt) * STEP_S)
        self.redraw_now()

    def action_seek_start(self) -> None:
        pb = self._playback()
        pb.seek(pb.t_start)
        self.redraw_now()

    def action_seek_end(self) -> None:
        pb = self._playback()
        pb.seek(pb.t_end)
        self.redraw_now()

    def action_faster(self) -> None:
        self._playback().faster()
        self.redraw_now()

    def action_slower(self) -> None:
        self._playback().slower()
        self.redraw_now()

    async def action_quit(self) -> None:
        self.exit(0)


def run_app(session: Any, **options: Any) -> int:
    """Run the UI in this terminal until the user quits; return the process exit code."""
    app = GputopApp(session, **options)
    result = app.run()
    if app.return_code not in (None, 0):
        return int(app.return_code)
    return int(result or 0)
