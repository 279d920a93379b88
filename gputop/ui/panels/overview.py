"""The overview: everything important on one 80x24 screen.

Top to bottom: (the verdict strip, ORDER 0, once issue 5 adds it), one or two lines per GPU,
one line of host state, and the target's busiest processes in the remaining rows.
"""

from __future__ import annotations

from rich.text import Text

from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel, register_view
from gputop.ui.procview import process_rows, tree_name
from gputop.ui.snapshot import Snapshot
from gputop.ui.sourceinfo import clock_event_name, clock_events_text

register_view("overview", "Overview", order=10, short="Ovw")

STYLE_LABEL = "bold"
STYLE_BAD = "bold red"
STYLE_WARN = "yellow"
STYLE_SPARK = "green"


def gpu_label(snap: Snapshot, key: str) -> tuple[str, bool]:
    info = snap.latest("gpu_info", key)
    watched = bool(info.get("watched")) if info is not None else False
    return f"GPU{fmt.clean(key)}", watched


def short_gpu_name(name) -> str:
    if not name:
        return ""
    s = str(name)
    for prefix in ("NVIDIA ", "Tesla "):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return s


def primary_activity(snap: Snapshot, key: str) -> tuple[str, str]:
    """(label, field) of the GPU's headline activity: SM active when GPM gives it, else NVML's
    util.gpu labelled "util" (which only says that some kernel was running)."""
    if any(s.data.get("sm_active") is not None for s in snap.series("gpu", key)):
        return "SM", "sm_active"
    return "util", "util_gpu"


def no_gpu_text(snap: Snapshot) -> Text:
    h = snap.source_state("nvml")
    t = Text()
    t.append("no GPU data", style=STYLE_BAD)
    if h is None:
        t.append(" (this session has no NVML source)")
    elif not h.get("state"):
        t.append(" yet (the NVML source has not reported)")
    else:
        t.append(f" — nvml {fmt.clean(h.get('state'))}")
        if h.get("message"):
            t.append(f": {fmt.clean(h.get('message'))}")
    return t


