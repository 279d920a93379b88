"""Output: the last lines the job printed (``gputop run`` / ``gputop demo`` with the UI write
its stdout and stderr to a log, gputop/ui/joblog.py). The view exists only when there is such
a log; the number keys are all taken, so it is reached with tab."""

from __future__ import annotations

from rich.text import Text

from gputop.ui import fmt
from gputop.ui.joblog import MAX_LINES
from gputop.ui.panels import TextPanel, register_panel, register_view
from gputop.ui.snapshot import Snapshot

register_view("output", "Output", order=95, only_if=lambda app: getattr(app, "job_log", None) is not None,
              short="Out")


@register_panel
class JobOutput(TextPanel):
    VIEW = "output"
    ORDER = 10
    NEEDS = ()
    TITLE = f"The job's output (last {MAX_LINES} lines)"

    def draw(self, snap: Snapshot, width: int) -> Text:
        log = snap.job_log
        if log is None:
            return Text("this session did not start the job: its output is not here", style="dim")
        lines = log.lines()
        t = Text()
        t.append("log ", style="bold")
        t.append(fmt.clip(log.path, max(10, width - 5)))
        if log.error:
            t.append("\n" + fmt.clip(log.error, width), style="bold red")
        if not lines:
            t.append("\nnothing printed yet", style="dim")
        for line in lines:
            t.append("\n")
            t.append(line)  # already cleaned (joblog.clean_line); long lines wrap
        return t

    def update_view(self, snap: Snapshot) -> None:
        super().update_view(snap)
        # follow the end, as tail -f does, unless the user scrolled up
        view = self.parent
        if view is not None and view.scroll_y >= view.max_scroll_y - 1:
            self.call_after_refresh(view.scroll_end, animate=False)
