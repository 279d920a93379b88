"""GPU details: every NVML/GPM number of every GPU, now and over the history window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich.text import Text

from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel, register_view
from gputop.ui.panels.overview import STYLE_BAD, STYLE_LABEL, STYLE_SPARK, STYLE_WARN, throttled, no_gpu_text
from gputop.ui.snapshot import Snapshot
from gputop.ui.sourceinfo import clock_events_text

register_view("gpus", "GPUs", order=20, short="GPU")

LABEL_W = 15
VALUE_W = 16


@dataclass(frozen=True)
class Row:
    label: str
    fields: tuple[str, ...]                   # drawn as one sparkline (summed when several)
    show: Callable[[dict, dict], str]         # (gpu data, gpu_info data) -> value text
    hi: Callable[[dict, dict], float | None]  # sparkline top; None: the largest value in view
    top_text: Callable[[float], str] | None = None  # how to write that largest value (auto-scaled rows)


def _pct(name):
    return lambda d, i: fmt.pct(d.get(name), 1)


def _hundred(d, i):
    return 100.0


def _auto(d, i):
    return None


def _summed(cells: dict[str, list], fields: tuple[str, ...]) -> list:
    if len(fields) == 1:
        return cells[fields[0]]
    out = []
    for vals in zip(*(cells[f] for f in fields)):
        got = [v for v in vals if v is not None]
        out.append(sum(got) if got else None)
    return out


def _power(d, i):
    v, lim = fmt.num(d.get("power_w")), fmt.num(d.get("power_limit_w") or i.get("power_limit_w"))
    if v == fmt.NA:
        return v
    return v + "W" if lim == fmt.NA else f"{v}/{lim}W"


def _clock_sm(d, i):
    v, top = fmt.num(d.get("clock_sm_mhz")), fmt.num(i.get("clock_sm_max_mhz"))
    if v == fmt.NA:
        return v
    return v + " MHz" if top == fmt.NA else f"{v}/{top} MHz"


def _nvlink(d, i):
    rx, tx = d.get("nvlink_rx_mibs"), d.get("nvlink_tx_mibs")
    if rx is None and tx is None:
        return fmt.NA
    return f"↓{fmt.rate_mib(rx)} ↑{fmt.rate_mib(tx)}"


def _mem(d, i):
    text = fmt.size_pair(d.get("mem_used"), d.get("mem_total") or i.get("mem_total"))
    return text


# Labels are the NVML source's own (its METRICS), so the help screen explains each row by name.
ROWS = (
    Row("SM active", ("sm_active",), _pct("sm_active"), _hundred),
    Row("SM occupancy", ("sm_occupancy",), _pct("sm_occupancy"), _hundred),
    Row("tensor active", ("tensor_active",), _pct("tensor_active"), _hundred),
    Row("DRAM bw", ("dram_bw",), _pct("dram_bw"), _hundred),
    Row("GR active", ("gr_active",), _pct("gr_active"), _hundred),
    Row("GPU util", ("util_gpu",), _pct("util_gpu"), _hundred),
    Row("mem util", ("util_mem",), _pct("util_mem"), _hundred),
    Row("PCIe RX H→D", ("pcie_rx_mibs",), lambda d, i: fmt.rate_mib(d.get("pcie_rx_mibs")), _auto, fmt.rate_mib),
    Row("PCIe TX D→H", ("pcie_tx_mibs",), lambda d, i: fmt.rate_mib(d.get("pcie_tx_mibs")), _auto, fmt.rate_mib),
    Row("NVLink RX+TX", ("nvlink_rx_mibs", "nvlink_tx_mibs"), _nvlink, _auto, fmt.rate_mib),
    Row("power", ("power_w",), _power, lambda d, i: d.get("power_limit_w") or i.get("power_limit_w")),
    Row("SM clock", ("clock_sm_mhz",), _clock_sm, lambda d, i: i.get("clock_sm_max_mhz")),
    Row("mem clock", ("clock_mem_mhz",), lambda d, i: fmt.num(d.get("clock_mem_mhz"), " MHz"), _auto,
        lambda v: fmt.num(v, " MHz")),
    Row("mem used", ("mem_used",), _mem, lambda d, i: d.get("mem_total") or i.get("mem_total")),
    Row("temp", ("temp_c",), lambda d, i: fmt.num(d.get("temp_c"), " °C"), _hundred),
)
SPARK_FIELDS = tuple(f for row in ROWS for f in row.fields)


def gpu_header(snap: Snapshot, key: str) -> Text:
    info = snap.latest("gpu_info", key)
    i = info.data if info is not None else {}
    t = Text()
    t.append(f"GPU{fmt.clean(key)}", style=STYLE_LABEL)
    bits = [fmt.clean(i.get("name") or "unknown model")]
    if i.get("mem_total"):
        bits.append(fmt.size(i.get("mem_total"), 0))
    if i.get("driver"):
        bits.append(f"driver {fmt.clean(i.get('driver'))}")
    if i.get("watched") is True:
        bits.append("used by the target")
    elif i.get("watched") is False:
        bits.append("not used by the target")
    t.append(" " + " · ".join(bits))
    return t


@register_panel
class GpuDetails(TextPanel):
    VIEW = "gpus"
    ORDER = 20
    NEEDS = ()
    TITLE = "GPU details (history: last minute)"

    def draw(self, snap: Snapshot, width: int) -> Text:
        keys = sorted(set(snap.keys("gpu")) | set(snap.keys("gpu_info")), key=lambda k: (len(k), k))
        if not keys:
            return no_gpu_text(snap)
        out = Text()
        for n, key in enumerate(keys):
            if n:
                out.append("\n\n")
            out.append_text(self.gpu_block(snap, key, width))
        return out

    def gpu_block(self, snap: Snapshot, key: str, width: int) -> Text:
        s = snap.latest("gpu", key)
        info = snap.latest("gpu_info", key)
        d = snap.current("gpu", key) if s is not None else {}
        i = info.data if info is not None else {}
        t = gpu_header(snap, key)
        if s is None:
            t.append("\n  no samples yet", style=STYLE_WARN)
            return t
        if snap.is_stale(s):
            t.append(f"  STALE: last sample {fmt.duration(snap.now - s.t)} ago", style=STYLE_BAD)
        spark_w = max(0, width - 2 - LABEL_W - VALUE_W - 1)
        cells = snap.cells("gpu", key, SPARK_FIELDS, max(spark_w, 1))
        for row in ROWS:
            row_cells = _summed(cells, row.fields)
            t.append("\n  ")
            t.append(row.label.ljust(LABEL_W), style=STYLE_LABEL)
            now_missing = all(d.get(f) is None for f in row.fields)
            if now_missing and all(v is None for v in row_cells):
                t.append(fmt.clip(snap.why_missing(key, row.fields[0]), width - 2 - LABEL_W), style="dim")
                continue
            t.append(fmt.clip(row.show(d, i), VALUE_W - 1).ljust(VALUE_W))
            hi = row.hi(d, i)
            if hi is None and row.top_text is not None:
                # auto-scaled: say what a full bar means, or a flat 2 MiB/s would look like a busy link
                top = max((v for v in row_cells if v is not None), default=None)
                # (written where the oldest cells would be, so "now" stays under "now" in every row)
                note = f"top {row.top_text(top)} " if top is not None else ""
                if spark_w - len(note) >= 4:
                    t.append(note, style="dim")
                    t.append(fmt.spark_cells(row_cells[len(note):], 0.0, top), style=STYLE_SPARK)
                continue
            if spark_w >= 4:
                t.append(fmt.spark_cells(row_cells, 0.0, hi), style=STYLE_SPARK)
        # Why the clocks are where they are, in words.
        events = d.get("clock_events")
        t.append("\n  ")
        t.append("clock events".ljust(LABEL_W), style=STYLE_LABEL)
        if events is None:
            t.append(fmt.clip(snap.why_missing(key, "clock_events"), width - 2 - LABEL_W), style="dim")
        else:
            t.append(fmt.clip(clock_events_text(events), width - 2 - LABEL_W),
                     style=STYLE_WARN if throttled(events) else "")
        if d.get("mem_reserved"):
            t.append("\n  ")
            t.append("mem reserved".ljust(LABEL_W), style=STYLE_LABEL)
            t.append(fmt.size(d.get("mem_reserved")) + " (driver/firmware, not usable)")
        procs = snap.latest("gpu_procs", key)
        if procs is not None and isinstance(procs.get("procs"), dict):
            t.append("\n  ")
            t.append("GPU processes".ljust(LABEL_W), style=STYLE_LABEL)
            items = [(pid, use if isinstance(use, dict) else {}) for pid, use in procs.get("procs").items()]
            items.sort(key=lambda kv: -(fmt.to_float(kv[1].get("mem")) or 0))
            if not items:
                t.append("none of the target's processes uses this GPU")
            else:
                bits = []
                for pid, use in items:
                    bit = f"{fmt.clean(pid)} {fmt.size(use.get('mem'))}"
                    if use.get("sm_pct") is not None:
                        bit += f" SM {fmt.pct(use.get('sm_pct'))}"
                    bits.append(bit)
                t.append(fmt.clip(", ".join(bits), width - 2 - LABEL_W))
        return t
