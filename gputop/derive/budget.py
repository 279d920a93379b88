"""The time budget: where the training loop's wall time went.

For a stretch of time, the loop's wall time is split into shares that sum to 1: the GPU busy,
and, for the moments it was not, what the main thread was doing *at those moments* — waiting
for data, for a device sync, for the GIL, in a collective, for a core, in file I/O, blocked
(sleep, locks, network), or running Python/CPU code named by its frames. This is the join
HTA makes offline from a trace ("host wait"), made live from two samplers:

- the main thread's py-spy samples, each placed at its moment (``seq`` of a ``stacks`` sample:
  sample i of n fell at about ``t0 + (i + 0.5) * dur_s / n``), named by the frame tables of
  gputop.derive.frame_rules;
- the GPU's busy fraction at that moment: GPM SM active (each sample covers the >= 100 ms
  since the previous one), or util.gpu without GPM (labelled: it counts any kernel running).

A moment whose frames say only "Python code" is split further by the kernel's view of the
thread in that second (``thread_kernel``): GIL wait, run-queue wait, blocked off the CPU, file
I/O, or on a CPU — the same fusion gputop.derive.threads makes for a whole window, made per
second. A moment weighs ``1``: ``busy`` of it is GPU time, ``1 - busy`` goes to its cause.

Without stacks (no ptrace), the GPU's idle time is one share, ``unknown``; without GPU
counters, the shares are of the main thread's time and ``gpu_busy`` is None. Nothing is guessed.

``Budget`` accumulates moments; the same function makes the window's budget (the UI, the
verdicts, Prometheus) and the session's (the report), so they cannot disagree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gputop.derive import frame_rules as fr

# The shares, in the order the UI and the report show them. GPU_BUSY first; the others are
# the ways the loop can keep the GPU waiting.
GPU_BUSY, DATA, SYNC, GIL, COLLECTIVE, CPU_WAIT, IO, BLOCKED, CPU, UNKNOWN = (
    "gpu_busy", "data", "sync", "gil", "collective", "cpu_wait", "io", "blocked", "cpu", "unknown")
CATEGORIES = (GPU_BUSY, DATA, SYNC, GIL, COLLECTIVE, CPU_WAIT, IO, BLOCKED, CPU, UNKNOWN)
LOST = CATEGORIES[1:]
LABELS = {
    GPU_BUSY: "GPU busy", DATA: "waiting for data", SYNC: "waiting on a device sync", GIL: "waiting for the GIL",
    COLLECTIVE: "in collectives", CPU_WAIT: "waiting for a CPU core", IO: "file I/O", BLOCKED: "blocked (sleep, locks, network)",
    CPU: "Python/CPU code", UNKNOWN: "not attributable",
}
HELP = {
    GPU_BUSY: "the GPU busy (GPM SM active; util.gpu without GPM) at the moments the main thread was sampled",
    DATA: "the GPU idle while the main thread waited in next(DataLoader)",
    SYNC: "the GPU idle while the main thread waited for it (synchronize, .item(), .cpu()): the launch gap after a sync",
    GIL: "the GPU idle while the main thread waited for the GIL (kernel: futex on the Python runtime's GIL)",
    COLLECTIVE: "the GPU idle while the main thread was in a torch.distributed collective",
    CPU_WAIT: "the GPU idle while the main thread was ready to run but had no core (run queue)",
    IO: "the GPU idle while the main thread did file I/O: torch.save/load, safetensors, numpy, logging, writes",
    BLOCKED: "the GPU idle while the main thread was blocked off the CPU: sleep, locks, queues, sockets",
    CPU: "the GPU idle while the main thread ran Python or CPU code (named by its frames)",
    UNKNOWN: "the GPU idle with no stack to say why (no py-spy sample, or no Python frame)",
}

GPU_SAMPLE_MAX_S = 2.0     # a moment further than this from the next GPU sample has no GPU value (the
                           # fast loop's gaps reach 4 intervals: 1.6 s while the job is calm)
TOP_FRAMES = 8             # frames kept per category in a budget's evidence

# Files that are not the job's own code: the frame that names a moment is the innermost one
# outside these (the user's line that called a torch op, or the framework's own code).
_LIBRARY_PARTS = ("/site-packages/torch/", "/dist-packages/torch/", "<frozen ", "/site-packages/numpy/",
                  "/dist-packages/numpy/", "/gputop/probe/")  # (the probe's own hooks wrap next() and step())
FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning", "lightning_fabric", "deepspeed",
              "timm", "torchvision", "datasets")
# Model-definition code, whoever ships it: a model's forward launches its kernels, so its CPU
# time is kernel launches, not a framework's per-step code (hooks, logging, closures)
MODEL = "model"
MODEL_PARTS = ("transformers/models/", "torchvision/models/", "timm/models/", "timm/layers/", "diffusers/models/",
               "transformers/pytorch_utils.py", "transformers/activations.py")
# training frameworks whose own code may run inside a module call (their wrappers' forward)
_WRAPPERS = ("lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "deepspeed")


def owner(path: str) -> str:
    """Whose code a file is: "user", "torch", "stdlib", "library", "model" (a model library's
    model definitions), or a framework's name."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            rest = path.split(marker, 1)[1]
            pkg = rest.split("/", 1)[0]
            if pkg in ("torch", "functorch"):
                return "torch"
            if any(rest.startswith(part) for part in MODEL_PARTS):
                return MODEL
            return pkg if pkg in FRAMEWORKS else "library"
    if path.startswith("<frozen") or ("/lib/python3" in path and "/site-packages/" not in path):
        return "stdlib"
    if "/gputop/probe/" in path:
        return "gputop"
    return "user"


