"""Which processes `gputop` with no arguments offers to watch: processes on a GPU (from NVML, with
their GPU memory), then Python processes with a probe socket, then other Python processes, each
group newest first. NVML may be missing (no driver, no GPU): then the list has no GPU group and
says why in ``Candidates.gpu_note``. Nothing here needs ptrace or another user's rights; a
process that cannot be read is skipped."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

from gputop.probe import wire
from gputop.sources.procfs import is_python_process

MAX_CANDIDATES = 200  # a picker of more is unusable; the newest are the likely jobs
WHAT_GPU, WHAT_PROBE, WHAT_PYTHON = "GPU", "Python+probe", "Python"
_ORDER = {WHAT_GPU: 0, WHAT_PROBE: 1, WHAT_PYTHON: 2}


@dataclass
class Candidate:
    pid: int
    what: str                  # WHAT_GPU, WHAT_PROBE or WHAT_PYTHON
    command: str               # the command line on one line (newlines shown as spaces)
    started: float             # psutil create_time, seconds since the epoch
    user: str = ""
    gpu_mem_bytes: int | None = None  # summed over its GPUs; None: not on a GPU, or unknown
    gpus: list[int] = field(default_factory=list)
    probe: bool = False


@dataclass
class Candidates:
    items: list[Candidate]
    gpu_note: str | None = None   # why there is no GPU group (NVML absent, ...), else None


def _gpu_processes() -> tuple[dict[int, tuple[int | None, list[int]]], str | None]:
    """{pid: (GPU memory in bytes or None, [GPU index, ...])} from NVML, its PIDs mapped to the
    ones visible here (sources/pid_namespace.py), and why not / which mapping when not the same."""
    raw, note = _nvml_processes()
    if not raw:
        return raw, note
    from gputop.sources.pid_namespace import METHOD_SAME, map_pids

    mapping = map_pids({pid: (mem, set(gpus)) for pid, (mem, gpus) in raw.items()})
    if mapping.method == METHOD_SAME:
        return raw, note
    out = {mapping.get(pid): v for pid, v in raw.items() if mapping.get(pid) is not None}
    return out, mapping.describe()


def _nvml_processes() -> tuple[dict[int, tuple[int | None, list[int]]], str | None]:
    """{host PID: (GPU memory in bytes or None, [GPU minor, ...])} as NVML says, and why not."""
    from gputop.sources.nvml_errors import nv, nvml_reason

    if nv is None:
        return {}, "nvidia-ml-py is not installed: no GPU processes listed"
    try:
        nv.nvmlInit()
    except Exception as e:  # no driver, no GPU: the Python groups still work
        return {}, f"NVML: {nvml_reason(e)}: no GPU processes listed"
    out: dict[int, tuple[int | None, list[int]]] = {}
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
            except Exception:
                continue
            try:
                gpu = int(nv.nvmlDeviceGetMinorNumber(h))  # /dev/nvidia<minor>: what pid_namespace pairs by
            except Exception:
                gpu = i
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                mem, gpus = out.get(p.pid, (None, []))
                if isinstance(used, int) and used >= 0:
                    mem = (mem or 0) + used
                out[p.pid] = (mem, gpus + [gpu])
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return out, None


def _has_probe(pid: int, uid: int, env: dict | None) -> bool:
    """A probe socket of ``pid`` in one of the directories gputop's probe client looks in."""
    env = env or {}
    for d in (env.get(wire.ENV_DIR), wire.default_dir(uid), wire.fallback_dir(env, uid)):
        if d and wire.check_dir(d, uid) is None and wire.check_socket_file(wire.socket_path(d, pid), uid) is None:
            return True
    return False


def one_line(cmdline: list[str] | str, limit: int = 300) -> str:
    """A command line for one line of text: control characters (a `-c` script's newlines) as
    spaces, runs of spaces folded; longer than ``limit``: cut between words where one ends in
    the last third, with an ellipsis."""
    text = cmdline if isinstance(cmdline, str) else " ".join(cmdline)
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return (text[:cut] if cut >= limit * 2 // 3 else text[: limit - 1]) + "…"


def find_candidates(exclude: set[int] | None = None) -> Candidates:
    exclude = set(exclude or ()) | {os.getpid()}
    gpu, note = _gpu_processes()
    found: list[Candidate] = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "create_time", "username", "uids"]):
        info = proc.info
        pid = info["pid"]
        if pid in exclude:
            continue
        cmdline = info.get("cmdline") or []
        on_gpu = pid in gpu
        if not on_gpu and not is_python_process(pid, info.get("name"), cmdline):
            continue
        uid = info["uids"].real if info.get("uids") else None
        probe = False
        if uid is not None:
            try:
                env = proc.environ()  # its own probe directory, if it set one
            except (psutil.Error, OSError):
                env = None
            probe = _has_probe(pid, uid, env)
        mem, gpus = gpu.get(pid, (None, []))
        what = WHAT_GPU if on_gpu else WHAT_PROBE if probe else WHAT_PYTHON
        found.append(Candidate(pid=pid, what=what, command=one_line(cmdline) or f"[{info.get('name') or '?'}]",
                               started=info.get("create_time") or 0.0, user=info.get("username") or "",
                               gpu_mem_bytes=mem, gpus=gpus, probe=probe))
    found.sort(key=lambda c: (_ORDER[c.what], -c.started))
    return Candidates(found[:MAX_CANDIDATES], note)


def describe(c: Candidate) -> str:
    """The "what" column: GPU with its memory and indices, or Python with/without a probe."""
    if c.what == WHAT_GPU:
        mem = f" {c.gpu_mem_bytes / 2**30:.1f} GiB" if c.gpu_mem_bytes is not None else ""
        gpus = ",".join(str(g) for g in c.gpus)
        return f"GPU {gpus}{mem}" + (" +probe" if c.probe else "")
    return c.what


def format_list(found: Candidates) -> str:
    """The list as plain text, one process a line (PID, what, command), for a pipe or a log."""
    lines = [f"{'PID':>7}  {'WHAT':<16} COMMAND"]
    lines += [f"{c.pid:>7}  {describe(c):<16} {c.command}" for c in found.items]
    if not found.items:
        lines.append("(no GPU or Python processes found)")
    if found.gpu_note:
        lines.append(f"({found.gpu_note})")
    return "\n".join(lines) + "\n"
