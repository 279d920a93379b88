"""Panels: the pieces of the UI, and the registry that lets a new one plug in.

How to add a panel (no edit of the app needed)
-----------------------------------------------
1. Create a module in this package, e.g. ``gputop/ui/panels/mine.py``. Every module here is
   imported when the app starts (``load_panel_modules``); a module that fails to import is
   reported on the help screen and the rest of the UI still starts.
2. If your panel needs a view of its own, register it once::

       register_view("mine", "Mine", order=60, short="Mine")

   Views are listed in ``order`` in the tab line; number keys 1-9 (then 0) follow that order.
   ``short`` (3-4 letters, unique) is the view's name when the full names do not fit in the
   terminal's width.
   Taken: overview 10, verdicts 15, gpus 20, procs 30, threads 40, stacks 45, steps 50 (probe.py),
   ranks 55, time 85 (budget.py), sources 90 (gputop/ui/README.md lists them with their modules).
3. Subclass ``TextPanel`` (text out) or ``Panel`` (your own widgets, e.g. a DataTable) and
   decorate it::

       @register_panel
       class StepTimes(TextPanel):
           VIEW = "mine"           # which view it lives in
           ORDER = 10              # position inside the view, top first
           NEEDS = ("step",)       # sample kinds; shown once any of them exists
           TITLE = "Step times"    # its title line
           METRICS = [MetricSpec(...)]   # optional: one-line help for numbers it derives

           def draw(self, snap: Snapshot, width: int) -> Text:
               ...                 # read snap (never the session), return text

   A ``Panel`` that manages its own widgets overrides ``update_view(snap)`` instead of
   ``draw``. Either is called on the UI thread at the UI's tick, only while the panel is in
   the visible view, and only when the session clock entered a new second, a key changed the
   view or the replay position, or the panel was resized (a ``TextPanel`` whose text changed
   repaints only the rows that changed). Do the drawing from the snapshot alone: no I/O, no
   blocking, no threads. Work that takes long runs in a Textual worker that posts messages to
   the panel (verdict_timeline.py).

The overview's top (ORDER 0-9) is reserved for the verdict strip (issue 5: primary verdict,
evidence, advice): register it with ``VIEW = "overview"`` and ``ORDER = 0``.

A panel with keys of its own sets ``FOCUS_ON_SHOW = True`` (and ``can_focus = True``, and
``BINDINGS``): it gets the keyboard when its view opens. A panel that overrides ``follow(snap)``
is called at every draw, its view shown or not (cheap bookkeeping, no drawing). A module can add a section to the help
screen with ``register_help_section(title, [(term, meaning), ...])``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from rich.text import Text
from textual.geometry import Region
from textual.widget import Widget

from gputop.model import MetricSpec
from gputop.ui import fmt
from gputop.ui.snapshot import Snapshot


SHORT_MAX = 5  # a view without a short name keeps a title this short; a longer one is cut to 4 cells


@dataclass(frozen=True)
class ViewSpec:
    id: str
    title: str
    order: int
    only_if: Callable[[Any], bool] | None = None  # given the app: whether this view exists
    short: str = ""  # the tab line's name when the full names do not fit (3-4 letters, unique)

    @property
    def short_title(self) -> str:
        """``short``, else the title if it is short already, else its first letters and "…"."""
        if self.short:
            return self.short
        return self.title if len(self.title) <= SHORT_MAX else self.title[:3] + "…"


_VIEWS: dict[str, ViewSpec] = {}
_PANELS: list[type["Panel"]] = []
LOAD_PROBLEMS: list[str] = []
HELP_SECTIONS: list[tuple[str, list[tuple[str, str]]]] = []
# app-wide key actions a panel module provides: name -> fn(app, snapshot); the app binds the key
# (``j``: "jump_primary", panels/verdicts.py)
APP_ACTIONS: dict[str, Callable[[Any, Snapshot], None]] = {}


def register_view(view_id: str, title: str, order: int,
                  only_if: Callable[[Any], bool] | None = None, short: str = "") -> ViewSpec:
    """A view; ``only_if(app)`` False leaves it out of that app (e.g. Output without a job log).
    ``short`` is its name in a tab line too narrow for the full names ("Prc" for "Processes"):
    3 or 4 letters that read as the title and differ from the other views' (without one, the
    title's first letters and "…")."""
    spec = ViewSpec(view_id, title, order, only_if, short)
    _VIEWS[view_id] = spec
    return spec


def register_panel(cls: type["Panel"]) -> type["Panel"]:
    if cls not in _PANELS:
        _PANELS.append(cls)
    return cls


def register_help_section(title: str, rows: list[tuple[str, str]]) -> None:
    """A section of the help screen (after the built-in ones): a title, then term: meaning rows."""
    HELP_SECTIONS[:] = [(t, r) for t, r in HELP_SECTIONS if t != title]
    HELP_SECTIONS.append((title, list(rows)))


def register_app_action(name: str, fn: Callable[[Any, Snapshot], None]) -> None:
    """What an app-wide key does in every view (the app's binding calls ``fn(app, snapshot)``)."""
    APP_ACTIONS[name] = fn


def views() -> list[ViewSpec]:
    return sorted(_VIEWS.values(), key=lambda v: (v.order, v.id))


