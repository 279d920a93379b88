"""The Ranks view: one row per rank of a distributed job (torchrun, mpirun, srun, a wrapper).

Rows come from ``gputop.derive.ranks.rank_table`` (the same join the straggler verdict reads):
the rank's process, its GPU and that GPU's SM active, its steps/s and data wait from the
in-process probe, and the share of its main thread's recent seconds (the thread states' look)
spent running Python, waiting for
the GIL, for a batch, for the GPU (sync) and in collectives (py-spy + kernel). Ranks that ended
stay as dim rows ("exited", and why). docs/metrics.md ("Ranks") documents every column.
"""

from __future__ import annotations

from rich.text import Text

from gputop.derive.ranks import NO_RANKS, rank_overview, rank_table
from gputop.derive.threads import DEFAULT_HORIZON_S, states_since
from gputop.model import MetricSpec
from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel, register_view
from gputop.ui.panels.procs import Column, KeyedTable
from gputop.ui.snapshot import Snapshot

register_view("ranks", "Ranks", order=55, short="Rnk")

MAX_EXITED_ROWS = 16    # ended rank processes shown (newest first); elastic restarts add many
STYLE_LABEL, STYLE_WARN, STYLE_DIM = "bold", "yellow", "dim"

METRICS = [
    MetricSpec("rank", "sm_active", "%", "SM act", "SM active of the rank's GPU (the whole GPU: ranks sharing it show the same)"),
    MetricSpec("rank", "steps_per_s", "/s", "steps/s", "training steps per second of the rank: steps per observed second of its newest probe window (in-process probe)"),
    MetricSpec("rank", "data_wait", "%", "data", "share of the rank's step time blocked on its DataLoader (probe; else its main thread's DataLoader wait from stacks)"),
    MetricSpec("rank", "gil_pct", "%", "GIL", "share of the rank's main thread's recent seconds (the thread states' look) waiting for the GIL"),
    MetricSpec("rank", "cuda_pct", "%", "sync", "share of the rank's main thread's recent seconds (the thread states' look) waiting for the GPU (synchronize, .item())"),
    MetricSpec("rank", "collective_pct", "%", "coll", "share of the rank's main thread's recent seconds (the thread states' look) inside torch.distributed collectives"),
    MetricSpec("rank", "running_pct", "%", "run", "share of the rank's main thread's recent seconds (the thread states' look) running Python (or native code called from it)"),
    MetricSpec("rank", "idle_pct", "%", "idle", "share of the rank's main thread's recent seconds (the thread states' look) blocked elsewhere (sleep, locks, I/O, waits py-spy cannot name)"),
]


def rank_rows(snap: Snapshot) -> list[dict]:
    """rank_table for this tick, computed once however many panels ask."""
    got = getattr(snap, "_gputop_rank_rows", None)
    if got is None:
        got = rank_table(snap.store, snap.now) if "rank" in snap.kinds else []
        snap._gputop_rank_rows = got
    return got


def _data_wait(row: dict):
    share = fmt.to_float(row.get("data_wait_share"))
    return 100.0 * share if share is not None else row.get("data_pct")


def _gpu(row: dict) -> str:
    if row.get("gpu") is None:
        return "-"
    return fmt.clean(row["gpu"]) + ("?" if row.get("gpu_from") == "env" else "")


@register_panel
class RankSummary(TextPanel):
    VIEW = "ranks"
    ORDER = 10
    NEEDS = ()   # always: "no ranks, and where gputop looked" is worth saying
    TITLE = "Ranks"
    METRICS = METRICS

    def draw(self, snap: Snapshot, width: int) -> Text:
        rows = rank_rows(snap)
        t = Text()
        if not rows:
            t.append(fmt.clean(NO_RANKS) + ".")
            return t
        ov = rank_overview(rows)
        worlds = "/".join(str(w) for w in ov["world_sizes"]) or "n/a"
        t.append(f"{ov['running']} running", style=STYLE_LABEL)
        t.append(f" of world size {worlds}")
        if ov["nodes"]:
            t.append(f" on {fmt.clean(', '.join(ov['nodes']))}")
        if ov["exited"]:
            t.append(f" · {ov['exited']} ended", style=STYLE_DIM)
        launchers = sorted({r["launcher_pid"] for r in rows if r.get("launcher_pid") is not None})
        if launchers:
            t.append(f" · launcher PID {', '.join(map(str, launchers[:3]))}")
        if ov["missing_local_ranks"]:
            miss = ", ".join(map(str, ov["missing_local_ranks"][:8]))
            t.append(f"\nlocal rank {miss} of {ov['local_world_size']} not found on this node "
                     f"(not started, exited, or outside the target's tree)", style=STYLE_WARN)
        # the thread states' look (derive/threads.states_since: 10 s, 30 s while calm, shorter early in a phase)
        look = round(snap.now - states_since(snap.store, snap.now, DEFAULT_HORIZON_S))
        t.append(f"\nrun/GIL/data/sync/coll/idle: the rank's main thread's last {look:g} s (py-spy + kernel); "
                 "data: the probe's DataLoader wait when it runs; SM act: the whole GPU", style=STYLE_DIM)
        if any(r.get("gpu_from") == "env" for r in rows):
            t.append("\nGPU?: from CUDA_VISIBLE_DEVICES / LOCAL_RANK, not seen in NVML's process list", style=STYLE_DIM)
        return t