def _is_library(path: str) -> bool:
    if any(p in path for p in _LIBRARY_PARTS):
        return True
    return path.startswith("<") or ("/lib/python3" in path and "-packages/" not in path)


def frame_name(f: list) -> str:
    name, path, line = f[0], f[1], f[2]
    return f"{name} ({path.rsplit('/', 1)[-1]}:{line})"


@dataclass(frozen=True, slots=True)
class Naming:
    """What one distinct stack says, computed once per stack."""
    cat: str                 # a budget category, or "python" (to be split by the kernel's view)
    frame: str | None        # the innermost frame outside torch/stdlib: "func (file.py:line)"
    path: str | None         # its file (for the owner)
    leaf_owner: str          # whose code ``frame`` is (owner())
    hint: str | None         # phase hint (frame_rules.phase_hint)
    # inside backward(): on a GPU, autograd's own device thread launches the backward kernels
    # while this thread waits for it, so its time off the CPU is CPU work done for it
    engine_wait: bool = False
    site: str | None = None  # "file:line" of ``frame``: where the probe counts a device sync (moments.py)


def name_stack(frames: list, stack: list[int], leaf_code: str | None) -> Naming:
    """What one stack says. Memoised by content in moments.naming_of (its caller): py-spy
    windows repeat the same stacks under new frame tables."""
    hint = fr.phase_hint(frames, stack)
    own = None
    for i in reversed(stack):
        if 0 <= i < len(frames) and not _is_library(frames[i][1]):
            own = frames[i]
            break
    if own is None and stack and 0 <= stack[-1] < len(frames):
        own = frames[stack[-1]]
    # whose code holds the CPU: the owner of that frame (a torch op called from the user's line
    # is the user's cost; Lightning's hooks are Lightning's)
    leaf_owner = owner(own[1]) if own is not None else "unknown"
    frame = frame_name(own) if own is not None else None
    path = own[1] if own is not None else None
    site = f"{own[1]}:{own[2]}" if own is not None else None
    if fr.io_why(frames, stack, leaf_code):
        return Naming(IO, frame, path, leaf_owner, hint, site=site)
    cat, _why = fr.classify(frames, stack, leaf_code)
    cat = {fr.DATA: DATA, fr.COLLECTIVE: COLLECTIVE, fr.CUDA: SYNC, fr.IDLE: BLOCKED,
           fr.UNKNOWN: UNKNOWN}.get(cat, "python")
    engine = any(0 <= i < len(frames) and frames[i][0].rpartition(".")[2] == "_engine_run_backward"
                 and frames[i][1].endswith("torch/autograd/graph.py") for i in stack)
    if engine or (leaf_owner not in _WRAPPERS and _in_module_call(frames, stack)):
        # inside an nn.Module's call (the user's forward too) or a backward pass: the model
        # launching its kernels
        leaf_owner = MODEL
    return Naming(cat, frame, path, leaf_owner, hint, engine, site)


def _in_module_call(frames: list, stack: list[int]) -> bool:
    """Inside a module's call, with no training framework's code between the innermost one and
    the stack's end (Lightning's DDP wrapper calls the user's training_step from its forward:
    that step's own CPU code is not the model's)."""
    inside = False
    for i in stack:
        if 0 <= i < len(frames):
            name, path = frames[i][0], frames[i][1]
            if path.endswith("torch/nn/modules/module.py") and name.rpartition(".")[2] in ("_call_impl",
                                                                                         "_wrapped_call_impl"):
                inside = True
            elif inside and owner(path) in _WRAPPERS:
                inside = False
    return inside