def panels_for(view_id: str) -> list[type["Panel"]]:
    return sorted((p for p in _PANELS if p.VIEW == view_id), key=lambda p: (p.ORDER, p.__name__))


def all_panel_metrics() -> list[MetricSpec]:
    return [m for p in _PANELS for m in p.METRICS]


_loaded = False


def load_panel_modules() -> None:
    """Import every module of this package once, so their panels register themselves."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        name = f"{__name__}.{info.name}"
        try:
            importlib.import_module(name)
        except Exception as e:  # one broken panel must not take the UI down
            LOAD_PROBLEMS.append(f"panel module {name} failed to load: {type(e).__name__}: {e}")


class Panel(Widget):
    """A block of one view. Subclasses set the class attributes and draw from a Snapshot."""

    VIEW: ClassVar[str] = "overview"
    ORDER: ClassVar[int] = 50
    NEEDS: ClassVar[tuple[str, ...]] = ()
    TITLE: ClassVar[str] = ""
    METRICS: ClassVar[list[MetricSpec]] = []
    FOCUS_ON_SHOW: ClassVar[bool] = False  # takes the keyboard when its view opens (own BINDINGS)

    DEFAULT_CSS = """
    Panel {
        height: auto;
        border-top: solid $primary-darken-1;
        border-title-align: left;
        border-title-color: $text;
        border-title-style: bold;
        padding: 0 0;
    }
    """

    def __init__(self) -> None:
        super().__init__(id=f"panel-{type(self).__name__.lower()}", classes="panel")
        if self.TITLE:
            self.border_title = self.TITLE
        self.last_snapshot: Snapshot | None = None

    def shown(self, snap: Snapshot) -> bool:
        """Whether the panel has anything to show. Default: any of NEEDS is present."""
        return not self.NEEDS or any(k in snap.kinds for k in self.NEEDS)

    def update_view(self, snap: Snapshot) -> None:
        self.last_snapshot = snap

    def show_failure(self, e: Exception) -> None:
        """What the panel shows when drawing it failed (a bug, or a value no check foresaw):
        one line; the app counts it and says it in the banner. Default: nothing more."""

    def follow(self, snap: Snapshot) -> None:
        """Called at every draw, also while the panel's view is hidden, for a panel that must not
        miss what the store forgets after 300 s (the verdict strip follows the primary verdict's
        changes). Cheap, no drawing. Default: nothing (and the app does not call it)."""

    def on_resize(self) -> None:
        if self.last_snapshot is not None and self.display:
            try:
                self.update_view(self.last_snapshot)
            except Exception as e:   # (Textual ends the app on an exception in a handler)
                self.failed(e)

    def failed(self, e: Exception) -> None:
        """Drawing the panel raised: it shows one line, and the app counts it and says it in its
        banner (a bug, or a value no check foresaw, costs this panel, not the monitor)."""
        self.show_failure(e)
        report = getattr(self.app, "display_error", None) if self.is_attached else None
        if report is not None:
            report(e)


def changed_rows(old: Text, new: Text, width: int) -> list[int] | None:
    """The line numbers where ``new`` differs from ``old`` (text or style), both with the same
    number of lines; None when a line is wider than ``width`` (it wraps: line numbers are not
    rows) or the lines cannot be compared, so the caller repaints everything."""
    if "\t" in new.plain or "\t" in old.plain:
        return None
    old_lines, new_lines = old.split("\n", allow_blank=True), new.split("\n", allow_blank=True)
    if len(old_lines) != len(new_lines) or any(line.cell_len > width for line in new_lines):
        return None
    return [y for y, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]


class TextPanel(Panel):
    """A panel that is one block of text: implement ``draw(snap, width) -> Text``."""

    def __init__(self) -> None:
        super().__init__()
        self._text = Text("")
        self._lines = 1
        self.repaints = 0  # times the text changed and was sent to Textual (tests)

    def draw(self, snap: Snapshot, width: int) -> Text:  # pragma: no cover - abstract
        raise NotImplementedError

    def update_view(self, snap: Snapshot) -> None:
        self.last_snapshot = snap
        width = self.content_size.width or (self.app.size.width if self.is_attached else 80)
        text = self.draw(snap, width)
        if text == self._text:
            return
        lines = text.plain.count("\n") + 1
        old, self._text = self._text, text
        if lines != self._lines:
            self.refresh(layout=True)  # only a change in the number of lines needs a new layout
        else:
            # Repaint only the rows that changed: most seconds change a number or two of a
            # table, and Textual's cost is per row painted (and per byte sent to the terminal).
            rows = changed_rows(old, text, width)
            self.refresh(*(Region(0, y, width, 1) for y in rows) if rows is not None else ())
        self.repaints += 1
        self._lines = lines

    def show_failure(self, e: Exception) -> None:
        self._text = Text(fmt.clip(f"this panel could not be drawn: {type(e).__name__}: {e}", 300), style="bold")
        self._lines = 1
        self.refresh(layout=True)

    @property
    def text(self) -> Text:
        """What the panel shows now (all of it, also the part scrolled out of view)."""
        return self._text

    def render(self) -> Text:
        return self._text
