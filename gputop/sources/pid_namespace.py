"""NVML's PIDs and the processes gputop can see, when the two live in different PID namespaces.

NVML reports the PIDs of the *host's* PID namespace: the driver is not namespace-aware. gputop in
a container without ``hostPID`` sees its own namespace's PIDs in /proc, so NVML's PID 4242 may be
nobody here, or (worse) a different process that happens to have the number 4242 here. Every GPU
monitor that compares the numbers shows another container's job as yours (nvitop#134, nvtop#149,
gpustat#117). So gputop maps the numbers, and names the method it used:

- ``same``: gputop runs in the host's PID namespace (kernel threads are visible: PID 2 is
  ``kthreadd``): NVML's PIDs are ours, used as they are.
- ``nspid``: a view of the host's /proc is mounted (``host_proc``, e.g. ``-v /proc:/host/proc:ro``):
  each host process's ``NSpid:`` line in /proc/PID/status lists its PID in every namespace from the
  host's down to its own; a host PID maps to the last entry when that process is in gputop's PID
  namespace (same ``ns/pid`` link), and to nothing otherwise (another container's process).
- ``elimination``: no host view. Processes here that hold a GPU open (``/dev/nvidia<N>`` among
  their descriptors) are paired with NVML's entries GPU by GPU; a GPU's entry is mapped only when
  the pairing is unique: one entry and one process on it, or the GPU memory each process reports
  (the probe's CUDA memory) picks one entry within ``MEM_TOLERANCE_BYTES``. Anything left is
  unmapped.
- ``none``: nothing could be mapped (no GPU users visible here).

An unmapped NVML PID is never shown as a process of the target: a wrong name is worse than none.
Standard library only; reads /proc, never ptrace.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

METHOD_SAME, METHOD_NSPID, METHOD_ELIMINATION, METHOD_NONE = "same", "nspid", "elimination", "none"
MEM_TOLERANCE_BYTES = 768 << 20   # NVML's usedGpuMemory = the allocator's reserve + the CUDA context (~300-600 MiB)
_NVIDIA_DEV = re.compile(r"^/dev/nvidia(\d+)$")


def read_nspid(pid: int | str, proc: str = "/proc") -> list[int] | None:
    """The ``NSpid:`` entries of a process (its PID from ``proc``'s namespace down to its own),
    None when unreadable or absent (kernels before 4.1)."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            data = f.read(8192)
    except OSError:
        return None
    for line in data.splitlines():
        if line.startswith(b"NSpid:"):
            try:
                return [int(x) for x in line.split()[1:]]
            except ValueError:
                return None
    return None


def pid_ns(pid: int | str = "self", proc: str = "/proc") -> str | None:
    """The PID namespace's identity (``pid:[4026531836]``), None when unreadable."""
    try:
        return os.readlink(f"{proc}/{pid}/ns/pid")
    except OSError:
        return None


def in_host_namespace(proc: str = "/proc") -> bool:
    """True in the host's (initial) PID namespace: only there are kernel threads visible, and
    PID 2 is always kthreadd. Inside a PID namespace PID 2 is an ordinary process or nobody."""
    try:
        with open(f"{proc}/2/comm", "rb") as f:
            return f.read(64).strip() == b"kthreadd"
    except OSError:
        return False


def gpus_held(pid: int | str, proc: str = "/proc") -> set[int] | None:
    """GPU minors (``/dev/nvidia<N>``) among a process's descriptors; None when they cannot be
    read (another user's process without the right)."""
    try:
        names = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return None
    out: set[int] = set()
    for n in names:
        try:
            m = _NVIDIA_DEV.match(os.readlink(f"{proc}/{pid}/fd/{n}"))
        except OSError:
            continue
        if m:
            out.add(int(m.group(1)))
    return out


@dataclass
class Mapping:
    """NVML (host) PID -> the PID gputop sees, or None; ``method`` says how (module docstring)."""

    method: str
    visible: dict[int, int | None] = field(default_factory=dict)
    note: str = ""

    def get(self, host_pid: int) -> int | None:
        return self.visible.get(host_pid)

    def describe(self) -> str:
        mapped = sum(1 for v in self.visible.values() if v is not None)
        return f"PID mapping: {self.method} ({mapped} of {len(self.visible)} NVML processes mapped){self.note}"


def by_nspid(host_pids, host_proc: str, proc: str = "/proc") -> Mapping:
    """Map through a view of the host's /proc (module docstring, ``nspid``)."""
    mine = pid_ns("self", proc)
    out: dict[int, int | None] = {}
    for hp in host_pids:
        ns = read_nspid(hp, host_proc)
        # in our namespace: its ns/pid link (read through the host view) is ours, and its last
        # NSpid entry is its PID here; anything else belongs to someone else
        if ns and mine is not None and pid_ns(hp, host_proc) == mine:
            out[hp] = ns[-1]
        else:
            out[hp] = None
    return Mapping(METHOD_NSPID, out)


def by_elimination(nvml: dict[int, tuple[int | None, set[int]]], users: dict[int, tuple[int | None, set[int]]]
                   ) -> Mapping:
    """Pair NVML's entries {host PID: (GPU memory bytes or None, {GPU minor})} with the processes
    here that hold GPUs {visible PID: (GPU memory they report or None, {GPU minor})}: only unique
    pairings count (module docstring, ``elimination``)."""
    out: dict[int, int | None] = {hp: None for hp in nvml}
    taken: set[int] = set()
    changed = True
    while changed:   # each unique pairing can make another one unique
        changed = False
        for gpu in sorted({g for _m, gs in nvml.values() for g in gs}):
            entries = [hp for hp, (_m, gs) in nvml.items() if gpu in gs and out[hp] is None]
            procs = [vp for vp, (_m, gs) in users.items() if gpu in gs and vp not in taken]
            if not entries or not procs:
                continue
            if len(entries) == 1 and len(procs) == 1:
                pair = (entries[0], procs[0])
            else:
                pair = _by_memory(entries, procs, nvml, users)
            if pair is not None:
                out[pair[0]] = pair[1]
                taken.add(pair[1])
                changed = True
    return Mapping(METHOD_ELIMINATION if taken else METHOD_NONE, out)


def _by_memory(entries, procs, nvml, users) -> tuple[int, int] | None:
    """The one (entry, process) whose memories agree within the tolerance while no other
    entry or process does for either of them."""
    close = [(hp, vp) for hp in entries for vp in procs
             if nvml[hp][0] is not None and users[vp][0] is not None
             and abs(nvml[hp][0] - users[vp][0]) <= MEM_TOLERANCE_BYTES]
    for hp, vp in close:
        if sum(1 for h, v in close if h == hp or v == vp) == 1:
            return hp, vp
    return None


def _own_tree(proc: str) -> set[int]:
    """This process and its descendants, as seen in ``proc`` (ppid from /proc/PID/stat)."""
    me = os.getpid()
    parent: dict[int, int] = {}
    try:
        names = [n for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return {me}
    for n in names:
        try:
            with open(os.path.join(proc, n, "stat"), "rb") as f:
                parent[int(n)] = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {me}, True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def map_pids(nvml: dict[int, tuple[int | None, set[int]]], *, proc: str = "/proc", host_proc: str | None = None,
             reported_mem: dict[int, int] | None = None) -> Mapping:
    """NVML's PIDs -> visible PIDs by the best method available here (module docstring).
    ``nvml``: {host PID: (GPU memory bytes or None, {GPU index})}; ``reported_mem``: GPU memory
    that visible processes report themselves (the probe), to tell apart several on one GPU."""
    if in_host_namespace(proc):
        return Mapping(METHOD_SAME, {hp: hp for hp in nvml})
    if host_proc and os.path.isdir(host_proc):
        return by_nspid(list(nvml), host_proc, proc)
    users: dict[int, tuple[int | None, set[int]]] = {}
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        pids = []
    mine = _own_tree(proc)   # gputop (NVML holds /dev/nvidia*) and its children are never a job
    for vp in pids:
        if vp in mine:
            continue
        held = gpus_held(vp, proc)
        if held:
            users[vp] = ((reported_mem or {}).get(vp), held)
    m = by_elimination(nvml, users)
    m.note = "" if users else ": no process here holds a GPU open (or their descriptors are unreadable)"
    return m
