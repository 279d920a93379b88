"""Verdicts in the UI: the strip at the top of the overview and the Verdicts view.

- Overview, ORDER 0 (the reserved top): the primary verdict in one or two lines with its
  severity in colour *and* words, how long it has been the primary ("for N s": it starts again
  when the primary changes), what fixing it would gain, its confidence, the other active
  verdicts, and its advice on the next line (clipped). Without a primary it says why (the
  engine's "why": collecting evidence, warming up, start-up, no rule holds...).
- The "Verdicts" view: the primary verdict in full (evidence as a table, advice wrapped,
  confidence and missing sources), every other active verdict, the engine's notes (causes that
  hold but cost no GPU time), and the timeline: each verdict's on and off, and each change of the
  primary (the strip's story, row by row). In a replay, ↑ ↓ choose a change and enter jumps to
  it; ``j`` (in every view) jumps to where the primary became the primary.

Where the numbers come from: ``verdict``, ``verdict_primary`` and ``verdict_change`` samples
(gputop/verdicts/engine.py). A replay recomputes them from the raw samples, so what the strip
shows is this gputop's judgement; the live session's own verdicts stay in the file as
``<kind>@recorded``. The timeline panel is in verdict_timeline.py. The store keeps 300 s, so
what the panels tell about the primary comes from ``SessionVerdicts``: the changes followed at
every draw since the session's engine (re)started, and in a replay the whole file's, once the
timeline's pass has read it.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_app_action, register_help_section, register_panel, register_view
from gputop.ui.snapshot import Snapshot
from gputop.verdicts.causal import gain_text
from gputop.verdicts.engine import ENTER_S, KIND_VERDICT, KIND_VERDICT_CHANGE as KIND_CHANGE
from gputop.verdicts.engine import KIND_VERDICT_PRIMARY as KIND_PRIMARY
from gputop.verdicts.engine import VerdictEngine
from gputop.verdicts.registry import specs as verdict_specs

register_view("verdicts", "Verdicts", order=15, short="Vrd")

SEVERITY_WORD = {"info": "INFO", "warning": "WARNING", "critical": "CRITICAL"}
SEVERITY_STYLE = {"info": "bold green", "warning": "bold yellow", "critical": "bold red"}
STYLE_LABEL, STYLE_DIM, STYLE_BAD = "bold", "dim", "bold red"
STALE_S = 3.0      # the engine publishes every second; older than this, it stopped
ADVICE_LINES = 2   # the strip wraps its advice onto a second line before cutting it
JUMP_LEAD_S = 10.0      # a jump replays this much before its target (see jump_to)
# a rule holding from t shows as a verdict at the first evaluation >= ENTER_S later
SHOWS_AFTER_S = math.ceil(ENTER_S / VerdictEngine.interval_s) * VerdictEngine.interval_s

# Sources and the sample kinds that show they have delivered (for "collecting evidence").
SOURCE_KINDS = {"nvml": ("gpu",), "host": ("system", "proc"), "stacks": ("stacks", "thread_kernel"),
                "probe": ("probe_step",)}

# One line per verdict id for the help screen: the per-window rules in their order, then
# straggler_rank (the rule across ranks). gputop/verdicts/registry.py holds them, formatted
# from the thresholds; docs/verdicts.md has the reasons.
VERDICT_MEANINGS = {s.id: s.meaning for s in sorted(verdict_specs(), key=lambda s: s.across_ranks)}

register_help_section("Verdicts (what gputop concludes; docs/verdicts.md has the thresholds)", [
    ("● WARNING id", "the primary verdict: the active one that costs the most step time (colour repeats the "
                     "word: INFO green, WARNING yellow, CRITICAL red)"),
    ("j", "replay: jump to when the primary verdict became the primary (where its \"for N s\" counts from), "
          "in every view; live it says that jumping needs a replay"),
    ("↑ ↓ enter", "Verdicts view: choose a change in the timeline; enter jumps the replay there"),
    *VERDICT_MEANINGS.items(),
])


# -- reading verdicts from the snapshot -----------------------------------------------------------

def engine_runs(snap: Snapshot) -> bool:
    """Whether this session computes verdicts itself (live, or recomputed by a replay)."""
    return snap.computes(KIND_VERDICT)


def origin(snap: Snapshot) -> str:
    """What the plain verdict kinds hold: "recomputed" (a replay runs the engine again),
    "recorded" (a replay without an engine shows what the file holds) or "live"."""
    if snap.playback is None:
        return "live"
    return "recomputed" if engine_runs(snap) else "recorded"


def has_verdicts(snap: Snapshot) -> bool:
    return (engine_runs(snap) or KIND_PRIMARY in snap.kinds or KIND_VERDICT in snap.kinds
            or "verdicts" in snap.health())


def names(x) -> list[str]:
    """A list of names from a sample field (anything else, e.g. from a damaged file: none)."""
    return [fmt.clean(i) for i in x if i] if isinstance(x, (list, tuple)) else []


def severity_style(sev) -> str:
    return SEVERITY_STYLE.get(str(sev), "bold")


def severity_word(sev) -> str:
    return SEVERITY_WORD.get(str(sev), fmt.clean(sev or "?").upper())


def held_for(seconds, at_least: bool = False) -> str:
    """"for 42 s", "for 12 min", "for 2 h 05 min"; ``at_least``: "for ≥ 42 s" (what came
    before is not known: a replay's verdicts start again after a seek)."""
    s = fmt.to_float(seconds)
    if s is None:
        return ""
    s = max(0.0, s)
    word = "for ≥" if at_least else "for"
    if s < 90:
        return f"{word} {s:.0f} s"
    if s < 5400:
        return f"{word} {s / 60:.0f} min"
    h, m = divmod(int(s // 60), 60)
    return f"{word} {h} h {m:02d} min"


@dataclass(frozen=True)
class Primary:
    id: str
    data: dict           # the latest ``verdict`` sample of that id (evidence, advice...), else the primary's
    others: list[str]
    t: float


def primary(snap: Snapshot, suffix: str = "") -> Primary | None:
    s = snap.latest(KIND_PRIMARY + suffix, "primary")
    if s is None or not s.get("id"):
        return None
    vid = str(s.get("id"))
    detail = snap.latest(KIND_VERDICT + suffix, vid)
    data = dict(s.data)
    if detail is not None and detail.get("active"):
        data.update(detail.data)
    others = names(s.get("others"))
    return Primary(vid, data, others, s.t)


def active_verdicts(snap: Snapshot) -> dict[str, dict]:
    """Active verdicts now (latest ``verdict`` sample per id says active, and is fresh)."""
    out = {}
    for vid, s in snap.latest_of_kind(KIND_VERDICT).items():
        if s.get("active") and snap.now - s.t <= STALE_S:
            out[vid] = s.data
    return out


def notes_of(snap: Snapshot) -> list[tuple[str, str]]:
    """The engine's notes now (the primary sample's "notes": [{"id", "text"}]): causes that hold
    but are not verdicts, because the GPU stays busy regardless (verdicts/causal.py)."""
    s = snap.latest(KIND_PRIMARY, "primary")
    if s is None or (snap.playback is None and snap.now - s.t > STALE_S):
        return []
    notes = s.get("notes")
    out = []
    for n in notes if isinstance(notes, (list, tuple)) else []:
        if isinstance(n, dict) and n.get("text"):
            out.append((fmt.clean(n.get("id") or "?"), fmt.clean(n.get("text"))))
    return out


def pending_sources(snap: Snapshot) -> list[str]:
    """Sources that run (health ok/degraded) but whose data has not arrived yet."""
    out = []
    for name, h in sorted(snap.health().items()):
        kinds = SOURCE_KINDS.get(name)
        if kinds and h.get("state") in ("ok", "degraded") and not any(k in snap.kinds for k in kinds):
            out.append(name)
    return out


def headline(vid: str, data: dict, width: int, max_lines: int = 3) -> list[Text]:
    """The verdict in one line when it fits ("● WARNING id — title (summary)"), else the title
    and then the summary, each wrapped (two lines at most for the title, ``max_lines`` in all)
    rather than cut: at 80 columns a cut title or summary loses the words that matter."""
    sev = data.get("severity")
    head = Text()
    head.append("● ", style=severity_style(sev))
    head.append(severity_word(sev), style=severity_style(sev))
    head.append(" ")
    head.append(fmt.clean(vid), style="bold")
    title = data.get("title")
    if title:
        head.append(" — " + fmt.clean(title))
    summary = fmt.clean(data.get("summary") or "")
    if summary and head.cell_len + len(summary) + 3 <= width:
        head.append(f" ({summary})")
        return [head]
    lines = fmt.wrap(head, width, min(2, max_lines), indent=2)
    room = max_lines - len(lines)
    if summary and room > 0:
        lines += fmt.wrap("  " + summary, width, room, indent=2)
    return lines


def verdict_facts(vid: str, data: dict, now: float, run: "PrimaryRun | None" = None) -> list[str]:
    """"for 27 s", "fixing this: up to +25% steps/s", "confidence 90%", "costs ~97% of step time",
    "missing: probe". With ``run`` (the primary's) "for" is how long it has been the primary,
    else how long the verdict has been on."""
    out = []
    if run is not None:
        out.append(held_for(now - run.start, run.at_least))
    else:
        since = fmt.to_float(data.get("since"))
        if since is not None:
            out.append(held_for(now - since))
    gain = fmt.to_float(data.get("gain"))
    if gain is not None and gain > 0:
        out.append(gain_text(gain))
    conf = fmt.to_float(data.get("confidence"))
    if conf is not None:
        out.append(f"confidence {conf * 100:.0f}%")
    lost = fmt.to_float(data.get("lost_share"))
    if lost is not None and lost > 0:
        out.append(f"costs ~{lost * 100:.0f}% of step time")
    missing = names(data.get("missing"))
    if missing:
        out.append("missing: " + ", ".join(missing))
    return out


COLLECTING = ("collecting evidence", "no samples yet")  # the engine's "why" before it can judge


def no_verdict_lines(snap: Snapshot, width: int, max_lines: int = 2) -> list[Text]:
    """What the strip says while there is no primary verdict: the engine failed; it is still
    collecting evidence (and which sources have not reported); else the engine's reason (the
    primary sample's "why": warming up, start-up, no rule holds and where the time went), and
    which verdict was the primary until when (the timeline's latest "off")."""
    h = snap.health().get("verdicts")
    if h is not None and h.get("state") == "failed":
        t = Text()
        t.append("verdicts failed", style=STYLE_BAD)
        if h.get("message"):
            t.append(": " + fmt.clean(h.get("message")))
        return [fmt.fit(t, width)]
    seen_any = any(s.get("active") for s in snap.latest_of_kind(KIND_VERDICT).values())
    sample = snap.latest(KIND_PRIMARY, "primary")
    why = fmt.clean(sample.get("why")) if sample is not None and isinstance(sample.get("why"), str) else ""
    t = Text()
    if not why.startswith("no GPU counters") and (
            KIND_PRIMARY not in snap.kinds or why in COLLECTING or why.startswith("waiting for")
            or (not why and not seen_any)):
        t.append("○ collecting evidence…", style="bold")
        pending = pending_sources(snap)
        if why.startswith("waiting for"):
            t.append(" " + why)
        elif pending:
            t.append(" waiting for " + ", ".join(pending))
        elif KIND_PRIMARY not in snap.kinds:
            t.append(" the verdict engine has not run yet")
        else:
            t.append(f" no rule has held for {ENTER_S:g} s yet")
    elif why:
        t.append("○ no verdict now: ", style="bold")
        t.append(why)
    else:  # a file from a gputop whose engine gave no reason
        t.append("○ no verdict holds now", style="bold")
    last = session_verdicts(snap).last_off(snap)
    if last is not None:
        t.append(f" ({fmt.clean(last.id)} was the primary until {fmt.duration(last.t)})", style=STYLE_DIM)
    if origin(snap) == "recorded":
        t.append("  (recorded verdicts)", style=STYLE_DIM)
    return fmt.wrap(t, width, max_lines, indent=2)


def no_verdict_text(snap: Snapshot, width: int) -> Text:
    return Text("\n").join(no_verdict_lines(snap, width))


# -- jumping in a replay --------------------------------------------------------------------------

def jump_to(playback, t: float) -> None:
    """Put the replay at ``t`` (paused) with the verdicts as they were when played up to it.

    A seek back resets the replay's processors, and a verdict needs ``ENTER_S`` of agreement
    before it shows: seeking straight to the moment a verdict turned on would show nothing
    there. So the replay seeks ``JUMP_LEAD_S`` earlier (past the engine's enter and leave
    hysteresis) and plays forward to ``t`` at once, which evaluates the same windows as a
    replay from the start (tests/test_ui_verdicts.py checks it on every H200 recording)."""
    if playback.playing:
        playback.toggle()
    t = min(max(t, playback.t_start), playback.t_end)
    play_to = getattr(playback, "play_to", None)
    if play_to is None:
        playback.seek(t)
        return
    playback.seek(max(playback.t_start, t - JUMP_LEAD_S))
    play_to(t)


# -- verdict changes (the timeline, verdict_timeline.py, lists them; ``j`` looks them up) ----------

@dataclass(frozen=True)
class Change:
    t: float                  # when the verdict turned on or off (session seconds)
    id: str
    active: bool
    title: str
    severity: str | None
    since: float | None       # when its rule first held (the engine's "since")
    primary: bool = False     # a change of the primary verdict: ``id`` became it (active), or it
                              # stopped being it with none after (not active: ``why`` says why)
    why: str = ""
    before: str | None = None  # the primary it replaced


def change_of(s) -> Change:
    since = fmt.to_float(s.get("since"))
    return Change(s.t, str(s.key), bool(s.get("active")), fmt.clean(s.get("title") or s.key),
                  s.get("severity"), since)


def store_changes(snap: Snapshot, kind: str) -> list[Change]:
    got = snap.store.window(kind, -math.inf)
    return sorted((change_of(s) for ss in got.values() for s in ss), key=lambda c: (c.t, c.id))


def _primary_id(s) -> str | None:
    vid = s.get("id")
    return fmt.clean(vid) if isinstance(vid, str) and vid else None


class PrimaryChanges:
    """The changes of the primary verdict in a series of ``verdict_primary`` samples, fed in time
    order: one when a verdict becomes the primary, one when the primary goes with none after."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.current: str | None = None

    def add(self, s) -> None:
        vid = _primary_id(s)
        if vid == self.current:
            return
        if vid is not None:
            self.changes.append(Change(s.t, vid, True, fmt.clean(s.get("title") or vid), s.get("severity"),
                                       fmt.to_float(s.get("since")), primary=True, before=self.current))
        else:
            was = next((c for c in reversed(self.changes) if c.active), None)
            self.changes.append(Change(s.t, self.current or "", False, was.title if was else "",
                                       was.severity if was else None, None, primary=True,
                                       why=fmt.clean(s.get("why") or "")))
        self.current = vid


def primary_changes(samples) -> list[Change]:
    pc = PrimaryChanges()
    for s in samples:
        pc.add(s)
    return pc.changes


RESTART_SLACK_S = 2.5  # a replay whose verdicts (re)started this soon after the file's start saw all of it


@dataclass(frozen=True)
class PrimaryRun:
    id: str
    start: float        # since when it has been the primary
    at_least: bool      # it may have been the primary before (a replay's verdicts restart at a seek)


@dataclass
class SessionVerdicts:
    """What the verdict panels know of a session beyond the store's 300 s: the primary's changes
    and the verdicts' changes since the session's engine (re)started, followed from the store at
    every draw (``follow``; a replay's seek restarts its store and engine, and this with them);
    in a replay also the whole file's (``whole``, the timeline's pass, once it has read it)."""

    primary: PrimaryChanges = field(default_factory=PrimaryChanges)
    changes: list[Change] = field(default_factory=list)
    whole: Any = None              # verdict_timeline.WholeFileTimeline of this file
    restarted_at: float | None = None   # the first primary sample followed since the (re)start
    _last: Any = None              # the newest primary sample followed
    _changes_to: float = -math.inf

    def follow(self, snap: Snapshot) -> None:
        last = self._last
        store = snap.store
        seq = store.series(KIND_PRIMARY, "primary", last.t if last is not None else None)
        if last is not None:
            if seq and seq[0] is last:
                seq = seq[1:]
            else:  # what was followed is gone: the store restarted (a replay's seek)
                self.primary, self.changes, self._changes_to, self._last = PrimaryChanges(), [], -math.inf, None
                self.restarted_at = None
                seq = store.series(KIND_PRIMARY, "primary")
        for s in seq:
            if self.restarted_at is None:
                self.restarted_at = s.t
            self.primary.add(s)
        if seq:
            self._last = seq[-1]
        got = store.window(KIND_CHANGE, self._changes_to)
        new = sorted((change_of(s) for ss in got.values() for s in ss if s.t > self._changes_to),
                     key=lambda c: (c.t, c.id))
        if new:
            self.changes.extend(new)
            self._changes_to = new[-1].t

    def whole_primary(self) -> list[Change] | None:
        tl = self.whole
        return getattr(tl, "primary", None) if tl is not None and not getattr(tl, "error", None) else None

    def run(self, snap: Snapshot, vid: str) -> PrimaryRun | None:
        """Since when ``vid`` has been the primary: the whole file's run when the timeline's pass
        read it and agrees, else this engine's (at least that long when it is the first run
        since a replay's verdicts restarted mid-file)."""
        self.follow(snap)
        whole = self.whole_primary()
        if whole:
            before = [c for c in whole if c.t <= snap.now + 1e-6]
            if before and before[-1].active and before[-1].id == vid:
                return PrimaryRun(vid, before[-1].t, False)
        ons = [c for c in self.primary.changes if c.active]
        if not ons or ons[-1].id != vid or self.primary.current != vid:
            return None
        pb = snap.playback
        restarted_mid = (pb is not None and self.restarted_at is not None
                         and self.restarted_at > pb.t_start + RESTART_SLACK_S)
        return PrimaryRun(vid, ons[-1].t, self.primary.changes[0] is ons[-1] and restarted_mid)

    def last_off(self, snap: Snapshot) -> Change | None:
        """The primary's latest change, if it was its end (no primary since)."""
        self.follow(snap)
        whole = self.whole_primary()
        if whole:
            before = [c for c in whole if c.t <= snap.now + 1e-6]
            if before:
                return before[-1] if not before[-1].active and before[-1].id else None
        ch = self.primary.changes
        return ch[-1] if ch and not ch[-1].active and ch[-1].id else None


_SESSIONS: "weakref.WeakKeyDictionary[Any, SessionVerdicts]" = weakref.WeakKeyDictionary()


def session_verdicts(snap: Snapshot) -> SessionVerdicts:
    """The SessionVerdicts of the snapshot's session (one per session, kept while it lives)."""
    key = snap.session
    try:
        got = _SESSIONS.get(key)
        if got is None:
            got = _SESSIONS[key] = SessionVerdicts()
    except TypeError:  # a session that cannot be weakly referenced: remember nothing between draws
        got = SessionVerdicts()
    return got


# -- the panels -------------------------------------------------------------------------------------

def jump_to_primary(app, snap: Snapshot | None) -> None:
    """``j`` in every view: in a replay, jump to where the primary verdict became the primary
    (where the strip's "for N s" counts from); live, say in a line that jumping needs a replay;
    never nothing."""
    if snap is None:
        return
    if snap.playback is None:
        app.notify("j jumps in a replay only: a live session cannot go back", severity="warning")
        return
    p = primary(snap)
    run = session_verdicts(snap).run(snap, p.id) if p is not None else None
    if run is None:
        app.notify(f"no primary verdict at {fmt.duration(snap.now)} yet: play on, or pick a change in the "
                   "Verdicts view's timeline", severity="warning")
        return
    jump_to(snap.playback, run.start)
    app.redraw_now()
    if run.at_least:
        app.notify(f"{p.id}: the primary from {fmt.duration(run.start)} at least (a seek restarts the verdicts; "
                   "the Verdicts view reads the whole file)")


register_app_action("jump_primary", jump_to_primary)


@register_panel
class VerdictStrip(TextPanel):
    """The overview's top: what is wrong now, in two or three lines."""

    VIEW = "overview"
    ORDER = 0
    NEEDS = ()
    TITLE = "Verdict"

    def shown(self, snap: Snapshot) -> bool:
        return has_verdicts(snap)

    def follow(self, snap: Snapshot) -> None:
        # every draw, in every view: a live primary's run may outlast the store's 300 s
        if has_verdicts(snap):
            session_verdicts(snap).follow(snap)

    def draw(self, snap: Snapshot, width: int) -> Text:
        p = primary(snap)
        if p is None:
            self.border_title = self.TITLE
            return no_verdict_text(snap, width)
        # how long it has been the primary (without a run followed, e.g. a damaged file: how long it held)
        facts = verdict_facts(p.id, p.data, snap.now, session_verdicts(snap).run(snap, p.id))[:3]
        stale = snap.playback is None and snap.now - p.t > STALE_S
        if stale:
            facts.insert(1, "STALE")
        if p.others:
            facts.append("also " + ", ".join(p.others))
        if origin(snap) == "recorded":
            facts.append("recorded")
        # the border line carries the facts, so the verdict keeps its lines; a fact that does not
        # fit is left out whole (a cut "fixing this: up to +2…" reads wrong)
        room = max(10, width - 4)
        title = self.TITLE
        for i, fact in enumerate(facts):
            if len(title) + 3 + len(fact) <= room:
                title += " · " + fact
            elif i == 0:
                title = fmt.clip(title + " · " + fact, room)
        self.border_title = title
        lines = headline(p.id, p.data, width)
        advice = p.data.get("advice")
        if advice:
            # the most useful line: it gets a second line before anything of it is cut
            a = Text()
            a.append("  → ", style=STYLE_LABEL)
            a.append(fmt.clean(advice))
            lines += fmt.wrap(a, width, ADVICE_LINES, indent=4)
        return Text("\n").join(lines)


def _value(v) -> str:
    if v is None:
        return fmt.NA
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        f = float(v)
        if not math.isfinite(f):
            return fmt.NA
        if f.is_integer():
            return f"{int(f)}"
        return f"{f:.0f}" if abs(f) >= 100 else f"{f:.1f}" if abs(f) >= 1 else f"{f:.2f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_value(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{fmt.clean(k)}: {_value(x)}" for k, x in v.items())
    return fmt.clean(v)


UNIT_SUFFIXES = (("_pct", "%"), ("_mib_s", " MiB/s"), ("_ms", " ms"), ("_per_s", "/s"), ("_w", " W"))


def evidence_rows(evidence) -> list[tuple[str, str]]:
    """(name, value) of a verdict's evidence: "data_wait_share_pct": 96.64 -> ("data wait share",
    "96.6%"); None -> "n/a" (a missing number is never drawn as 0)."""
    rows = []
    if not isinstance(evidence, dict):
        return rows
    for k, v in evidence.items():
        name, unit = str(k), ""
        for suffix, u in UNIT_SUFFIXES:  # also inside the name: worker_cpu_pct_mean -> worker cpu mean, %
            if name.endswith(suffix) or suffix + "_" in name:
                name, unit = name.replace(suffix, "", 1), u
                break
        value = _value(v)
        rows.append((fmt.clean(name.replace("_", " ")), value + unit if value != fmt.NA else value))
    return rows


def evidence_table(rows: list[tuple[str, str]], width: int) -> Text:
    """Rows of "name  value", in two columns when they fit."""
    out = Text()
    if not rows:
        return out
    name_w = min(24, max(len(n) for n, _ in rows))
    val_w = min(24, max(len(v) for _, v in rows))
    two = len(rows) > 2 and 2 * (2 + name_w + 1 + val_w) <= width
    per_col = math.ceil(len(rows) / 2) if two else len(rows)
    for r in range(per_col):
        if r:
            out.append("\n")
        cells = [rows[r], rows[r + per_col]] if two and r + per_col < len(rows) else [rows[r]]
        for c, (name, value) in enumerate(cells):
            out.append("  " + fmt.clip(name, name_w).ljust(name_w) + " ", style=STYLE_LABEL)
            if two and c == 0:
                out.append(fmt.clip(value, val_w).ljust(val_w))
            else:
                out.append(fmt.clip(value, max(4, width - (2 + name_w + 1) * (c + 1) - val_w * c)))
    return out


def wrapped(text: str, width: int, indent: int = 2) -> Text:
    """Words wrapped to ``width`` with an indent (Rich wraps too, but without the indent)."""
    words = fmt.clean(text).split()
    lines, line = [], ""
    room = max(10, width - indent)
    for w in words:
        if line and len(line) + 1 + len(w) > room:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    if line:
        lines.append(line)
    return Text("\n".join(" " * indent + fmt.clip(x, room) for x in lines))


@register_panel
class VerdictDetail(TextPanel):
    """The Verdicts view's top: the primary verdict in full, then the other active ones."""

    VIEW = "verdicts"
    ORDER = 10
    NEEDS = ()
    TITLE = "Primary verdict"

    def draw(self, snap: Snapshot, width: int) -> Text:
        width -= 1  # the view scrolls: keep the scroll bar's column free, or lines would wrap when it appears
        if not has_verdicts(snap):
            return Text("This session computes no verdicts (no verdict engine runs, and the recording holds "
                        "none). A replay with gputop replay recomputes them.", style=STYLE_DIM)
        p = primary(snap)
        out = Text()
        if p is None:
            out.append_text(no_verdict_text(snap, width))
        else:
            out.append_text(Text("\n").join(headline(p.id, p.data, width, max_lines=5)))
            run = session_verdicts(snap).run(snap, p.id)
            facts = verdict_facts(p.id, p.data, snap.now, run)
            if run is not None:  # how long it has been the primary (the strip's), then since when it holds
                before = " or before" if run.at_least else ""
                facts[0] = f"the primary {facts[0]} (from {fmt.duration(run.start)}{before})"
            since = fmt.to_float(p.data.get("since"))
            if since is not None:
                facts.insert(1, f"on since {fmt.duration(since)}")
            if not names(p.data.get("missing")):
                facts.append("all its sources reported")
            out.append("\n")
            out.append_text(wrapped(" · ".join(facts), width))
            evidence = p.data.get("evidence")
            if isinstance(evidence, dict) and fmt.to_float(p.data.get("gain")):
                evidence = {k: v for k, v in evidence.items() if k != "fix_gain_pct"}  # the facts say it
            rows = evidence_rows(evidence)
            if rows:
                out.append("\nEvidence\n", style=STYLE_LABEL)
                out.append_text(evidence_table(rows, width))
            if p.data.get("advice"):
                out.append("\nAdvice\n", style=STYLE_LABEL)
                out.append_text(wrapped(p.data.get("advice"), width))
        others = {v: d for v, d in active_verdicts(snap).items() if p is None or v != p.id}
        if others:
            out.append("\nAlso active", style=STYLE_LABEL)
            for vid, d in sorted(others.items(), key=lambda kv: -(fmt.to_float(kv[1].get("lost_share")) or 0)):
                out.append("\n")
                line = Text()
                line.append("● " + severity_word(d.get("severity")), style=severity_style(d.get("severity")))
                line.append(f" {fmt.clean(vid)}", style="bold")
                line.append(" — " + fmt.clean(d.get("summary") or d.get("title") or ""))
                extra = verdict_facts(vid, d, snap.now)[:1]
                if extra:
                    line.append(" · " + extra[0], style=STYLE_DIM)
                line.truncate(width, overflow="ellipsis")
                out.append_text(line)
        notes = notes_of(snap)
        if notes:
            out.append("\nNotes: causes that hold but cost no GPU time now", style=STYLE_LABEL)
            for vid, text in notes:
                out.append("\n")
                out.append_text(Text("\n").join(fmt.wrap(Text.assemble(("  " + vid, "bold"), " — " + text),
                                                          width, 3, indent=4)))
        # the recorded verdicts are kept: say what the live session concluded at this moment
        rec = snap.latest(snap.recorded_kind(KIND_PRIMARY), "primary") if origin(snap) == "recomputed" else None
        if rec is not None and snap.now - rec.t <= STALE_S:
            rid = fmt.clean(rec.get("id")) if rec.get("id") else None
            same = rid == (fmt.clean(p.id) if p is not None else None)
            out.append(f"\nRecorded by the live session at this moment: {rid or 'no verdict'}"
                       + (" (the same)" if same else " (recomputed with this gputop's rules: above)"), style=STYLE_DIM)
        return out
