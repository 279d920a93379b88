"""The time budget in the UI: one line on the overview and the Time view.

- Overview, ORDER 10 (just below the verdict strip): where the loop's wall time went in the
  current window, largest share first ("GPU 58% · blocked 35% (push_metrics real_loops.py:280)
  · CPU 5% · phase training"), shares under 1% left out, and the start-up's parts while the job
  starts. It fits any width by dropping its tail.
- The "Time" view: the window's budget per category (label, share, bar), its stalls, the top
  frames of the CPU, I/O and blocked time with their owners, the probe's split of a step, the
  phase and the start-up, and the session's budget per phase (training first).

Where the numbers come from: ``budget`` samples ("window" every second, "session" every 5 s)
and ``phase``/"main", made by gputop/derive/budget_processor.py (recomputed on replay). The
category labels and their meanings are gputop.derive.budget's LABELS and HELP; the phase names
gputop.derive.phases'. This module adds only the short names the one-line strip needs.
"""

from __future__ import annotations

import re

from rich.text import Text

from gputop.catalogue import KIND_BUDGET, KIND_PHASE, SOURCE_STACKS
from gputop.derive import budget as bd
from gputop.derive import phases as ph
from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_help_section, register_panel, register_view
from gputop.ui.snapshot import Snapshot
from gputop.verdicts.budget_rules import _stall_text

register_view("time", "Time", order=85, short="Time")   # after Ranks, before Sources (which stays last)

STYLE_LABEL, STYLE_DIM, STYLE_BAD = "bold", "dim", "bold red"
STALE_S = 5.0          # the processor publishes the window budget every second (every 2 s while calm)
MIN_SHARE = 0.01       # the strip leaves out shares under 1%
FRAME_MIN_SHARE = 0.001  # the Time view lists frames from 0.1% of the budget
TOP_FRAMES = 5
FRAME_CATEGORIES = (bd.CPU, bd.IO, bd.BLOCKED)

# The one-line strip's names of the categories (the Time view and the help use budget.LABELS).
SHORT = {bd.GPU_BUSY: "GPU", bd.DATA: "data", bd.SYNC: "sync", bd.GIL: "GIL", bd.COLLECTIVE: "collective",
         bd.CPU_WAIT: "CPU wait", bd.IO: "I/O", bd.BLOCKED: "blocked", bd.CPU: "CPU", bd.UNKNOWN: "unknown"}
# One look per category (a colour only repeats the label next to it).
STYLE = {bd.GPU_BUSY: "green", bd.DATA: "magenta", bd.SYNC: "yellow", bd.GIL: "red", bd.COLLECTIVE: "cyan",
         bd.CPU_WAIT: "red", bd.IO: "blue", bd.BLOCKED: "bright_black", bd.CPU: "bright_yellow",
         bd.UNKNOWN: "white"}
GPU_SOURCE_WORDS = {"gpm": "GPM SM active", "util.gpu": "util.gpu (counts any kernel running)"}

register_help_section("Time budget (overview line \"Time budget\" and the Time view)", [
    *[(f"{SHORT[c]}", f"{bd.LABELS[c]}: {bd.HELP[c]}") for c in bd.CATEGORIES],
    ("stops … every …", "the GPU stalls again and again for the same cause (a periodic stall)"),
    ("per step (probe)", "the in-process probe's split of each step: data wait, GPU time, host time"),
])


# -- formatting (the tests read these, so what they check is what is shown) ----------------------

def share_pct(v, digits: int = 0) -> str:
    """A 0-1 share as a percentage ("35%"; None: "n/a")."""
    f = fmt.to_float(v)
    return fmt.NA if f is None else f"{f * 100:.{digits}f}%"


_FRAME = re.compile(r"^(.*) \(([^()]*)\)$")


def frame_short(frame) -> str:
    """"push_metrics (real_loops.py:280)" -> "push_metrics real_loops.py:280" (to go in brackets)."""
    text = fmt.clean(frame)
    m = _FRAME.match(text)
    return f"{m.group(1)} {m.group(2)}" if m else text