@register_panel
class RankTable(KeyedTable):
    VIEW = "ranks"
    ORDER = 20
    NEEDS = ("rank",)
    TITLE = "Per rank"
    COLUMNS = (
        Column("pid", "PID", 8, priority=0),
        Column("rank", "rank", 6, priority=0),
        Column("gpu", "GPU", 5, priority=0),
        Column("sm", "SM act", 7, priority=1),
        Column("steps", "steps/s", 8, priority=0),
        Column("data", "data", 6, priority=2),
        Column("gil", "GIL", 6, priority=3),
        Column("sync", "sync", 6, priority=3),
        Column("coll", "coll", 6, priority=0),
        Column("run", "run", 6, priority=4),
        Column("idle", "idle", 6, priority=4),
        Column("cpu", "CPU", 6, priority=5),
        Column("state", "state", 10, right=False, priority=1),
    )

    def rows(self, snap: Snapshot):
        rows = rank_rows(snap)
        running = [r for r in rows if r["state"] == "running"]
        ended = sorted((r for r in rows if r["state"] != "running"), key=lambda r: -r["t"])[:MAX_EXITED_ROWS]
        keep = {id(r) for r in running + ended}
        out = []
        for r in rows:  # rank order, running before ended
            if id(r) not in keep:
                continue
            ended_row = r["state"] != "running"
            sps = fmt.to_float(r.get("steps_per_s"))
            out.append((str(r["pid"]), {
                "pid": str(r["pid"]),
                "rank": "?" if r.get("rank") is None else str(r["rank"]),
                "gpu": _gpu(r),
                "sm": fmt.pct(r.get("sm_active")),
                "steps": fmt.NA if sps is None else (f"{sps:.0f}" if sps >= 100 else f"{sps:.1f}" if sps >= 10 else f"{sps:.2f}"),
                "data": fmt.pct(_data_wait(r)),
                "gil": fmt.pct(r.get("gil_pct")),
                "sync": fmt.pct(r.get("cuda_pct")),
                "coll": fmt.pct(r.get("collective_pct")),
                "run": fmt.pct(r.get("running_pct")),
                "idle": fmt.pct(r.get("idle_pct")),
                "cpu": fmt.pct(r.get("cpu_pct")),
                "state": fmt.clean(r.get("state") or "?"),
            }, STYLE_DIM if ended_row else ""))
        return out


@register_panel
class RankEnded(TextPanel):
    """Why ended ranks ended (exited, left the tree, replaced by a restart)."""

    VIEW = "ranks"
    ORDER = 30
    NEEDS = ("rank",)
    TITLE = "Ended"

    def shown(self, snap: Snapshot) -> bool:
        return any(r["state"] != "running" for r in rank_rows(snap))

    def draw(self, snap: Snapshot, width: int) -> Text:
        t = Text()
        ended = sorted((r for r in rank_rows(snap) if r["state"] != "running"), key=lambda r: -r["t"])
        for r in ended[:MAX_EXITED_ROWS]:
            if t.plain:
                t.append("\n")
            rank = "?" if r.get("rank") is None else r["rank"]
            t.append(fmt.clip(f"rank {rank} (PID {r['pid']}) at {r['t']:.1f} s: {fmt.clean(r.get('why') or 'exited')}",
                              max(20, width)), style=STYLE_DIM)
        return t
