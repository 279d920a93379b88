"""Which processes on this node are training jobs, found without anyone naming them.

A process qualifies when it is a Python process and any of these hold (``Found.why``):
- ``gpu``: NVML lists it on a GPU (a CUDA context), its host PID mapped to ours
  (sources/pid_namespace.py);
- ``probe``: it has a gputop probe socket (started with ``gputop run``, or the probe preloaded);
- ``launcher``: it is ``torchrun`` / ``python -m torch.distributed.run|launch`` (its ranks are
  in its tree);
- ``launched``: its parent is SLURM's ``slurmstepd`` or ``srun`` (a task of a job step);
- ``match``: its command line matches ``--match REGEX`` (any process, Python or not); with
  ``--only-match`` that is the only rule.
A *job* is a qualifying process none of whose ancestors qualifies: the ranks under torchrun and
the DataLoader workers under a script are watched in their root's tree, not as jobs of their own.

Cost: one ``listdir("/proc")`` and one stat read per process per scan; a process's command line
and name are read once (cached by PID and start time). Nothing here needs ptrace: a process whose
files cannot be read is skipped and logged once.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from gputop.probe import wire
from gputop.sources.candidates import one_line
from gputop.sources.procfs import F_PPID, looks_like_python, parse_stat

log = logging.getLogger("gputop.agent")

LAUNCHER_RE = re.compile(r"(^|[/\s])torchrun(\s|$)|torch\.distributed\.(run|launch)(\s|$)")
SLURM_PARENTS = frozenset({"slurmstepd", "srun"})
F_STARTTIME = 19   # parse_stat's fields index of starttime (man 5 proc field 22)
MAX_CACHED = 20_000


@dataclass(frozen=True)
class Found:
    pid: int
    start: int          # start time in clock ticks since boot: (pid, start) names one process
    why: str
    command: str
    uid: int

    @property
    def ident(self) -> tuple[int, int]:
        return (self.pid, self.start)


@dataclass
class _Proc:
    ppid: int
    start: int
    python: bool
    comm: str
    cmdline: str
    uid: int


class Discovery:
    def __init__(self, match: str | None = None, exclude_tree_of: int | None = None, proc: str = "/proc",
                 gpu_pids=None, only_match: bool = False) -> None:
        self.match = re.compile(match) if match else None
        self.only_match = only_match   # the rules off: --match alone picks the jobs
        self.exclude_root = os.getpid() if exclude_tree_of is None else exclude_tree_of
        self.proc = proc
        self.gpu_pids = gpu_pids     # callable -> set of visible PIDs on a GPU (NVML, mapped), or None
        self._cache: dict[tuple[int, int], _Proc | None] = {}
        self._said: set[tuple[int, int]] = set()
        self.skipped = 0             # processes skipped for lack of permission, in all
        # the last scan's Python processes that are no job, each the top of its tree (not the
        # agent's own, none under a job): what the agent names when it finds nothing
        self.others: list[Found] = []

    def _read(self, pid: int) -> _Proc | None:
        """A process's facts; None when it is gone; cached by (PID, start time)."""
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as f:
                name, state, fields = parse_stat(f.read())
            ppid, start = int(fields[F_PPID]), int(fields[F_STARTTIME])
        except (OSError, ValueError, IndexError):
            return None
        if state == "Z":
            return None   # exited, not yet reaped: nothing to watch (and not a new job)
        key = (pid, start)
        if key in self._cache:
            return self._cache[key]
        try:
            with open(f"{self.proc}/{pid}/cmdline", "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read(8192).split(b"\0") if a]
            uid = os.stat(f"{self.proc}/{pid}").st_uid
        except PermissionError:
            self._skip(key, f"no permission to read process {pid}: skipped")
            self._cache[key] = None
            return None
        except OSError:
            return None
        try:
            exe = os.path.basename(os.readlink(f"{self.proc}/{pid}/exe"))
        except OSError:
            exe = None   # another user's process without ptrace rights: judged by name
        first = os.path.basename(argv[0]) if argv else None
        p = _Proc(ppid, start, looks_like_python(exe, first, name), name, " ".join(argv), uid)
        if len(self._cache) > MAX_CACHED:
            self._cache.clear()
        self._cache[key] = p
        return p

    def _skip(self, key, message: str) -> None:
        self.skipped += 1
        if key not in self._said:
            self._said.add(key)
            log.info(message)

    def _has_probe(self, pid: int, uid: int) -> bool:
        # The probe's default directories only: reading a job's environment for GPUTOP_PROBE_DIR
        # would need ptrace rights for every Python process on the node, every scan.
        for d in (wire.default_dir(uid), wire.fallback_dir({}, uid)):
            # the checks the probe client makes: a private directory, a socket of that user,
            # never through a symlink (a planted one must not make a process look probed)
            if d and wire.check_dir(d, uid) is None and wire.check_socket_file(wire.socket_path(d, pid), uid) is None:
                return True
        return False

    def scan(self) -> list[Found]:
        """The jobs on the node now (module docstring), oldest first."""
        try:
            pids = [int(n) for n in os.listdir(self.proc) if n.isdigit()]
        except OSError:
            return []
        procs = {pid: p for pid in pids if (p := self._read(pid)) is not None}
        live = {(pid, p.start) for pid, p in procs.items()}
        for k in [k for k in self._cache if k not in live]:
            del self._cache[k]
        self._said &= live
        on_gpu = set(self.gpu_pids()) if self.gpu_pids is not None else set()
        why: dict[int, str] = {}
        for pid, p in procs.items():
            parent = procs.get(p.ppid)
            reason = None
            if p.python and not self.only_match:
                if LAUNCHER_RE.search(p.cmdline):
                    reason = "launcher"
                elif pid in on_gpu:
                    reason = "gpu"
                elif parent is not None and parent.comm in SLURM_PARENTS:
                    reason = "launched"
                elif self._has_probe(pid, p.uid):
                    reason = "probe"
            if reason is None and self.match is not None and self.match.search(p.cmdline):
                reason = "match"
            if reason is not None:
                why[pid] = reason
        out = []
        for pid, reason in why.items():
            if self._excluded_or_covered(pid, procs, why):
                continue
            p = procs[pid]
            out.append(Found(pid, p.start, reason, one_line(p.cmdline or f"[{p.comm}]", 200), p.uid))
        out.sort(key=lambda f: (f.start, f.pid))
        self.others = self._others(procs, why)
        return out

    def criteria(self) -> str:
        """What a scan looks for, in words (the agent says it once at its start)."""
        if self.only_match:
            return f"processes whose command line matches '{self.match.pattern}' (--only-match)"
        rules = ("Python processes on a GPU (a CUDA context NVML lists), with a gputop probe socket, "
                 "torchrun / python -m torch.distributed.run|launch, or under SLURM (slurmstepd, srun)")
        if self.match is not None:
            return f"{rules}; and any process whose command line matches '{self.match.pattern}' (--match)"
        return rules

    def _others(self, procs: dict[int, _Proc], why: dict[int, str]) -> list[Found]:
        out = []
        for pid, p in procs.items():
            if not p.python or pid in why or pid == self.exclude_root:
                continue
            cur, hops, top = p.ppid, 0, True
            while cur in procs and hops < 64:
                if cur in why or cur == self.exclude_root or procs[cur].python:
                    top = False   # under a job, the agent's own, or below another Python process
                    break
                cur, hops = procs[cur].ppid, hops + 1
            if top:
                out.append(Found(pid, p.start, "", one_line(p.cmdline or f"[{p.comm}]", 200), p.uid))
        out.sort(key=lambda f: (-f.start, f.pid))   # the newest first: most likely the one just started
        return out

    def _excluded_or_covered(self, pid: int, procs: dict[int, _Proc], why: dict[int, str]) -> bool:
        """The agent itself and what it runs (py-spy, never a Python program), or a process below
        another qualifying process (watched in that one's tree)."""
        if pid == self.exclude_root:
            return True
        cur, hops = procs[pid].ppid, 0
        while cur in procs and hops < 64:
            if cur in why or (cur == self.exclude_root and not procs[pid].python):
                return True
            cur, hops = procs[cur].ppid, hops + 1
        return False
