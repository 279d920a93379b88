"""Model FLOPs of one training step, counted by torch inside the job (no formula from the user).

One sampled step runs under ``torch.utils.flop_counter.FlopCounterMode``: a TorchDispatchMode
that sees every aten op the step dispatches (forward, backward and the optimizer; autograd's
worker threads inherit the mode) and adds up the FLOPs of those it has a formula for (matmuls,
convolutions, attention; element-wise ops count 0, as in the usual "model FLOPs").

When: the step that begins at step boundary ``START_AT`` (the 3rd step: the first ones carry
one-time work) once a monitor is attached, and again when the leading shape of the batches
changes (at most ``MAX_COUNTS`` counts in a process): a count is per shape, so a loop whose
shapes vary every step keeps its last count and says so (``varies``).

What it costs that one step: every op goes through Python once more (measured in
docs/probe.md); nothing is changed in the tensors and no GPU sync is added (FLOPs come from
shapes). Every other step pays one attribute check at the boundary.

Where it cannot be right it says n/a with the reason: once ``torch.compile`` is in use (compiled
regions run as fused kernels the dispatcher does not see, so the count would be short), inside
a CUDA-graph capture, and before torch has a FlopCounterMode (< 2.1).

A count made before ``torch.compile`` was first called is withdrawn when it is called (the
window says n/a from then on, whether or not a step or a new shape follows): the compiled code
may replace any part of the step, and the probe cannot tell which.

The compute dtype is taken from the counted ops themselves, FLOP-weighted: the dtype of the op's
first floating tensor among all leaves of args and kwargs (autocast sits above the dispatch mode,
so the inputs seen here are already cast), else of its output; float32 matmuls count as ``tf32`` when
``torch.backends.cuda.matmul.allow_tf32`` is on (convolutions: ``cudnn.allow_tf32``) on CUDA. An
op with no tensor in sight (a counter that hands over no tensors) gets the dtype of the job's
settings (autocast dtype, else the parameters' dtype), never "?".

**Copies between host and GPU, on the same step.** The counter also sees every ``_to_copy``
(``.to()``, ``.cuda()``, ``.cpu()``) and ``copy_`` between a CPU tensor and a CUDA one: per step,
the bytes each way, the part from or to pageable (unpinned) host memory, and the host time the
copies held their thread. An op's time runs from the end of the op before it in the same thread
(or the batch's arrival, or the count's start) to its own end: the mode sees an op only once it
has run, so this is an upper bound (Python code between two ops counts too). Only the training
thread's copies and autograd's are seen (the mode is per thread): a prefetch thread's are not. A
pageable copy, or a device-to-host copy without ``non_blocking``, holds the thread for the whole
transfer; a pinned ``non_blocking`` one returns at once, so its time says what the loop paid,
not the wire.

Imports: the standard library only (torch is handed in by torch_hooks).
"""

from __future__ import annotations

import threading
import time

START_AT = 2               # count the step that begins at this boundary (the 3rd step)
MAX_COUNTS = 4             # counts per process (first + re-counts for new shapes)

# torch dtype name -> the dtype class of the peak table (gputop/gpu_peaks.py)
DTYPE_CLASS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64",
               "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}
CONV_OPS = ("convolution", "convolution_backward", "_convolution")
COMPILED_WHY = ("torch.compile is in use: compiled regions run as fused kernels outside the dispatcher "
                "that FlopCounterMode watches, so a count would be short")


def settings_dtype_class(autocast, param_dtypes, tf32: bool = False) -> str | None:
    """The compute dtype class a job's settings say: an autocast bf16/fp16 region ("cuda:..."
    first), else the parameters' first dtype (fp32 as tf32 where TF32 matmuls are on); None for
    a dtype the peak table has no class for. One home for the probe (ops that carried no
    tensor) and derive/efficiency.py (a count recorded before op dtypes were)."""
    for a in sorted((str(a) for a in autocast), key=lambda a: (not a.startswith("cuda"), a)):
        c = DTYPE_CLASS.get(a.partition(":")[2])
        if c in ("bf16", "fp16"):
            return c
    c = DTYPE_CLASS.get(str(param_dtypes[0])) if param_dtypes else None
    return "tf32" if c == "fp32" and tf32 else c


