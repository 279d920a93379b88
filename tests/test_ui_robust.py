"""Whatever a recording holds, drawing it never raises.

A recording may come from another machine, another version, or be hand-edited: the reader
guarantees JSON values of bounded size, not their types. Hypothesis feeds samples of every
kind the UI draws, with the known field names bound to arbitrary JSON values, through a real
session's bus and store; then every registered panel, the header and the banner draw it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputop.model import Sample
from gputop.session.session import LiveSession, SessionClock
from gputop.ui.app import Banner, HeaderBar
from gputop.ui.panels import Panel, TextPanel, load_panel_modules, panels_for, views
from gputop.ui.panels.procs import KeyedTable
from gputop.ui.snapshot import Snapshot

FIELDS = {
    "gpu": ["util_gpu", "util_mem", "mem_used", "mem_total", "mem_reserved", "power_w", "power_limit_w",
            "clock_sm_mhz", "clock_mem_mhz", "temp_c", "clock_events", "sm_active", "sm_occupancy",
            "tensor_active", "dram_bw", "gr_active", "pcie_tx_mibs", "pcie_rx_mibs", "nvlink_tx_mibs",
            "nvlink_rx_mibs"],
    "gpu_info": ["name", "driver", "mem_total", "power_limit_w", "clock_sm_max_mhz", "watched", "na"],
    "gpu_procs": ["procs"],
    "system": ["cpu_pct", "cpu_count", "load1", "mem_total", "mem_available", "swap_used", "swap_in_bps",
               "swap_out_bps", "cgroup_cpu_limit", "cgroup_throttled_pct", "cgroup_mem_limit", "cgroup_mem_used"],
    "proc": ["ppid", "name", "role", "cpu_pct", "cpu_wait_pct", "rss", "threads", "ctx_vol_ps", "ctx_invol_ps",
             "io_read_bps", "io_write_bps", "state"],
    "proc_info": ["name", "ppid", "role"],
    "thread": ["name", "state", "cpu_pct", "user_pct", "sys_pct", "cpu_wait_pct", "ctx_vol_ps", "ctx_invol_ps"],
    "target": ["state", "exit_code"],
    "health": ["state", "message", "rate_hz"],
}
KEYS = ["0", "1", "42", "host", "nvml", "42:43", "x\x1b[2J"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**15) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def samples(draw):
    out = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(sorted(FIELDS)))
        names = draw(st.lists(st.sampled_from(FIELDS[kind]), max_size=len(FIELDS[kind]), unique=True))
        data = {n: draw(json_values) for n in names}
        out.append(Sample(draw(st.floats(0, 100)), kind, draw(st.sampled_from(KEYS)), data))
    return out


def _all_panels() -> list[Panel]:
    load_panel_modules()
    return [cls() for v in views() for cls in panels_for(v.id)]


PANELS = _all_panels()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples(), st.sampled_from([{}, {"target": {"pid": 42, "cmdline": ["python", "x\ny"]}},
                                   {"target": "not a dict", "start_wall": "x"}]))
def test_any_recorded_values_draw_without_error(batch, meta):
    session = LiveSession([], SessionClock(), meta)
    session.bus.publish_many(sorted(batch, key=lambda s: s.t))
    session.now = lambda: 50.0  # a fixed moment inside the samples' time range
    snap = Snapshot(session, history_s=60.0)
    for width in (80, 200):
        HeaderBar().draw(snap, "gputop", width)
        Banner().draw(snap)
        for panel in PANELS:
            panel.shown(snap)
            if isinstance(panel, TextPanel):
                text = panel.draw(snap, width)
                assert "\x1b" not in text.plain  # nothing from the data reaches the terminal raw
            elif isinstance(panel, KeyedTable):
                for _key, cells, _style in panel.rows(snap):
                    assert all(isinstance(c, str) and "\x1b" not in c for c in cells.values())


def test_a_clock_event_nvml_never_names_is_written_out_in_every_view():
    """Hypothesis found it on a clean-clone CI run (2026-12-06): a recorded clock event "\\x1b"
    beside a stale GPU sample reached the overview's "clocks:" line raw. Any name NVML does not
    give is shown with its control characters written out, at any width."""
    session = LiveSession([], SessionClock(), {})
    session.bus.publish_many([Sample(float(t), "gpu", "0", {"util_gpu": 50, "clock_events": ["\x1b[2J", "hw_x\x1b"]})
                              for t in range(3)])
    session.now = lambda: 50.0   # the samples are stale by then, as in the example found
    snap = Snapshot(session, history_s=60.0)
    for width in (60, 80, 200):
        for panel in PANELS:
            panel.shown(snap)
            if isinstance(panel, TextPanel):
                text = panel.draw(snap, width).plain
                assert "\x1b" not in text, (type(panel).__name__, width, text)
            elif isinstance(panel, KeyedTable):
                for _key, cells, _style in panel.rows(snap):
                    assert all("\x1b" not in c for c in cells.values()), (type(panel).__name__, cells)