@register_panel
class GpuSummary(TextPanel):
    VIEW = "overview"
    ORDER = 20
    NEEDS = ()  # always shown: "no GPU data, and why" is worth a line
    TITLE = "GPUs"

    def draw(self, snap: Snapshot, width: int) -> Text:
        keys = snap.keys("gpu")
        if not keys:
            return no_gpu_text(snap)
        out = Text()
        # Two lines per GPU while they leave room for the rest of the overview, else one.
        height = self.app.size.height if self.is_attached else 24
        two_lines = 2 * len(keys) <= max(2, height - 20)
        for i, key in enumerate(keys):
            if i:
                out.append("\n")
            out.append_text(self._gpu(snap, key, width, two_lines))
        return out

    def _gpu(self, snap: Snapshot, key: str, width: int, two_lines: bool) -> Text:
        s = snap.latest("gpu", key)
        info = snap.latest("gpu_info", key)
        label, watched = gpu_label(snap, key)
        stale = snap.is_stale(s)
        d = snap.current("gpu", key) if s is not None else {}
        act_label, act_field = primary_activity(snap, key)
        t = Text()
        t.append(f"{label}{'*' if watched else ' '}".ljust(6), style=STYLE_LABEL)
        if two_lines:
            name = short_gpu_name(info.get("name") if info else "")
            t.append(fmt.clip(name, 6).ljust(7))
            rest = width - 13
            # three sparklines share what is left: "SM <spark> 100%" = 3 + w + 5 each
            fields = [(act_label, act_field), ("TC", "tensor_active"), ("DRAM", "dram_bw")]
            label_w = sum(len(lbl) + 1 + 5 + 1 for lbl, _ in fields)
            sw = max(4, (rest - label_w) // 3)
            for j, (lbl, name_) in enumerate(fields):
                if j:
                    t.append(" ")
                t.append(lbl + " ", style=STYLE_LABEL)
                t.append(fmt.spark_cells(snap.cells("gpu", key, (name_,), sw)[name_], 0, 100), style=STYLE_SPARK)
                t.append(fmt.pct(d.get(name_)).rjust(5))
            t.append("\n")
            t.append(" " * 6)
            line2 = Text()
            line2.append("mem ", style=STYLE_LABEL)
            line2.append(fmt.size_pair(d.get("mem_used"), d.get("mem_total")))
            line2.append("  PCIe ", style=STYLE_LABEL)
            line2.append(f"↓{fmt.rate_mib(d.get('pcie_rx_mibs'))} ↑{fmt.rate_mib(d.get('pcie_tx_mibs'))}")
            line2.append("  ")
            line2.append(fmt.num(d.get("power_w"), "W"))
            line2.append("  ")
            line2.append(fmt.num(d.get("clock_sm_mhz"), "MHz"))
            line2.append("  clocks: ", style=STYLE_LABEL)
            events = d.get("clock_events")
            words = clock_events_text(events)
            if line2.cell_len + len(words) + (7 if stale else 0) > width - 6 and throttled(events):
                words = short_events(events)  # the GPU view has them in full
            line2.append(words, style=STYLE_WARN if throttled(events) else "")
            if stale:
                line2.append("  STALE", style=STYLE_BAD)
            line2.truncate(width - 6, overflow="ellipsis")
            t.append_text(line2)
        else:
            sw = max(4, width - 67)
            t.append(f"{act_label} ", style=STYLE_LABEL)
            t.append(fmt.spark_cells(snap.cells("gpu", key, (act_field,), sw)[act_field], 0, 100), style=STYLE_SPARK)
            t.append(fmt.pct(d.get(act_field)).rjust(5))
            t.append(" TC", style=STYLE_LABEL)
            t.append(fmt.pct(d.get("tensor_active")).rjust(5))
            t.append(" DRAM", style=STYLE_LABEL)
            t.append(fmt.pct(d.get("dram_bw")).rjust(5))
            t.append(" " + fmt.size_pair(d.get("mem_used"), d.get("mem_total")).rjust(10))
            t.append(" " + fmt.num(d.get("power_w"), "W").rjust(5))
            t.append(" " + fmt.num(d.get("clock_sm_mhz"), "MHz").rjust(7))
            events = d.get("clock_events")
            if stale:
                t.append(" STALE", style=STYLE_BAD)
            elif throttled(events):
                t.append(" " + short_events(events), style=STYLE_WARN)
            t.truncate(width, overflow="ellipsis")
        return t


SHORT_EVENT_WORDS = {
    "sw_power_cap": "pwr cap", "hw_slowdown": "hw slow", "sw_thermal": "thermal", "hw_thermal": "HW therm",
    "hw_power_brake": "pwr brake", "sync_boost": "sync", "applications_clocks_setting": "app clk",
    "display_clocks": "disp clk", "board_limit": "board", "reliability": "reliab.",
}


def short_events(events) -> str:
    """Clock-event reasons in a few letters, for the one-line-per-GPU overview."""
    return ",".join(clock_event_name(e, SHORT_EVENT_WORDS, 20) for e in events if e != "gpu_idle")


def throttled(events) -> bool:
    return isinstance(events, list) and any(e != "gpu_idle" for e in events)


@register_panel
class HostSummary(TextPanel):
    VIEW = "overview"
    ORDER = 40
    NEEDS = ("system",)
    TITLE = "Host"

    def draw(self, snap: Snapshot, width: int) -> Text:
        return host_line(snap, width)


def host_line(snap: Snapshot, width: int) -> Text:
    s = snap.latest("system", "host")
    d = s.data if s is not None else {}
    t = Text()
    t.append("CPU ", style=STYLE_LABEL)
    t.append(fmt.pct(d.get("cpu_pct")))
    if d.get("cpu_count"):
        t.append(f" of {fmt.num(d.get('cpu_count'))} cores")
    t.append("  load ", style=STYLE_LABEL)
    t.append(fmt.num(d.get("load1"), digits=2))
    t.append("  mem ", style=STYLE_LABEL)
    total, avail = d.get("mem_total"), d.get("mem_available")
    used = total - avail if isinstance(total, (int, float)) and isinstance(avail, (int, float)) else None
    t.append(fmt.size_pair(used, total))
    swap_in, swap_out = d.get("swap_in_bps"), d.get("swap_out_bps")
    t.append("  swap ", style=STYLE_LABEL)
    swapping = any(isinstance(v, (int, float)) and v > 0 for v in (swap_in, swap_out))
    t.append(f"{fmt.size(d.get('swap_used'))} in {fmt.rate_bytes(swap_in)} out {fmt.rate_bytes(swap_out)}",
             style=STYLE_WARN if swapping else "")
    thr_pct = d.get("cgroup_throttled_pct")
    if d.get("cgroup_cpu_limit") is not None or thr_pct is not None:
        t.append("  cgroup ", style=STYLE_LABEL)
        t.append(f"{fmt.num(d.get('cgroup_cpu_limit'), digits=1)} CPUs, throttled {fmt.pct(thr_pct)}",
                 style=STYLE_WARN if isinstance(thr_pct, (int, float)) and thr_pct > 5 else "")
    t.truncate(width, overflow="ellipsis")
    return t


@register_panel
class TopProcesses(TextPanel):
    """The target tree, as many rows as fit (busiest first after the main process)."""

    VIEW = "overview"
    ORDER = 60
    NEEDS = ("proc",)
    TITLE = "Target processes"
    DEFAULT_CSS = "TopProcesses { height: 1fr; min-height: 3; }"

    def draw(self, snap: Snapshot, width: int) -> Text:
        rows = process_rows(snap)
        no_gpu = "-" if "gpu_procs" in snap.kinds else fmt.NA
        room = max(1, (self.content_size.height or 6) - 1)
        t = Text()
        name_w = min(32, max(8, width - 56))
        t.append(f"{'PID':>7} {'role':<6} {'name':<{name_w}} {'CPU':>6} {'RSS':>7} {'thr':>4} {'GPU mem':>8} state",
                 style=STYLE_LABEL)
        if len(rows) > room:
            # keep the tree order but drop the idlest rows beyond the first
            busiest = sorted(rows[1:], key=lambda r: -(fmt.to_float(r.cpu_pct) or 0))
            keep = {rows[0].pid} | {r.pid for r in busiest[: room - 2]}
            shown = [r for r in rows if r.pid in keep]
            hidden = len(rows) - len(shown)
        else:
            shown, hidden = rows, 0
        for r in shown:
            t.append("\n")
            line = (f"{r.pid:>7} {r.role:<6} {fmt.clip(tree_name(r), name_w):<{name_w}} "
                    f"{fmt.pct(r.cpu_pct):>6} {fmt.size(r.rss):>7} {fmt.num(r.threads):>4} "
                    f"{(fmt.size(r.gpu_mem) if r.gpu_mem is not None else no_gpu):>8} {r.state}")
            t.append(fmt.clip(line, width), style="dim" if r.gone else "")
        if hidden:
            t.append(f"\n  … {hidden} more quiet processes (see the Processes view)", style="dim")
        return t
