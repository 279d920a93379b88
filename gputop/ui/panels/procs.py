"""Processes: the target's tree with CPU, memory, context switches and I/O; and the host."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable

from gputop.ui import fmt
from gputop.ui.panels import Panel, TextPanel, register_panel, register_view
from gputop.ui.panels.overview import STYLE_LABEL, STYLE_SPARK, STYLE_WARN
from gputop.ui.procview import ProcRow, process_rows, tree_name
from gputop.ui.snapshot import Snapshot

register_view("procs", "Processes", order=30, short="Prc")


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int          # cells, including the one-space gap on its left
    right: bool = True  # numbers right-aligned
    priority: int = 0   # when the terminal is narrow, the highest numbers are left out first


class KeyedTable(Panel):
    """A panel that is one DataTable updated in place: rows are keyed, only changed cells are
    written, and the table is never rebuilt per tick. Columns have fixed widths; those that do
    not fit the terminal's width are left out (by priority), so 80 columns stay readable."""

    COLUMNS: tuple[Column, ...] = ()

    DEFAULT_CSS = """
    KeyedTable DataTable { height: auto; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._cells: dict[str, tuple[str, ...]] = {}
        self._order: list[str] = []
        self._active: tuple[Column, ...] = ()

    def compose(self) -> ComposeResult:
        table = DataTable(cursor_type="none", zebra_stripes=False, show_cursor=False, cell_padding=0)
        table.can_focus = False
        yield table

    def _fit_columns(self, width: int) -> tuple[Column, ...]:
        used, keep = 0, set()
        for col in sorted(self.COLUMNS, key=lambda c: c.priority):
            if used + col.width > width and keep:
                break
            used += col.width
            keep.add(col.key)
        return tuple(c for c in self.COLUMNS if c.key in keep)

    def _ensure_columns(self, table: DataTable) -> None:
        width = self.content_size.width or self.app.size.width
        active = self._fit_columns(width)
        if active == self._active:
            return
        # Only on a resize that changes which columns fit: start the table again.
        table.clear(columns=True)
        for col in active:
            table.add_column(Text(" " + col.label, justify="right" if col.right else "left"), key=col.key,
                             width=col.width)
        self._active = active
        self._cells.clear()
        self._order = []

    def rows(self, snap: Snapshot) -> list[tuple[str, dict[str, str], str]]:
        """(row key, {column key: text}, style) in display order; the first column's text must
        be unique per row (DataTable sorts by values)."""
        raise NotImplementedError

    def update_view(self, snap: Snapshot) -> None:
        self.last_snapshot = snap
        table = self.query_one(DataTable)
        with self.app.batch_update():
            self._ensure_columns(table)
            cols = self._active
            wanted = [(key, tuple(values.get(c.key, "") for c in cols), style)
                      for key, values, style in self.rows(snap)]
            keys = [k for k, _, _ in wanted]
            for gone in set(self._cells) - set(keys):
                table.remove_row(gone)
                del self._cells[gone]
            for key, cells, style in wanted:
                old = self._cells.get(key)
                if old == cells + (style,):
                    continue
                texts = [Text(" " + fmt.clip(c, col.width - 1), style=style, justify="right" if col.right else "left")
                         for c, col in zip(cells, cols)]
                if old is None:
                    table.add_row(*texts, key=key)
                else:
                    for col, new, before, text in zip(cols, cells, old, texts):
                        if new != before or old[-1] != style:
                            table.update_cell(key, col.key, text)
                self._cells[key] = cells + (style,)
            if keys != self._order:
                where = {" " + fmt.clip(cells[0], cols[0].width - 1): i for i, (_, cells, _) in enumerate(wanted)}
                table.sort(cols[0].key, key=lambda cell: where.get(cell.plain if isinstance(cell, Text) else str(cell),
                                                                   1 << 30))
                self._order = keys


@register_panel
class ProcessTable(KeyedTable):
    VIEW = "procs"
    ORDER = 20
    NEEDS = ("proc",)
    TITLE = "Target process tree (CPU: 100% = one core)"
    COLUMNS = (
        Column("pid", "PID", 8, priority=0),
        Column("role", "role", 7, right=False, priority=0),
        Column("name", "name", 19, right=False, priority=0),
        Column("cpu", "CPU", 6, priority=0),
        Column("wait", "runq", 6, priority=6),
        Column("rss", "RSS", 8, priority=0),
        Column("thr", "thr", 5, priority=3),
        Column("ctx", "csw/s v/i", 12, priority=5),
        Column("disk", "disk r/w /s", 13, priority=4),
        Column("gpumem", "GPU mem", 8, priority=1),
        Column("state", "state", 11, right=False, priority=2),
    )

    def rows(self, snap: Snapshot):
        no_gpu = "-" if "gpu_procs" in snap.kinds else fmt.NA
        return [(r.pid, self.cells(r, no_gpu), "dim" if r.gone else "") for r in process_rows(snap)]

    @staticmethod
    def cells(r: ProcRow, no_gpu: str) -> dict[str, str]:
        return {
            "pid": r.pid, "role": r.role, "name": tree_name(r), "cpu": fmt.pct(r.cpu_pct),
            "wait": fmt.pct(r.cpu_wait_pct), "rss": fmt.size(r.rss), "thr": fmt.num(r.threads),
            "ctx": f"{fmt.num(r.ctx_vol_ps)}/{fmt.num(r.ctx_invol_ps)}",
            "disk": f"{fmt.size(r.io_read_bps)}/{fmt.size(r.io_write_bps)}",
            "gpumem": fmt.size(r.gpu_mem) if r.gpu_mem is not None else no_gpu, "state": r.state,
        }


@register_panel
class HostDetails(TextPanel):
    VIEW = "procs"
    ORDER = 40
    NEEDS = ("system",)
    TITLE = "Host (whole machine, and the target's cgroup)"

    def draw(self, snap: Snapshot, width: int) -> Text:
        s = snap.latest("system", "host")
        d = s.data if s is not None else {}
        label_w, value_w = 17, 26
        spark_w = max(0, width - label_w - value_w - 1)
        t = Text()

        def line(label: str, value: str, field: str | None = None, hi=None, style: str = "") -> None:
            if t.plain:
                t.append("\n")
            t.append(label.ljust(label_w), style=STYLE_LABEL)
            t.append(fmt.clip(value, value_w - 1).ljust(value_w), style=style)
            if field and spark_w >= 4:
                cells = snap.cells("system", "host", (field,), spark_w)[field]
                t.append(fmt.spark_cells(cells, 0.0, hi), style=STYLE_SPARK)

        ncpu = d.get("cpu_count")
        line("CPU", f"{fmt.pct(d.get('cpu_pct'))} of {ncpu if ncpu else 'n/a'} cores", "cpu_pct", 100.0)
        line("Load (1 min)", fmt.num(d.get("load1"), digits=2), "load1", fmt.to_float(ncpu) or None)
        total, avail = d.get("mem_total"), d.get("mem_available")
        line("Memory", f"{fmt.size(avail)} available of {fmt.size(total)}")
        swapping = any(isinstance(d.get(k), (int, float)) and d.get(k) > 0 for k in ("swap_in_bps", "swap_out_bps"))
        line("Swap", f"{fmt.size(d.get('swap_used'))} used", style="")
        line("Swap in/out", f"{fmt.rate_bytes(d.get('swap_in_bps'))} / {fmt.rate_bytes(d.get('swap_out_bps'))}",
             "swap_in_bps", style=STYLE_WARN if swapping else "")
        limit = d.get("cgroup_cpu_limit")
        line("cgroup CPUs", "no limit" if limit is None else fmt.num(limit, " CPUs", 1))
        thr = d.get("cgroup_throttled_pct")
        line("cgroup throttled", fmt.pct(thr, 1), "cgroup_throttled_pct", 100.0,
             style=STYLE_WARN if isinstance(thr, (int, float)) and thr > 5 else "")
        mlimit, mused = d.get("cgroup_mem_limit"), d.get("cgroup_mem_used")
        limit_text = "no limit" if mlimit is None else f"limit {fmt.size(mlimit)}"
        line("cgroup memory", f"{fmt.size(mused)} used, {limit_text}")
        return t