def ordered_shares(data: dict, min_share: float = MIN_SHARE) -> list[tuple[str, float]]:
    """(category, share) of a budget's JSON form, largest first, those under ``min_share`` left out."""
    shares = data.get("shares") if isinstance(data.get("shares"), dict) else {}
    got = [(c, float(v)) for c in bd.CATEGORIES
           if isinstance((v := shares.get(c)), (int, float)) and not isinstance(v, bool) and v >= min_share]
    return sorted(got, key=lambda cv: -cv[1])


def top_frames(data: dict, cat: str, n: int = TOP_FRAMES, min_share: float = FRAME_MIN_SHARE) -> list[list]:
    frames = (data.get("frames") or {}).get(cat) if isinstance(data.get("frames"), dict) else None
    out = []
    for f in frames or []:
        if isinstance(f, (list, tuple)) and len(f) >= 2 and isinstance(f[1], (int, float)) and f[1] >= min_share:
            out.append([f[0], f[1], f[2] if len(f) >= 3 else ""])
    return out[:n]


def share_parts(data: dict, frame: str = "full") -> list[Text]:
    """One Text per share, largest first: "GPU 58%", "blocked 35% (push_metrics real_loops.py:280)",
    ...; the first lost category (the largest) names its top frame: ``frame`` "full", "name"
    (the function only) or "none"."""
    parts = []
    named = False
    for c, v in ordered_shares(data):
        t = Text()
        t.append(SHORT[c], style=STYLE_LABEL)
        t.append(f" {share_pct(v)}")
        if frame != "none" and not named and c in bd.LOST:
            named = True
            frames = top_frames(data, c, 1)
            if frames:
                where = frame_short(frames[0][0])
                t.append(f" ({where if frame == 'full' else where.split(' ', 1)[0]})")
        parts.append(t)
    return parts


def join(parts: list[Text]) -> Text:
    t = Text()
    for i, p in enumerate(parts):
        if i:
            t.append(" · ", style=STYLE_DIM)
        t.append_text(p)
    return t


def shares_line(data: dict, width: int | None = None, tail: list[Text] | None = None) -> Text:
    """"GPU 58% · blocked 35% (push_metrics real_loops.py:280) · CPU 5%", then ``tail``. Too
    wide for ``width``: the smallest shares go (down to three), then the frame loses its file
    and line, then shares go down to two (the tail stays), then the end is cut."""
    tail = tail or []
    full = share_parts(data) or [Text("no time measured yet", style=STYLE_DIM)]
    line = join(full + tail)
    if width is None or line.cell_len <= width:
        return line
    for parts, keep in ((full, 3), (share_parts(data, "name") or full, 2)):
        while True:
            line = join(parts + tail)
            if line.cell_len <= width or len(parts) <= keep:
                break
            parts = parts[:-1]
        if line.cell_len <= width:
            return line
    line.truncate(width, overflow="ellipsis")
    return line


def stall_line(stalls) -> str | None:
    """"stops 1.5 s every 3.3 s in push_metrics (real_loops.py:280) — blocked (sleep, locks,
    network), 29% of the window", or None without stalls."""
    if not isinstance(stalls, dict) or not stalls.get("count"):
        return None
    cause = stalls.get("cause") if isinstance(stalls.get("cause"), str) else None
    numbers = all(isinstance(stalls.get(k), (int, float)) for k in ("count", "duration_s"))
    if numbers and stalls.get("periodic") and not isinstance(stalls.get("period_s"), (int, float)):
        numbers = False
    # the verdicts' own words for it
    text = _stall_text({"stalls": stalls}, cause)[0] if numbers and cause else ""
    if not text and stalls.get("continuous") and stalls["count"] >= 2:
        # idle nearly all the time sampled, cut only by py-spy's restarts: one state, which the
        # verdicts name no stall length for (not "one stall of" a piece of it)
        text = "GPU idle throughout, not in separate stalls"
    elif not text:
        where = f" in {fmt.clean(stalls['frame'])}" if stalls.get("frame") else ""
        text = f"one stall of {fmt.num(stalls.get('duration_s'), ' s', 1)}{where}"
    extra = [bd.LABELS.get(cause, fmt.clean(cause))] if cause else []
    if isinstance(stalls.get("share"), (int, float)):
        extra.append(f"{share_pct(stalls['share'])} of the window")
    return text + (" — " + ", ".join(extra) if extra else "")