def first_shape(batch) -> tuple | None:
    """The shape of a batch's first tensor (the one that sets the step's FLOPs), or None."""
    x = batch
    for _ in range(3):
        shape = getattr(x, "shape", None)
        if shape is not None:
            return shape                # torch.Size, a tuple: compared as it is
        if isinstance(x, (list, tuple)) and x:
            x = x[0]
        elif isinstance(x, dict) and x:
            x = next(iter(x.values()))
        else:
            return None
    return None


class FlopCounter:
    """One per probe, created when torch is hooked. ``armed``: the next boundary has work."""

    def __init__(self, probe, torch) -> None:
        self.p = probe
        self.torch = torch
        self.armed = True
        self.watch_shapes = False       # note_batch: learn the counted shape, then compare
        self.flops: int | None = None
        self.by_dtype: dict[str, int] = {}
        self.step: int | None = None    # the step counted
        self.count_ms: float | None = None
        self.counts = 0
        self.varies = False
        self.off: str | None = "waiting for a monitor and the job's 3rd step"
        self._mode = None
        self._stuck = None          # our mode, left under another one at a step end (_pop_stuck)
        self._start_n = 0
        self._start_t = 0.0
        self._thread = 0
        self._shape = None              # the counted step's batch shape
        self._seen_shape = None         # first batch shape seen during the counted step
        self._compiles_at_start = 0
        self.copies: dict | None = None   # per step: bytes, pageable bytes, host ms, each way
        try:
            from torch.utils.flop_counter import FlopCounterMode
            self._cls = _dtype_counter(FlopCounterMode)
        except Exception as e:
            self._cls = None
            self.armed = False
            self.off = (f"torch {getattr(torch, '__version__', '?')} has no torch.utils.flop_counter "
                        f"({type(e).__name__}): FLOPs need torch >= 2.1")

    # -- training thread ---------------------------------------------------------------------
    def wants_boundary(self, monitoring: bool) -> bool:
        """Whether the probe's step end should call at_boundary: a count due while a monitor
        watches, a count in progress (finished even if its monitor left), or our mode still to
        pop from under another one."""
        return (self.armed and (monitoring or self._mode is not None)) or self._stuck is not None

    def at_boundary(self, n: int, now: float) -> None:
        """A step ended (boundary ``n``). Finish a count in progress, or start one if due."""
        if self._mode is not None:
            if threading.get_ident() == self._thread:
                self._finish(n, now)
            return
        if self._stuck is not None:
            if threading.get_ident() == self._thread:
                self._pop_stuck()
            return
        if n < START_AT or not self.p.monitoring:
            return
        why = self._cannot_count()
        if why is not None:
            self.off = why
            self.flops = None
            self.armed = self.watch_shapes = False
            return
        self._start(n, now)

    def note_batch(self, batch) -> None:
        """A batch reached the loop: its shape decides whether the count still holds."""
        shape = first_shape(batch)
        if self._mode is not None:
            clock = getattr(self._mode, "gputop_clock", None)
            if clock is not None:
                clock[threading.get_ident()] = time.perf_counter()   # a copy's time starts here, not at the wait
            if self._seen_shape is None:
                self._seen_shape = shape
            return
        if self.armed or shape is None or self._shape is None or shape == self._shape:
            return
        if self.counts >= MAX_COUNTS:
            self.varies = True          # keep the last count; stop comparing
            self.watch_shapes = False
        else:
            self.armed = True

    def _pop_stuck(self) -> None:
        mode = self._stuck
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode
            if _get_current_dispatch_mode() is getattr(mode, "mode", mode):
                mode.__exit__(None, None, None)
                self._stuck = None
        except Exception:
            self._stuck = None   # cannot tell: do not touch the job's mode stack again

    def stop(self) -> None:
        """A failure: count no more, and leave no mode of ours behind."""
        self.armed = self.watch_shapes = False
        self.flops = None
        if self._stuck is not None:
            self._pop_stuck()
        mode, self._mode = self._mode, None
        if mode is not None:
            try:
                from torch.utils._python_dispatch import _get_current_dispatch_mode
                if _get_current_dispatch_mode() is getattr(mode, "mode", mode):
                    mode.__exit__(None, None, None)
            except Exception:
                pass

    def after_fork_in_child(self) -> None:
        """A child forked during the counted step (a DataLoader worker started by iter() in it)
        inherits the forking thread's dispatch mode: pop it there, or every op of the worker
        would go through the counter for good. The child counts nothing itself."""
        self.stop()
        self.off = "a forked child (a DataLoader worker): not counted"

    def _compiled(self) -> bool:
        th = self.p.torch_hooks
        return bool((th is not None and th.compile_count) or _dynamo_graphs())

    def _cannot_count(self) -> str | None:
        if self._compiled():
            return COMPILED_WHY
        torch = self.torch
        try:
            if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
                return "a CUDA graph is being captured"
        except Exception:
            pass
        return None

    def _start(self, n: int, now: float) -> None:
        torch = self.torch
        mode = self._cls(display=False)
        mode.gputop_tf32 = (_flag(lambda: torch.backends.cuda.matmul.allow_tf32),
                            _flag(lambda: torch.backends.cudnn.allow_tf32))
        mode.gputop_by_dtype = {}
        mode.gputop_settings_dtype = self._dtype_from_settings()
        mode.gputop_copy_ops = _copy_ops(torch)
        mode.gputop_copies = {}
        mode.gputop_copies_lock = threading.Lock()   # the training thread and autograd's both add
        mode.gputop_hooked = False
        mode.gputop_clock = {threading.get_ident(): time.perf_counter()}
        th = self.p.torch_hooks
        self._compiles_at_start = th.compile_count if th is not None else 0
        self._seen_shape = None
        self.watch_shapes = True        # from now on each batch's shape is looked at
        self._thread = threading.get_ident()
        self._start_n, self._start_t = n, now
        self._mode = mode       # before entering: stop() can undo a half-entered mode
        mode.__enter__()

    def _finish(self, n: int, now: float) -> None:
        mode, self._mode = self._mode, None
        self.armed = False
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        if _get_current_dispatch_mode() is not getattr(mode, "mode", mode):
            # Another mode was pushed inside the step and is still on top: popping ours now
            # would pop that one. Report no count, and pop ours at the first step end where
            # it is on top again (_pop_stuck): left pushed, it would send every later op of
            # the job through Python for good.
            self.off = "another TorchDispatchMode was active at the step's end: no count"
            self.flops = None
            self._stuck = mode
            return
        mode.__exit__(None, None, None)
        th = self.p.torch_hooks
        if th is not None and th.compile_count != self._compiles_at_start:
            self.off, self.flops = COMPILED_WHY, None
            return
        steps = max(1, n - self._start_n)
        total = mode.get_total_flops()
        self.flops = int(total // steps)
        by = {k: int(v // steps) for k, v in mode.gputop_by_dtype.items()}
        if total and not by:   # an older FlopCounterMode without _count_flops: the settings say
            by = {self._dtype_from_settings(): self.flops}
        self.by_dtype = by
        # (an older FlopCounterMode without _count_flops never saw an op: no count, not zero)
        self.copies = ({k: (v / steps) for k, v in mode.gputop_copies.items()}
                       if getattr(mode, "gputop_hooked", False) else None)
        self.step = self._start_n + 1
        self.count_ms = (now - self._start_t) * 1000.0 / steps
        self.counts += 1
        self.off = None if total else "the counted step ran no op with a FLOP formula (matmul, conv, attention)"
        self._shape = self._seen_shape
        self.watch_shapes = self._shape is not None

    def _dtype_from_settings(self) -> str:
        th = self.p.torch_hooks
        dts = ((th.optimizer or {}).get("param_dtypes") if th is not None else None) or ["float32"]
        return settings_dtype_class(getattr(th, "autocast", ()) or (), dts) or str(dts[0])

    # -- probe thread ---------------------------------------------------------------------------
    def message(self) -> dict:
        if self.flops is not None and self._mode is None and self._compiled():
            # torch.compile was called after the count: withdrawn here, at once, rather than at
            # the next boundary with a new shape (which may never come, or come unmonitored).
            return {"flops": None, "by_dtype": {}, "dtype": None, "step": self.step, "count_ms": self.count_ms,
                    "counts": self.counts, "varies": self.varies, "off": COMPILED_WHY}
        by = dict(self.by_dtype) if self.flops is not None else {}
        main = max(by, key=by.get) if by else None
        return {"flops": self.flops, "by_dtype": by, "dtype": main, "step": self.step, "count_ms": self.count_ms,
                "counts": self.counts, "varies": self.varies, "off": self.off if self.flops is None else None,
                "copies": dict(self.copies) if self.copies is not None and self.flops is not None else None}


def _flag(fn) -> bool:
    try:
        return bool(fn())
    except Exception:
        return False


def _dynamo_graphs() -> int:
    import sys
    dyn = sys.modules.get("torch._dynamo.utils")
    if dyn is None:
        return 0
    try:
        return int(getattr(dyn, "counters", {}).get("stats", {}).get("unique_graphs", 0))
    except Exception:
        return 0


def _dtype_tensor(out, args, kwargs):
    """The tensor whose dtype is the op's compute dtype: the first floating leaf of args, then of
    kwargs (inputs, not the output: an fp8 matmul writes bf16), then of the output (tensors nested
    in lists, or passed by keyword, are found too)."""
    try:
        from torch.utils._pytree import tree_leaves
        leaves = (tree_leaves(args), tree_leaves(kwargs), tree_leaves(out))
    except Exception:
        leaves = (tuple(args), tuple(kwargs.values()), (out,))
    for group in leaves:
        for a in group:
            if getattr(a, "is_floating_point", None) is not None and hasattr(a, "device"):
                try:
                    if a.is_floating_point():
                        return a
                except Exception:
                    continue
    return None


def _copy_ops(torch) -> dict:
    """The aten packets that copy between devices: {packet: index of the source in args, or
    None: the output is the destination and args[0] the source}."""
    ops = {}
    for name, src in (("_to_copy", None), ("copy_", 1)):
        try:
            ops[getattr(torch.ops.aten, name)] = src
        except Exception:
            pass
    return ops


def _count_copy(mode, src_at, out, args, now: float, took: float) -> None:
    """Add one copy op's bytes and host time to the mode's per-direction totals (CPU <-> CUDA only)."""
    if src_at is None:
        src, dst = (args[0] if args else None), out
    else:
        src, dst = (args[src_at] if len(args) > src_at else None), (args[0] if args else None)
    try:
        a, b = src.device.type, dst.device.type
        if a == "cpu" and b == "cuda":
            way, host = "h2d", src
        elif a == "cuda" and b == "cpu":
            way, host = "d2h", dst
        else:
            return
        n = src.numel() * src.element_size()
        pageable = not host.is_pinned()
    except Exception:
        return
    c = mode.gputop_copies
    with mode.gputop_copies_lock:
        c[f"{way}_bytes"] = c.get(f"{way}_bytes", 0) + n
        c[f"{way}_n"] = c.get(f"{way}_n", 0) + 1
        c[f"{way}_ms"] = c.get(f"{way}_ms", 0.0) + took * 1000.0
        if pageable:
            c[f"{way}_pageable_bytes"] = c.get(f"{way}_pageable_bytes", 0) + n


def _dtype_counter(base):
    """FlopCounterMode that also adds each op's FLOPs to its dtype class (see the module doc)."""

    class _DtypeFlopCounter(base):
        def _count_flops(self, func_packet, out, args, kwargs):
            clock = getattr(self, "gputop_clock", None)
            if clock is not None:
                self.gputop_hooked = True
                now, tid = time.perf_counter(), threading.get_ident()
                try:   # (a triton kernel comes as a JITFunction, perhaps unhashable: never the job's error)
                    src_at = self.gputop_copy_ops.get(func_packet, False)
                except Exception:
                    src_at = False
                if src_at is not False:
                    _count_copy(self, src_at, out, args, now, now - clock.get(tid, now))
                clock[tid] = now
            glob = self.flop_counts["Global"]
            before = glob.get(func_packet, 0)
            r = super()._count_flops(func_packet, out, args, kwargs)
            added = glob.get(func_packet, 0) - before
            if added:
                t = _dtype_tensor(out, args, kwargs)
                if t is None:
                    cls = self.gputop_settings_dtype
                else:
                    name = str(t.dtype).replace("torch.", "")
                    cls = DTYPE_CLASS.get(name, name)
                if cls == "fp32" and t is not None and t.device.type == "cuda":
                    conv = str(func_packet).split(".")[-1] in CONV_OPS
                    if self.gputop_tf32[1 if conv else 0]:
                        cls = "tf32"
                by = self.gputop_by_dtype
                by[cls] = by.get(cls, 0) + added
            return r

    return _DtypeFlopCounter
