"""The target's process tree as rows, for the overview and the process view."""

from __future__ import annotations

from dataclasses import dataclass

from gputop.ui import fmt
from gputop.ui.snapshot import Snapshot

ROLE_WORDS = {"main": "main", "dataloader_worker": "loader", "child": "child"}
GONE_AFTER_S = 4.0      # no proc sample for this long: the process is gone (the host source's 1 Hz gaps reach 3 s)
FORGET_AFTER_S = 60.0   # gone processes stay listed this long, then drop out (the main one stays)


@dataclass(frozen=True)
class ProcRow:
    pid: str
    depth: int
    role: str
    name: str
    state: str
    cpu_pct: float | None
    cpu_wait_pct: float | None
    rss: float | None
    threads: int | None
    ctx_vol_ps: float | None
    ctx_invol_ps: float | None
    io_read_bps: float | None
    io_write_bps: float | None
    gpu_mem: float | None      # bytes on all GPUs together; None when no GPU reports it
    gpus: tuple[str, ...]
    gone: bool


def _gpu_use(snap: Snapshot) -> dict[str, tuple[float | None, list[str]]]:
    """Per PID: bytes of GPU memory on all GPUs together, and which GPUs."""
    out: dict[str, tuple[float | None, list[str]]] = {}
    for gpu, s in snap.latest_of_kind("gpu_procs").items():
        procs = s.get("procs")
        if not isinstance(procs, dict):
            continue
        for pid, use in procs.items():
            if not isinstance(use, dict):
                continue
            mem = use.get("mem")
            m0, gpus = out.get(str(pid), (None, []))
            if isinstance(mem, (int, float)):
                m0 = (m0 or 0) + mem
            out[str(pid)] = (m0, [*gpus, gpu])
    return out


def process_rows(snap: Snapshot) -> list[ProcRow]:
    """The tree in depth-first order (main process first), each row with its latest values."""
    procs = snap.latest_of_kind("proc")
    infos = snap.latest_of_kind("proc_info")
    gpu = _gpu_use(snap)
    main = snap.target_pid
    # Once the target has exited nothing is forgotten: the last state of every process stays,
    # marked gone (the host source stops sampling the tree then).
    exited = snap.target_exit()
    forget_after = float("inf") if exited is not None else FORGET_AFTER_S
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for pid, s in procs.items():
        if snap.now - s.t > forget_after and pid != main:
            continue
        ppid = str(s.get("ppid") if s.get("ppid") is not None else (infos.get(pid).get("ppid") if pid in infos else ""))
        if ppid in procs and ppid != pid:
            children.setdefault(ppid, []).append(pid)
        else:
            roots.append(pid)
    num = lambda p: (0, int(p)) if p.isdigit() else (1, p)  # noqa: E731
    roots.sort(key=lambda p: (p != main, num(p)))
    rows: list[ProcRow] = []
    seen: set[str] = set()

    def visit(pid: str, depth: int) -> None:
        if pid in seen:
            return
        seen.add(pid)
        s = procs[pid]
        info = infos.get(pid)
        name = s.get("name") or (info.get("name") if info else None) or "?"
        role = str(s.get("role") or (info.get("role") if info else None) or "")
        gone = snap.now - s.t > GONE_AFTER_S or (exited is not None and s.t <= exited.t)
        mem, gpus = gpu.get(pid, (None, []))

        def now(field: str):
            return None if gone else s.get(field)  # rates of a gone process have no current value

        rows.append(ProcRow(
            pid=fmt.clean(pid), depth=depth, role=fmt.clean(ROLE_WORDS.get(role, role)), name=fmt.clean(name),
            state="gone" if gone else fmt.clean(s.get("state") or ""),
            cpu_pct=now("cpu_pct"), cpu_wait_pct=now("cpu_wait_pct"), rss=s.get("rss"), threads=s.get("threads"),
            ctx_vol_ps=now("ctx_vol_ps"), ctx_invol_ps=now("ctx_invol_ps"),
            io_read_bps=now("io_read_bps"), io_write_bps=now("io_write_bps"),
            gpu_mem=mem, gpus=tuple(gpus), gone=gone))
        for child in sorted(children.get(pid, []), key=num):
            visit(child, depth + 1)

    for r in roots:
        visit(r, 0)
    return rows


def tree_name(row: ProcRow) -> str:
    return ("  " * (row.depth - 1) + "└ " if row.depth else "") + row.name