def phase_words(phase: str | None) -> str:
    if not phase:
        return fmt.NA
    return ph.LABELS.get(phase, fmt.clean(phase)) if isinstance(phase, str) else fmt.clean(phase)


def bar_cells(share, width: int) -> int:
    """How many of ``width`` cells a share fills: clamped to 0..1 first, so a damaged share
    (negative, or 1e306 from a hostile recording) fills none or all rather than overflowing."""
    f = fmt.to_float(share)
    return 0 if f is None else round(max(0.0, min(1.0, f)) * width)


def bar(share, width: int) -> Text:
    t = Text()
    if fmt.to_float(share) is None:
        return t.append(" " * width)
    cells = bar_cells(share, width)
    t.append("█" * cells)
    t.append("·" * (width - cells), style=STYLE_DIM)
    return t


# -- reading the snapshot ------------------------------------------------------------------------

def _valid(s):
    return s if s is not None and isinstance(s.data, dict) else None


def window_budget(snap: Snapshot):
    return _valid(snap.latest(KIND_BUDGET, "window"))


def session_budget(snap: Snapshot):
    return _valid(snap.latest(KIND_BUDGET, "session"))


def phase_sample(snap: Snapshot):
    return _valid(snap.latest(KIND_PHASE, "main"))


def has_budget(snap: Snapshot) -> bool:
    return KIND_BUDGET in snap.kinds or KIND_PHASE in snap.kinds or snap.computes(KIND_BUDGET)


WITHOUT_STACKS = "without them it comes from the job's GPU samples alone (none yet)"


def waiting_text(snap: Snapshot) -> Text:
    """Why there is no budget yet: waiting for the first stacks, or, when the stack source is off
    or failed (its health: gputop/sources/stacks.py), the reason it gave."""
    return Text(f"time budget: {no_budget_reason(snap)}", style=STYLE_DIM)


def no_budget_reason(snap: Snapshot) -> str:
    h = snap.source_state(SOURCE_STACKS)
    if h is None and isinstance(snap.meta.get("sources"), dict) and snap.meta["sources"]:
        return f"no stack source in this session (--no-stacks); {WITHOUT_STACKS}"
    state = h.get("state") if h is not None else None
    if state in ("off", "failed"):
        message = fmt.clean(h.get("message") or "") or "no reason given"
        if state == "off":
            return f"no stacks: {message}; {WITHOUT_STACKS}"
        return f"no stacks yet, py-spy failed: {message}"
    return "waiting for stacks (it needs a few seconds of py-spy and GPU samples)"


def age_text(snap: Snapshot, sample) -> str:
    age = snap.now - sample.t
    return f" ({age:.0f} s old)" if age > STALE_S else ""


# -- the overview's line -------------------------------------------------------------------------

@register_panel
class TimeBudgetStrip(TextPanel):
    VIEW = "overview"
    ORDER = 10          # right below the verdict strip (ORDER 0), above the GPUs (20)
    NEEDS = (KIND_BUDGET,)
    TITLE = "Time budget"

    def shown(self, snap: Snapshot) -> bool:
        return has_budget(snap)

    def draw(self, snap: Snapshot, width: int) -> Text:
        return strip_text(snap, width)


def strip_text(snap: Snapshot, width: int) -> Text:
    s = window_budget(snap)
    if s is None:
        t = waiting_text(snap)
        t.truncate(width, overflow="ellipsis")
        return t
    d = s.data
    phase = d.get("phase")
    p = phase_sample(snap)
    tail = Text()
    if phase == ph.STARTUP and p is not None and p.get("startup_text"):
        tail.append(fmt.clean(p.get("startup_text")))   # "start-up 14.0 s: importing 6.0 s, ..."
    else:
        tail.append("phase ", style=STYLE_LABEL)
        tail.append(phase_words(phase))
    if snap.now - s.t > STALE_S:
        tail.append(age_text(snap, s), style="yellow")
    return shares_line(d, width, [tail])


# -- the Time view ---------------------------------------------------------------------------------

