"""Ranks: which processes of the target's tree are the ranks of a distributed job.

``gputop --pid LAUNCHER`` (torchrun, ``python -m torch.distributed.run``, mpirun, srun, a shell
wrapper) watches the launcher's whole tree; this module says which of its processes are ranks,
with their rank numbers, and publishes one ``rank`` sample per rank process (key: PID) when it is
first seen, when what is known about it changes, when it ends, and again every ``REPEAT_S``
seconds (so a replay that seeks far into a recording still knows every rank).

Where a rank's identity comes from:

* ``env``: the process's environment, read once per new process from /proc/PID/environ by the
  host source (``RankFinder``; it already walks the tree every tick). torchrun sets RANK,
  WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; Open MPI sets OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK;
  MPICH/Intel MPI (hydra) PMI_RANK/PMI_SIZE; Slurm's srun SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID.
  /proc/PID/environ is the environment the process was *started* with: a rank number a script
  sets in ``os.environ`` itself (``mp.spawn`` recipes) is not there -- the probe covers that.
* ``probe``: the in-process probe's own report (its hello and config messages: RANK from its
  environment, or ``torch.distributed.get_rank()``), published by the probe client source for
  processes whose environment has no rank or cannot be read (another user's process).

A child inherits its parent's environment, so DataLoader workers, a rank's own helpers and a
shell wrapper's child all carry the same RANK. Processes with the same identity (family, rank,
world size) form a group, and the group's rank is its top-most *Python* process (a wrapper
shell's Python child, not the shell; a rank, not its DataLoader workers); a group without a
Python process (a C++ MPI program) is represented by its top-most process once
``WRAPPER_GRACE_S`` has passed without a Python member appearing. A process whose descendants include ranks of another
identity is a launcher, not a rank (an ``srun``-started torchrun has SLURM_PROCID; a Kubernetes
PyTorchJob pod's torchrun has RANK = the node's rank). Identities that a launcher could carry
too (RANK without torchrun's TORCHELASTIC_RUN_ID, SLURM_PROCID, PMI_RANK) wait ``GRACE_S`` for
such children to appear before they are declared; torchrun's and Open MPI's workers (which no
launcher resembles) are declared at once.

``gpu`` in a ``rank`` sample is None here: sources do not see each other's samples, so the NVML
index of a rank's GPU is joined later (gputop.derive.ranks.rank_table, from ``gpu_procs``).
``gpu_hint`` is what the environment suggests (CUDA_VISIBLE_DEVICES and LOCAL_RANK); it is a
CUDA ordinal or a UUID, which equals the NVML index only with CUDA_DEVICE_ORDER=PCI_BUS_ID or on
a machine of identical GPUs.

Sources must not import gputop.session.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping

from gputop.catalogue import KIND_RANK
from gputop.model import Sample
from gputop.sources.procfs import is_python_process, still_running

SOURCE_ENV, SOURCE_PROBE = "env", "probe"
STATE_RUNNING, STATE_EXITED = "running", "exited"

GRACE_S = 5.0          # an identity a launcher may carry too (RANK without torchrun's markers,
                       # SLURM_PROCID, PMI_RANK): wait this long for ranks to appear below it
WRAPPER_GRACE_S = 2.0  # a group without a Python process: wait for a wrapper's Python child
REPEAT_S = 30.0        # re-publish every rank this often (a replay seeks with a 120 s window)
MAX_ENVIRON = 1 << 20  # bytes of /proc/PID/environ read at most
MAX_STR = 200


@dataclass(frozen=True)
class RankFamily:
    name: str
    rank_var: str
    size_var: str
    local_var: str
    local_size_var: str | None


FAMILIES: tuple[RankFamily, ...] = (
    RankFamily("torch", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    RankFamily("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"),
    RankFamily("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    RankFamily("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)


MAX_RANK_VALUE = 1 << 31


def _env_int(env: Mapping[str, str], name: str | None) -> int | None:
    if name is None:
        return None
    v = env.get(name)
    if v is None:
        return None
    try:
        n = int(str(v).strip())
    except ValueError:
        return None
    # (torch keeps ranks in 32 bits; a larger value from the target's environment would also be
    # written into the recording past what its reader takes)
    return n if 0 <= n < MAX_RANK_VALUE else None


def rank_env(env: Mapping[str, str]) -> dict | None:
    """The rank facts an environment holds, or None when it names no rank. Families are tried
    in order (torch's RANK first: torchrun under srun has both). Slurm's SLURM_PROCID counts
    only inside a job step (SLURM_STEP_ID set): a batch script has SLURM_PROCID=0 too."""
    for fam in FAMILIES:
        rank = _env_int(env, fam.rank_var)
        if rank is None:
            continue
        if fam.name == "slurm" and "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
            continue
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        elastic = "TORCHELASTIC_RUN_ID" in env
        return {
            "family": fam.name,
            "rank_var": fam.rank_var,
            "rank": rank,
            "world_size": _env_int(env, fam.size_var),
            "local_rank": _env_int(env, fam.local_var),
            "local_world_size": _env_int(env, fam.local_size_var),
            "cuda_visible_devices": cvd[:MAX_STR] if isinstance(cvd, str) else None,
            "restart_count": _env_int(env, "TORCHELASTIC_RESTART_COUNT"),
            # torchrun's workers and mpirun's processes: no launcher carries these.
            "certain": elastic or fam.name == "openmpi",
        }
    return None


def gpu_hint(local_rank: int | None, cuda_visible_devices: str | None) -> str | None:
    """The device a rank most likely uses, from its environment: the one device it may see, or
    entry LOCAL_RANK of CUDA_VISIBLE_DEVICES, or LOCAL_RANK itself (the usual
    ``cuda:LOCAL_RANK``). A CUDA ordinal or a GPU UUID as written; None when nothing says."""
    if cuda_visible_devices is not None:
        entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
        if not entries or entries[0] in ("-1", "NoDevFiles"):
            return None
        if len(entries) == 1:
            return entries[0][:MAX_STR]
        if local_rank is not None and local_rank < len(entries):
            return entries[local_rank][:MAX_STR]
        return None
    return None if local_rank is None else str(local_rank)


# The variables rank_env reads: only these are picked out of an environment (one regular
# expression over the raw bytes, no dict of the whole environment).
RANK_VARS = tuple(sorted({v for f in FAMILIES for v in (f.rank_var, f.size_var, f.local_var, f.local_size_var) if v}
                         | {"CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                            "SLURM_STEP_ID", "SLURM_STEPID"}))
_RANK_VARS_RE = re.compile(rb"(?:^|\0)(" + b"|".join(re.escape(v.encode()) for v in RANK_VARS) + rb")=([^\0]*)")


class EnvironNotReady(OSError):
    """/proc/PID/environ read empty: the process is inside its exec. A vfork()ing parent (Python's
    subprocess) resumes when the child's new memory is in place, before the kernel has copied
    the new environment into it; a read then gives nothing. Read it again later."""


def read_environ(pid: int) -> dict[str, str]:
    """The rank-related variables (``RANK_VARS``) of /proc/PID/environ. Raises PermissionError
    (another user's process, or a non-dumpable one without CAP_SYS_PTRACE),
    FileNotFoundError/ProcessLookupError (gone) and EnvironNotReady (mid-exec)."""
    fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    try:
        parts = [os.read(fd, 16384)]   # most environments are a few KiB: no MiB buffer per read
        while len(parts[-1]) == 16384 and len(parts) * 16384 < MAX_ENVIRON:
            parts.append(os.read(fd, 16384))
    finally:
        os.close(fd)
    raw = b"".join(parts)
    if not raw:
        # (a process started with an empty environment reads so too: it names no rank, and the
        # cost is one read a tick)
        raise EnvironNotReady(f"/proc/{pid}/environ is empty: the process may be inside its exec")
    return {m[1].decode(): m[2].decode("utf-8", "replace") for m in _RANK_VARS_RE.finditer(raw)}


def node_name() -> str:
    return socket.gethostname()


def rank_data(pid: int, facts: Mapping, source: str, state: str, node: str | None, launcher_pid: int | None,
              name: str | None = None, why: str | None = None) -> dict:
    """The data of a ``rank`` sample (docs/metrics.md, "Ranks"): one schema for both sources."""
    cvd = facts.get("cuda_visible_devices")
    local_rank = facts.get("local_rank")
    return {
        "pid": pid,
        "rank": facts.get("rank"),
        "local_rank": local_rank,
        "world_size": facts.get("world_size"),
        "local_world_size": facts.get("local_world_size"),
        "node": node,
        "gpu": None,
        "gpu_hint": gpu_hint(local_rank, cvd),
        "cuda_visible_devices": cvd,
        "source": source,
        "rank_var": facts.get("rank_var"),
        "restart_count": facts.get("restart_count"),
        "state": state,
        "launcher_pid": launcher_pid,
        "name": name[:MAX_STR] if isinstance(name, str) else None,
        "why": why,
    }


# ---------------------------------------------------------------------------------------------
# Finding the ranks of a tree (used by the host source every tick)


@dataclass
class _Seen:
    name: str | None
    facts: dict | None       # rank_env() of its environment; None: no rank there (or unreadable)
    python: bool
    first_t: float
    denied: bool = False
    cmdline: tuple | None = None   # as read with it: an exec changes it (the name may stay "python")


class RankFinder:
    """Which live processes of the target's tree are ranks, from their environments.

    ``update(t, tree)`` with ``tree = {pid: (ppid, name, cmdline)}`` of every live process of
    the tree returns the ``rank`` samples to publish now; ``end_all(t)`` those for a target that
    exited. The environment of a process is read once (again only when its name or command line
    changes: an exec brings a new one; torchrun's ranks keep the launcher's name, "python", and a
    read between their fork and their exec saw the launcher's environment, no RANK).
    ``read_env`` is injectable for tests of the grouping rules.
    """

    def __init__(self, target_pid: int, node: str | None = None, grace_s: float = GRACE_S,
                 wrapper_grace_s: float = WRAPPER_GRACE_S, repeat_s: float = REPEAT_S,
                 read_env=read_environ) -> None:
        self.target_pid = target_pid
        self.node = node if node is not None else node_name()
        self.grace_s, self.wrapper_grace_s, self.repeat_s = grace_s, wrapper_grace_s, repeat_s
        self.read_env = read_env
        self._seen: dict[int, _Seen] = {}
        self._said: dict[int, dict] = {}        # pid -> data last published (running or exited)
        self._said_at: dict[int, float] = {}
        self.denied: set[int] = set()           # live processes whose environment we may not read
        self.env_reads = 0

    @property
    def running(self) -> list[int]:
        return sorted(pid for pid, d in self._said.items() if d["state"] == STATE_RUNNING)

    def _look(self, pid: int, name: str | None, cmdline: list[str] | None, t: float) -> _Seen:
        seen = self._seen.get(pid)
        args = tuple(cmdline) if cmdline is not None else None
        if seen is not None and (seen.name == name and seen.cmdline == args or args == ()):
            # (an exiting process or a zombie reads an empty command line and no environment: the
            # same process, about to leave the tree; read again, it was "no longer a rank" and
            # ended with that why, not "exited", when its launcher reaped it late -- under load)
            return seen
        facts, denied = None, False
        try:
            self.env_reads += 1
            facts = rank_env(self.read_env(pid))
        except PermissionError:
            denied = True
        except EnvironNotReady:
            args = None   # read again at the next tick
        except OSError:
            if seen is not None:
                return seen   # gone, or a zombie: what it was, until it leaves the tree
            # (else: it leaves the tree at the next tick)
        first_t = seen.first_t if seen is not None else t
        seen = self._seen[pid] = _Seen(name, facts, is_python_process(pid, name, cmdline), first_t, denied, args)
        return seen

    def update(self, t: float, tree: Mapping[int, tuple]) -> list[Sample]:
        for pid in [p for p in self._seen if p not in tree]:
            del self._seen[pid]
        for pid, (ppid, name, cmdline) in tree.items():
            self._look(pid, name, cmdline, t)
        self.denied = {pid for pid, s in self._seen.items() if s.denied}
        parent = {pid: info[0] for pid, info in tree.items()}

        def chain(pid: int) -> list[int]:
            """pid's ancestors inside the tree, nearest first."""
            out, seen = [], {pid}
            p = parent.get(pid)
            while p is not None and p in tree and p not in seen:
                out.append(p)
                seen.add(p)
                p = parent.get(p)
            return out

        groups: dict[tuple, list[int]] = {}
        for pid, s in self._seen.items():
            if s.facts is not None:
                groups.setdefault((s.facts["family"], s.facts["rank"], s.facts["world_size"]), []).append(pid)
        ancestors = {pid: chain(pid) for pids in groups.values() for pid in pids}
        # A process with a rank of another identity below it launched ranks: it is no rank.
        launchers = {a for key, pids in groups.items() for pid in pids for a in ancestors[pid]
                     if self._seen.get(a) is not None and self._seen[a].facts is not None
                     and (self._seen[a].facts["family"], self._seen[a].facts["rank"],
                          self._seen[a].facts["world_size"]) != key}
        ranks: dict[int, tuple[dict, str]] = {}
        replaced_by: dict[int, int] = {}
        for key, pids in groups.items():
            members = [p for p in pids if p not in launchers]
            if not members:
                continue
            # torchrun's own markers first (a PyTorchJob pod's torchrun may carry the same RANK
            # and WORLD_SIZE as its only worker), then the top-most (a rank before its workers).
            members.sort(key=lambda p: (not self._seen[p].facts["certain"], len(ancestors[p]), p))
            python = [p for p in members if self._seen[p].python]
            rep = python[0] if python else members[0]
            facts = self._seen[rep].facts
            first_t = min(self._seen[p].first_t for p in members)
            age = t - first_t
            if not python and age < self.wrapper_grace_s:
                continue  # a wrapper whose Python child may be about to start
            if not facts["certain"] and age < self.grace_s:
                continue  # maybe a launcher whose ranks have not started yet
            ranks[rep] = (facts, self._seen[rep].name)
            for p in members:
                if p != rep:
                    replaced_by[p] = rep
        out: list[Sample] = []
        for pid, d in list(self._said.items()):
            if d["state"] != STATE_RUNNING or pid in ranks:
                continue
            if pid not in tree:
                why = "exited" if not still_running(pid) else \
                    "left the target's process tree (still running, no longer watched)"
            elif pid in launchers:
                why = "not a rank: it started ranks of its own"
            elif pid in replaced_by:
                why = f"not a rank: PID {replaced_by[pid]} is that rank's process"
            else:
                why = "no longer a rank"
            out.append(self._say(t, {**d, "state": STATE_EXITED, "why": why}))
        for pid, d in list(self._said.items()):
            if d["state"] == STATE_EXITED and t - self._said_at[pid] >= self.repeat_s:
                out.append(self._say(t, d))   # ended ranks too: a replay seeking far still shows them
        for pid, (facts, name) in sorted(ranks.items()):
            launcher = self.target_pid if pid != self.target_pid else parent.get(pid)
            data = rank_data(pid, facts, SOURCE_ENV, STATE_RUNNING, self.node, launcher, name)
            if data != self._said.get(pid) or t - self._said_at.get(pid, -1e18) >= self.repeat_s:
                out.append(self._say(t, data))
        return out

    def end_all(self, t: float, why: str = "exited") -> list[Sample]:
        """Every rank still running is over (the target exited and its tree is no longer read)."""
        out = []
        for pid, d in list(self._said.items()):
            if d["state"] == STATE_RUNNING:
                gone = not still_running(pid)
                out.append(self._say(t, {**d, "state": STATE_EXITED, "why": why if gone else
                                         "the target exited; this rank still runs but is no longer watched"}))
        self._seen.clear()
        self.denied = set()
        return out

    def _say(self, t: float, data: dict) -> Sample:
        self._said[data["pid"]] = data
        self._said_at[data["pid"]] = t
        if data["state"] == STATE_EXITED and len(self._said) > 4096:
            # Bounded memory over very long sessions with elastic restarts.
            for pid in [p for p, d in self._said.items() if d["state"] == STATE_EXITED][:1024]:
                self._said.pop(pid, None)
                self._said_at.pop(pid, None)
        return Sample(t, KIND_RANK, str(data["pid"]), data)