def parts_of(m: "Moment") -> dict[str, float]:
    """The categories one moment's idle time goes to, as fractions summing to 1."""
    n = m.naming
    if n.cat != "python":
        return {n.cat: 1.0}
    parts = (m.split or KernelSplit({CPU: 1.0})).shares
    if n.engine_wait and parts.get(BLOCKED):
        parts = dict(parts)
        parts[CPU] = parts.get(CPU, 0.0) + parts.pop(BLOCKED)
    return parts


@dataclass(slots=True)
class KernelSplit:
    """How a "Python code" moment of one second splits, from the kernel's view of the thread
    in that second: fractions of GIL, CPU_WAIT, BLOCKED, IO and CPU summing to 1."""
    shares: dict

    @staticmethod
    def of(row: dict, named_off_share: float) -> "KernelSplit":
        """``row``: the thread's wait-class counts and schedstat seconds for that second;
        ``named_off_share``: the share of its py-spy samples that frames already explain as a
        wait (data, sync, blocked...), whose off-CPU time must not be charged twice."""
        k = {c: row.get(c) or 0 for c in ("run", "gil", "lock", "sleep", "poll", "io", "other")}
        kn = sum(k.values())
        python = max(1e-9, 1.0 - named_off_share)
        if kn <= 0:
            return KernelSplit({CPU: 1.0})
        gil = min(1.0, k["gil"] / kn / python)
        off_io = k["io"] / kn
        off_block = (k["lock"] + k["sleep"] + k["poll"] + k["other"]) / kn
        # off-CPU time not explained by the named waits falls to these "Python" moments
        unexplained = max(0.0, off_io + off_block - named_off_share) / python
        unexplained = min(unexplained, 1.0 - gil)
        io = unexplained * (off_io / (off_io + off_block)) if off_io + off_block > 0 else 0.0
        blocked = unexplained - io
        on = max(0.0, 1.0 - gil - unexplained)
        cpu_s, runq_s = row.get("cpu_s"), row.get("runq_s")
        wait = on * runq_s / (cpu_s + runq_s) if (cpu_s is not None and runq_s is not None and cpu_s + runq_s > 0) else 0.0
        return KernelSplit({GIL: gil, IO: io, BLOCKED: blocked, CPU_WAIT: wait, CPU: on - wait})


@dataclass(slots=True)
class Moment:
    t: float
    dt: float                # seconds this sample stands for
    busy: float | None       # 0-1, None without GPU counters
    naming: Naming
    split: KernelSplit | None = None  # for "python" moments
    # the budget counts dt x weight: within a probe window the moments in next(DataLoader) stand
    # for the probe's measured data wait, the others for the rest (derive/moments._calibrate)
    weight: float = 1.0
    # a "Python code" moment that may relaunch after a device sync: no wait of another kind since
    # the last sync in its window (derive/moments._mark_relaunch); True where the order is unknown
    relaunch: bool = True


_FRAMED = frozenset((CPU, IO, BLOCKED, SYNC, DATA, GIL, CPU_WAIT))   # categories whose frames are kept