@register_panel
class TimeBudgetWindow(TextPanel):
    VIEW = "time"
    ORDER = 10
    NEEDS = (KIND_BUDGET,)
    TITLE = "Where the training loop's time went (window budget)"
    LABEL_W = max(len(v) for v in bd.LABELS.values())

    def shown(self, snap: Snapshot) -> bool:
        return has_budget(snap)

    def draw(self, snap: Snapshot, width: int) -> Text:
        s = window_budget(snap)
        if s is None:
            return waiting_text(snap)
        d = s.data
        out = Text()
        out.append("last ", style=STYLE_LABEL)
        out.append(fmt.num(d.get("window_s"), " s", 1))
        out.append(" of ")
        out.append(phase_words(d.get("phase")))
        out.append(" · GPU from ", style=STYLE_DIM)
        src = d.get("gpu_source")
        out.append(GPU_SOURCE_WORDS.get(src, fmt.clean(src)) if isinstance(src, str) and src else "no GPU counters (shares of the main thread's time)")
        out.append(" · from ", style=STYLE_DIM)
        out.append("py-spy stacks" if d.get("from") == "stacks" else "GPU samples only (no stacks)")
        if d.get("pid") is not None:
            out.append(f" · PID {fmt.clean(d.get('pid'))}", style=STYLE_DIM)
        out.append(age_text(snap, s), style="yellow")
        out.truncate(width, overflow="ellipsis")
        shares = d.get("shares") if isinstance(d.get("shares"), dict) else {}
        label_w = min(self.LABEL_W, max(10, width - 30))
        bar_w = max(5, min(40, width - label_w - 8 - 11))
        largest = d.get("largest")
        for c in bd.CATEGORIES:
            v = shares.get(c)
            line = Text()
            line.append(f"{fmt.clip(bd.LABELS[c], label_w):<{label_w}} ", style=STYLE_LABEL if c == largest else "")
            line.append(f"{share_pct(v, 1):>6} ")
            b = bar(v, bar_w)
            b.stylize(STYLE.get(c, ""), 0, bar_cells(v, bar_w))
            line.append_text(b)
            if c == largest:
                line.append(" ← largest", style=STYLE_LABEL)
            line.truncate(width, overflow="ellipsis")
            out.append("\n")
            out.append_text(line)
        stall = stall_line(d.get("stalls"))
        out.append("\n")
        if stall:
            out.append("stalls: ", style=STYLE_LABEL)
            out.append(stall)
        else:
            out.append("stalls: none in this window", style=STYLE_DIM)
        named = fmt.to_float(d.get("blocked_in_calls"))
        if named and (fmt.to_float(shares.get(bd.BLOCKED)) or 0) > 0:
            out.append(f"\nblocked in calls the frames name (sleep, lock, queue, socket): {share_pct(named, 1)}",
                       style=STYLE_DIM)
        return out


@register_panel
class TimeBudgetFrames(TextPanel):
    VIEW = "time"
    ORDER = 20
    NEEDS = (KIND_BUDGET,)
    TITLE = "Top frames of the CPU, I/O and blocked time (share of the window, whose code)"

    def shown(self, snap: Snapshot) -> bool:
        s = window_budget(snap)
        return s is not None and any(top_frames(s.data, c) for c in FRAME_CATEGORIES)

    def draw(self, snap: Snapshot, width: int) -> Text:
        s = window_budget(snap)
        if s is None:
            return waiting_text(snap)
        d = s.data
        out = Text()
        first = True
        for c in FRAME_CATEGORIES:
            frames = top_frames(d, c)
            if not frames:
                continue
            if not first:
                out.append("\n")
            first = False
            shares = d.get("shares") if isinstance(d.get("shares"), dict) else {}
            out.append(f"{bd.LABELS[c]} {share_pct(shares.get(c), 1)}", style=STYLE_LABEL)
            if c == bd.CPU and isinstance(d.get("cpu_owners"), dict) and d["cpu_owners"]:
                owners = ", ".join(f"{fmt.clean(k)} {share_pct(v)}" for k, v in d["cpu_owners"].items())
                out.append(f" · whose code: {owners}", style=STYLE_DIM)
            for f in frames:
                line = Text(f"  {share_pct(f[1], 1):>6}  {fmt.clip(fmt.clean(f[2]), 9):<9} ")
                line.append(fmt.clean(f[0]))
                line.truncate(width, overflow="ellipsis")
                out.append("\n")
                out.append_text(line)
        return out


PROBE_PARTS = (("data_wait_share", "data wait"), ("gpu_share", "GPU"), ("host_share", "host"))


