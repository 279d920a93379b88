"""Threads of the target's main process, busiest first (from the host source)."""

from __future__ import annotations

from gputop.ui import fmt
from gputop.ui.panels import register_panel, register_view
from gputop.ui.panels.procs import Column, KeyedTable
from gputop.ui.snapshot import Snapshot

register_view("threads", "Threads", order=40, short="Thr")

GONE_AFTER_S = 4.0   # no thread sample for this long: gone (the host's 1 Hz gaps reach 3 s)
FORGET_AFTER_S = 60.0


@register_panel
class ThreadTable(KeyedTable):
    VIEW = "threads"
    ORDER = 20
    NEEDS = ("thread",)
    TITLE = "Threads of the main process (CPU: 100% = one core)"
    COLUMNS = (
        Column("tid", "TID", 9, priority=0),
        Column("name", "name", 24, right=False, priority=0),
        Column("state", "state", 11, right=False, priority=1),
        Column("cpu", "CPU", 7, priority=0),
        Column("user", "user", 7, priority=4),
        Column("sys", "sys", 7, priority=4),
        Column("wait", "runq", 7, priority=2),
        Column("ctx", "csw/s v/i", 12, priority=3),
    )

    def rows(self, snap: Snapshot):
        # Once the target has exited nothing is forgotten: the last state of every thread stays.
        exited = snap.target_exit()
        forget_after = float("inf") if exited is not None else FORGET_AFTER_S
        rows = []
        for key, s in snap.latest_of_kind("thread").items():
            age = snap.now - s.t
            if age > forget_after:
                continue
            tid = key.partition(":")[2] or key
            # ended, or sampling stopped: no current value
            gone = age > GONE_AFTER_S or (exited is not None and s.t <= exited.t)
            rows.append((key, s, tid, gone))
        rows.sort(key=lambda x: (x[3], -(fmt.to_float(x[1].get("cpu_pct")) or 0), x[2]))
        out = []
        for key, s, tid, gone in rows:
            d = s.data
            out.append((key, {
                "tid": fmt.clean(tid), "name": fmt.clean(d.get("name") or "?"),
                "state": "gone" if gone else fmt.clean(d.get("state") or ""),
                "cpu": fmt.NA if gone else fmt.pct(d.get("cpu_pct")),
                "user": fmt.NA if gone else fmt.pct(d.get("user_pct")),
                "sys": fmt.NA if gone else fmt.pct(d.get("sys_pct")),
                "wait": fmt.NA if gone else fmt.pct(d.get("cpu_wait_pct")),
                "ctx": fmt.NA if gone else f"{fmt.num(d.get('ctx_vol_ps'))}/{fmt.num(d.get('ctx_invol_ps'))}",
            }, "dim" if gone else ""))
        return out