@dataclass
class Budget:
    """Shares of wall time (seconds, then fractions) accumulated from moments."""
    seconds: Counter = field(default_factory=Counter)
    frames: dict = field(default_factory=dict)       # category -> Counter(frame -> seconds)
    owners: Counter = field(default_factory=Counter)  # whose code the CPU moments ran (seconds)
    paths: dict = field(default_factory=dict)         # frame -> file (for owners of top frames)
    total_s: float = 0.0
    with_gpu: bool = True
    named_blocked_s: float = 0.0   # the part of BLOCKED in calls the frames name (sleep, lock, queue...)
    relaunch_s: float = 0.0        # the part of CPU in relaunches after a device sync (Moment.relaunch)

    def add(self, m: Moment) -> None:
        # (this runs for every moment of every window every second: the arithmetic is the
        # plain one, in the same order, so the seconds are the same to the last bit)
        busy, dt = m.busy, m.dt * m.weight
        if busy is not None:
            idle = 1.0 - busy
            self.seconds[GPU_BUSY] += dt * busy
        else:
            idle = 1.0
            self.with_gpu = False
        self.total_s += dt
        w = dt * idle
        if w <= 0:
            return
        n = m.naming
        if n.cat != "python":
            self._charge(n, n.cat, w)   # parts_of: all of it to the category (w * 1.0 is w)
            return
        for cat, share in parts_of(m).items():
            if not share <= 0:   # (as the loop this replaces: a NaN share is charged)
                self._charge(n, cat, w * share)
                if cat == CPU and m.relaunch:
                    self.relaunch_s += w * share

    def _charge(self, n: Naming, cat: str, s: float) -> None:
        self.seconds[cat] += s
        if cat == BLOCKED and n.cat == BLOCKED:
            self.named_blocked_s += s   # a known blocking call by its frames, not the kernel's guess
        if n.frame is not None and cat in _FRAMED:
            got = self.frames.get(cat)
            if got is None:
                got = self.frames[cat] = Counter()
            got[n.frame] += s
            if n.frame not in self.paths:
                self.paths[n.frame] = n.path
        if cat == CPU:
            self.owners[n.leaf_owner] += s

    def merge(self, other: "Budget") -> None:
        """Add another budget's time (the report joins training and checkpointing)."""
        self.seconds.update(other.seconds)
        for c, fs in other.frames.items():
            self.frames.setdefault(c, Counter()).update(fs)
        self.owners.update(other.owners)
        for f, p in other.paths.items():
            self.paths.setdefault(f, p)
        self.total_s += other.total_s
        self.with_gpu = self.with_gpu and other.with_gpu
        self.named_blocked_s += other.named_blocked_s
        self.relaunch_s += other.relaunch_s

    def shares(self) -> dict[str, float | None]:
        if self.total_s <= 0:
            return dict.fromkeys(CATEGORIES)
        out = {c: self.seconds.get(c, 0.0) / self.total_s for c in CATEGORIES}
        if not self.with_gpu:
            out[GPU_BUSY] = None
        return out

    def top_frames(self, cat: str, n: int = TOP_FRAMES) -> list[list]:
        """[[frame, share of the whole budget, owner], ...] of one category, largest first."""
        got = self.frames.get(cat)
        if not got or self.total_s <= 0:
            return []
        return [[f, round(s / self.total_s, 4), owner(self.paths.get(f) or "")] for f, s in got.most_common(n)]

    def largest_lost(self) -> tuple[str | None, float]:
        sh = self.shares()
        best = max(((c, sh[c] or 0.0) for c in LOST), key=lambda x: x[1], default=(None, 0.0))
        return best

    def to_data(self) -> dict:
        """The JSON form shared by the ``budget`` samples, the report and the exporter."""
        sh = self.shares()
        owners_total = sum(self.owners.values())
        cause, lost = self.largest_lost()
        return {
            "seconds": round(self.total_s, 3),
            "shares": {c: (None if v is None else round(v, 4)) for c, v in sh.items()},
            "largest": cause if lost > 0 else None,
            "frames": {c: self.top_frames(c) for c in (CPU, IO, BLOCKED, SYNC, DATA, GIL, CPU_WAIT) if self.frames.get(c)},
            "cpu_owners": {k: round(v / owners_total, 3) for k, v in self.owners.most_common(6)} if owners_total else {},
            "blocked_in_calls": round(self.named_blocked_s / self.total_s, 4) if self.total_s > 0 else None,
            "cpu_after_sync": round(self.relaunch_s / self.total_s, 4) if self.total_s > 0 else None,
        }


def budget_of(moments) -> Budget:
    b = Budget()
    for m in moments:
        b.add(m)
    return b


def budget_text(data: dict, below: float | None = None) -> str:
    """One line for a budget's JSON form: "GPU busy 78%; no single cause above 10%: Python/CPU
    code 9% (step (train.py:42)), waiting for data 5%" — what the UI and the report say when no
    verdict holds, so a busy-but-not-saturated GPU is never met with silence."""
    shares = data.get("shares") or {}
    busy = shares.get(GPU_BUSY)
    head = f"GPU busy {busy * 100:.0f}%" if isinstance(busy, (int, float)) else "no GPU counters"
    lost = sorted(((c, v) for c, v in shares.items() if c in LOST and isinstance(v, (int, float)) and v >= 0.005),
                  key=lambda kv: -kv[1])
    parts = []
    for c, v in lost[:3]:
        frames = (data.get("frames") or {}).get(c) or []
        where = f" ({frames[0][0]})" if frames and isinstance(frames[0], list) else ""
        parts.append(f"{LABELS[c]} {v * 100:.0f}%{where}")
    if below is not None:
        # (never "no single cause above 10%" beside a share above it: a verdict that has not
        # held long enough yet, or whose rule does not hold, leaves a large share unnamed)
        head += (f"; no single cause above {below * 100:.0f}%" if not lost or lost[0][1] < below
                 else "; no verdict holds")
    return head + (": " + ", ".join(parts) if parts else "")