@register_panel
class TimeBudgetProbe(TextPanel):
    VIEW = "time"
    ORDER = 30
    NEEDS = (KIND_BUDGET,)
    TITLE = "Per step (probe)"

    def shown(self, snap: Snapshot) -> bool:
        s = window_budget(snap)
        return s is not None and isinstance(s.data.get("probe"), dict)

    def draw(self, snap: Snapshot, width: int) -> Text:
        s = window_budget(snap)
        p = s.data.get("probe") if s is not None else None
        t = Text()
        if not isinstance(p, dict):
            return t.append("no probe in this window (gputop --probe times each step)", style=STYLE_DIM)
        t.append(fmt.num(p.get("steps_per_s"), " steps/s", 1))
        t.append(" · ")
        t.append(fmt.num(p.get("step_ms"), " ms/step", 1))
        for key, label in PROBE_PARTS:
            t.append(" · ")
            t.append(f"{label} ", style=STYLE_LABEL)
            t.append(share_pct(p.get(key)))
        t.append(" · ")
        t.append(fmt.num(p.get("syncs_per_step"), " syncs/step", 2))
        t.truncate(width, overflow="ellipsis")
        return t


@register_panel
class TimeBudgetPhase(TextPanel):
    VIEW = "time"
    ORDER = 40
    NEEDS = (KIND_PHASE,)
    TITLE = "Phase"

    def draw(self, snap: Snapshot, width: int) -> Text:
        p = phase_sample(snap)
        t = Text()
        if p is None:
            return t.append("no phase yet", style=STYLE_DIM)
        t.append(fmt.clean(p.get("label") or phase_words(p.get("phase"))), style=STYLE_LABEL)
        since = fmt.to_float(p.get("since"))
        if since is not None:
            t.append(f" for {fmt.duration(max(0.0, snap.now - since))}")
        tr = fmt.to_float(p.get("training_since"))
        if p.get("phase") == ph.WARMUP:
            # the verdict strip says "warming up" too: the same words for the same wait
            t.append(f" · verdicts wait for the step time to settle (at most {ph.WARMUP_MAX_S:g} s)", style=STYLE_DIM)
        elif tr is not None and p.get("phase") != ph.TRAINING:
            t.append(f" · judged like training for {fmt.duration(max(0.0, snap.now - tr))}", style=STYLE_DIM)
        t.truncate(width, overflow="ellipsis")
        t.append("\n")
        t.append(fmt.clean(p.get("startup_text")) if p.get("startup_text") else "no start-up seen (attached to a "
                 "running job)", style="" if p.get("startup_text") else STYLE_DIM)
        return t


def session_phases(data: dict) -> list[tuple[str, dict]]:
    """The session budget's phases, training first, then the others in gputop.derive.phases order."""
    phases = data.get("phases") if isinstance(data.get("phases"), dict) else {}
    order = [ph.TRAINING, *[p for p in ph.PHASES if p != ph.TRAINING]]
    known = [(p, phases[p]) for p in order if isinstance(phases.get(p), dict)]
    return known + [(p, v) for p, v in phases.items() if p not in order and isinstance(v, dict)]


@register_panel
class TimeBudgetSession(TextPanel):
    VIEW = "time"
    ORDER = 50
    NEEDS = (KIND_BUDGET,)
    TITLE = "Whole session, per phase"

    def shown(self, snap: Snapshot) -> bool:
        return session_budget(snap) is not None

    def draw(self, snap: Snapshot, width: int) -> Text:
        s = session_budget(snap)
        out = Text()
        if s is None:
            return out.append("no session budget yet (every 5 s)", style=STYLE_DIM)
        name_w = max(len(ph.LABELS[p]) for p in (ph.TRAINING, ph.STARTUP, ph.EVALUATION, ph.CHECKPOINTING))
        for i, (p, d) in enumerate(session_phases(s.data)):
            line = Text()
            line.append(f"{fmt.clip(phase_words(p), name_w):<{name_w}} ", style=STYLE_LABEL)
            line.append(f"{fmt.num(d.get('seconds'), ' s', 1):>8}  ")
            line.append_text(shares_line(d))
            line.truncate(width, overflow="ellipsis")
            if i:
                out.append("\n")
            out.append_text(line)
        return out
