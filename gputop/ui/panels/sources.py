"""Sources: the health of every source, what is n/a and why, and facts about the session."""

from __future__ import annotations

import textwrap
import time

from rich.text import Text

from gputop.sources.calm import CALM_NOTE
from gputop.ui import fmt
from gputop.ui.panels import LOAD_PROBLEMS, TextPanel, register_panel, register_view
from gputop.ui.panels.overview import STYLE_BAD, STYLE_LABEL, STYLE_WARN
from gputop.ui.snapshot import Snapshot, key_order

register_view("sources", "Sources", order=90, short="Src")

HEALTH_STYLE = {"ok": "green", "degraded": STYLE_WARN, "failed": STYLE_BAD, "off": "dim"}


@register_panel
class SourceHealth(TextPanel):
    VIEW = "sources"
    ORDER = 10
    NEEDS = ()
    TITLE = "Source health"

    def draw(self, snap: Snapshot, width: int) -> Text:
        health = snap.health()
        t = Text()
        if not health:
            t.append("no source has reported yet", style=STYLE_WARN)
        for i, name in enumerate(sorted(health)):
            s = health[name]
            state = fmt.clean(s.get("state") or "?")
            rate = s.get("rate_hz")
            if i:
                t.append("\n")
            t.append(f"{fmt.clip(name, 9):<10}", style=STYLE_LABEL)
            t.append(f"{state:<9}", style=HEALTH_STYLE.get(state, ""))
            t.append(f"{(fmt.num(rate, ' Hz', 1) if rate is not None else ''):>8}  ")
            # the whole message, wrapped under itself: these lines say what to do
            message = s.get("message") or ""
            if s.get("calm") is True:   # gputop/sources/calm.py: why the rate is a quarter of the usual
                message = (message + "; " if message else "") + CALM_NOTE
            lines = textwrap.wrap(fmt.clean(message), max(10, width - 29),
                                  break_on_hyphens=False) or [""]
            t.append(("\n" + " " * 29).join(lines))
        # Values a source cannot measure here, with its reason.
        na_lines = []
        for key in sorted(snap.latest_of_kind("gpu_info"), key=key_order):
            for field, reason in sorted(snap.gpu_na(key).items()):
                na_lines.append(fmt.clean(f"GPU{key} {field}: n/a: {reason}"))
        if na_lines:
            t.append("\n\n")
            t.append("Not available on this machine", style=STYLE_LABEL)
            for line in na_lines:
                t.append("\n  " + fmt.clip(line, width - 2))
        for problem in LOAD_PROBLEMS:
            t.append("\n")
            t.append(fmt.clip(problem, width), style=STYLE_BAD)
        return t


@register_panel
class SessionFacts(TextPanel):
    VIEW = "sources"
    ORDER = 20
    NEEDS = ()
    TITLE = "Session"

    def draw(self, snap: Snapshot, width: int) -> Text:
        meta = snap.meta
        target = snap.target
        facts: list[tuple[str, str]] = []
        if target:
            cmd = target.get("cmdline")
            cmd = " ".join(cmd) if isinstance(cmd, list) else str(cmd or target.get("name") or "")
            facts.append(("target", f"PID {target.get('pid')}  {cmd}"))
            if target.get("user"):
                facts.append(("user", str(target.get("user"))))
        facts.append(("host", str(meta.get("host") or "n/a")))
        start = meta.get("start_wall")
        if isinstance(start, (int, float)):
            facts.append(("started", time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(start))))
        facts.append(("gputop", str(meta.get("gputop_version") or "n/a")))
        if snap.playback is not None:
            facts.append(("replaying", str(snap.replay_path or "a recording")))
        elif snap.recording_path:
            facts.append(("recording to", str(snap.recording_path)))
        else:
            facts.append(("recording", "off"))
        if snap.recording_error:
            facts.append(("recording error", str(snap.recording_error)))
        if snap.job_log is not None:
            facts.append(("job output", f"{snap.job_log.path} (the Output view: tab)"))
        t = Text()
        for i, (k, v) in enumerate(facts):
            if i:
                t.append("\n")
            t.append(f"{k:<16}", style=STYLE_LABEL)
            lines = textwrap.wrap(fmt.clean(v), max(10, width - 16), break_on_hyphens=False) or [""]
            if len(lines) > 4:
                lines = lines[:3] + [fmt.clip(" ".join(lines[3:]), max(10, width - 16))]
            t.append(("\n" + " " * 16).join(lines), style=STYLE_BAD if k == "recording error" else "")
        return t
