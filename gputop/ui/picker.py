"""`gputop` with no arguments, in a terminal: a list of processes to watch (as nvitop and nvtop
show the GPU's processes first). Enter picks one (the CLI then attaches as `gputop --pid PID`),
r refreshes, q quits. The list comes from ``gputop.sources.candidates``."""

from __future__ import annotations

from typing import Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from gputop.sources.candidates import Candidates, describe, find_candidates

TITLE = "gputop: pick a process to watch (Enter), r refresh, q quit"


def _header_text(found: Candidates) -> str:
    lines = [TITLE]
    if found.gpu_note:
        lines.append(found.gpu_note)
    if not found.items:
        lines.append("no GPU or Python processes found: start your job, then r; or gputop run -- python train.py")
    return "\n".join(lines)


class PickerApp(App):
    """Exits with the chosen PID, or None when the user quits."""

    BINDINGS = [
        Binding("q", "quit_picker", "quit"),
        Binding("escape", "quit_picker", "quit", show=False),
        Binding("r", "refresh_list", "refresh"),
    ]
    CSS = "#picker-head { height: auto; padding: 0 1; } DataTable { height: 1fr; }"

    def __init__(self, finder: Callable[[], Candidates] = find_candidates, **kw) -> None:
        super().__init__(**kw)
        self._finder = finder

    def compose(self) -> ComposeResult:
        yield Static(TITLE, id="picker-head")
        yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("PID", "what", "user", "command")
        self.action_refresh_list()
        table.focus()

    def action_refresh_list(self) -> None:
        found = self._finder()
        self.query_one("#picker-head", Static).update(_header_text(found))
        table = self.query_one(DataTable)
        table.clear()
        for c in found.items:
            table.add_row(str(c.pid), describe(c), c.user, c.command, key=str(c.pid))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.exit(int(event.row_key.value))

    def action_quit_picker(self) -> None:
        self.exit(None)


def pick_process() -> int | None:
    """Run the picker in this terminal; the PID chosen, or None."""
    return PickerApp().run()
