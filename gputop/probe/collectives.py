"""Collective time inside DDP and FSDP, seen from inside the process (issue 17).

py-spy sees a rank waiting in DDP's gradient all-reduce only as ``_engine_run_backward`` (the
wait is in C++ under ``backward()``), so from stacks alone a fast rank that waits for a late one
looks idle. This module times the collectives themselves:

- **DDP** (``ddp_comm`` hook): at a DDP model's first forward while a monitor is attached (not
  before: torch's C++ all-reduce is cheaper than any Python hook), if no communication hook was
  registered on it, the probe registers one that calls torch's own reference hook
  ``default_hooks.allreduce_hook`` (the one torch documents as giving the same result as no
  hook: divide the bucket by the group size, all-reduce it) and notes, per bucket, when it was
  issued, its size, and when its Future completed (``add_done_callback``: nothing waits, the
  returned Future is the reference hook's own). A hook the job registers later
  (``register_comm_hook``) is not refused: it is called in the probe's place and timed the same
  way. A model that already has a hook at its first forward (its own, or DDP's mixed precision),
  a builtin C++ hook, the Python reducer of compiled autograd, or a DDP under ``torch.compile``
  keeps its own path untouched; the hook then says why, and stacks are all there is.
- **FSDP and explicit calls** (``collectives`` hook): the ``torch.distributed`` functions FSDP
  (1 and 2) and training loops call through the module (``dist.all_gather_into_tensor``...) are
  wrapped: a call that returns ``None`` blocked until done (sync); one that returns a Work is
  timed to its Future's completion.
- **CUDA tensors**: NCCL marks a Future complete when the work is queued, not when it ran, so
  for CUDA tensors the times are two CUDA events -- one on the current stream at issue, one
  recorded in the done-callback (whose current stream waits for the work) -- read by the probe
  thread with ``query()`` only. Without the probe's CUDA events (``cuda_events`` off) CUDA
  collectives are counted but not timed.

Per step (an op belongs to the step in which it was issued), settled by the probe thread once
the step ended and all its ops completed:

- ``time in collectives`` = the union of the ops' [issue, completion] intervals;
- ``exposed`` = the time no compute can overlap: the duration of each sync call (the caller
  blocked) plus, for async ops and DDP buckets, ``last completion - last issue``: after the
  last bucket was handed over, backward has no gradient left to compute, so the rest of the
  communication is waited for (in DDP's ``finalize_backward``, under ``backward()``). On a rank
  that others wait for, this is small; on the ranks that wait, it is the wait.

Imports: the standard library only (torch is handed in).
"""

from __future__ import annotations

import functools
import threading
from collections import deque

from gputop.probe.util import _mono

MAX_OPS = 8192            # op records between windows (oldest dropped)
MAX_OP_NAMES = 16
UNSETTLED_GIVE_UP_S = 30.0
# Functions wrapped in torch.distributed (those that exist in this torch).
WRAPPED = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_single",
           "reduce_scatter_single", "all_gather", "reduce_scatter", "broadcast", "all_to_all_single",
           "_all_gather_base", "_reduce_scatter_base")
DDP_OP = "ddp_allreduce"
# Why a DDP model's all-reduce is not timed (stacks only): filled into the ddp_comm hook.
WHY_OWN_HOOK = "a DDP model has its own comm hook ({name}): its gradient all-reduce is seen from stacks only"
WHY_BUILTIN = "a DDP model uses a builtin C++ comm hook ({name}): its gradient all-reduce is seen from stacks only"
WHY_PY_REDUCER = "a DDP model uses the Python reducer (compiled autograd): its all-reduce is seen from stacks only"
WHY_COMPILED = "a DDP model runs under torch.compile: its all-reduce is seen from stacks only"

# An op record: [step, op, nbytes, kind, t_issue, t_done, ev_issue, ev_done, cuda]
STEP, OP, NBYTES, KIND, T0, T1, EV0, EV1, CUDA = range(9)
KIND_SYNC, KIND_ASYNC, KIND_BUCKET = 0, 1, 2


def _nbytes(args) -> int:
    """The largest tensor among the first two arguments (output and input of a gather/scatter)."""
    n = 0
    for a in args[:2]:
        try:
            if isinstance(a, (list, tuple)):
                a = a[0] if a else None
            if a is not None and hasattr(a, "element_size"):
                n = max(n, int(a.numel()) * int(a.element_size()))
        except Exception:
            pass
    return n


class Collectives:
    """Installed by TorchHooks once torch is imported; every wrapper passes through untouched
    unless a monitor is attached."""

    def __init__(self, probe, torch) -> None:
        self.p = probe
        self.torch = torch
        self.on = False            # the torch.distributed wrappers time calls
        self.ddp_on = False        # the DDP hook times buckets
        self.ops: deque = deque(maxlen=MAX_OPS)
        self.issued = 0            # ops recorded (to see drops)
        self.carry: list = []      # records drained but not settled yet
        self.lost = 0              # records given up (never completed, or dropped by the deque)
        self.models_timed = 0
        self.models_untimed: list[str] = []
        self._in_hook = threading.local()   # inside our DDP hook: the wrappers do not count twice
        self._undo: list = []
        self._free_ev: deque = deque(maxlen=256)

    # -- install ------------------------------------------------------------------------------
    def install(self) -> None:
        p, torch = self.p, self.torch
        dist = getattr(torch, "distributed", None)
        if dist is None or not dist.is_available():
            p.set_hook("collectives", "unavailable", f"torch {torch.__version__} has no torch.distributed")
            p.set_hook("ddp_comm", "unavailable", f"torch {torch.__version__} has no torch.distributed")
            return
        self._install_wrappers(dist)
        try:
            self._install_ddp(dist)
        except Exception as e:
            p.set_hook("ddp_comm", "unavailable", f"could not hook DDP on torch {torch.__version__}: "
                       f"{type(e).__name__}: {e}; its all-reduce is seen from stacks only")

    def uninstall(self) -> None:
        self.on = self.ddp_on = False
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo = []

    def disable(self, name: str) -> None:
        if name == "collectives":
            self.on = False
        elif name == "ddp_comm":
            self.ddp_on = False

    def after_fork(self) -> None:
        self.ops.clear()
        self.carry = []

    def _is_compiling(self):
        return getattr(getattr(self.torch, "compiler", None), "is_compiling", None) or (lambda: False)

    def _install_wrappers(self, dist) -> None:
        p, me = self.p, self
        is_compiling = self._is_compiling()
        done = []
        for name in WRAPPED:
            orig = getattr(dist, name, None)
            if not callable(orig):
                continue

            def make(orig, name):
                @functools.wraps(orig)
                def wrapper(*args, **kwargs):
                    # is_compiling() first: under torch.compile nothing else here may be traced
                    if is_compiling() or not (me.on and p.monitoring) or getattr(me._in_hook, "depth", 0):
                        return orig(*args, **kwargs)
                    tensors = args or (kwargs.get("tensor"), kwargs.get("output_tensor"), kwargs.get("output"))
                    rec = me._issue(name, _nbytes(tensors), tensors)   # keyword calls too: CUDA or not
                    res = orig(*args, **kwargs)
                    if rec is not None:
                        me._after_call(rec, res)
                    return res
                return wrapper

            setattr(dist, name, make(orig, name))
            self._undo.append(lambda name=name, orig=orig: setattr(dist, name, orig))
            done.append(name)
        self.on = True
        p.set_hook("collectives", "on", f"times torch.distributed.{', '.join(done[:4])}... calls (sync: the call; "
                   "async: to its Future's completion)")

    def _install_ddp(self, dist) -> None:
        p, me = self.p, self
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        register_hook = getattr(dist, "_register_comm_hook", None)
        if register_hook is None:
            p.set_hook("ddp_comm", "unavailable", f"torch {self.torch.__version__} has no _register_comm_hook: "
                       "DDP's all-reduce is seen from stacks only")
            return
        is_compiling = self._is_compiling()
        orig_init = DDP.__dict__["__init__"]
        orig_register = DDP.__dict__["register_comm_hook"]
        orig_builtin = DDP.__dict__.get("_register_builtin_comm_hook")
        reference = default_hooks.allreduce_hook
        builtin_python = {"ALLREDUCE": default_hooks.allreduce_hook,
                          "FP16_COMPRESS": getattr(default_hooks, "fp16_compress_hook", None)}

        def timed_hook(ddp):
            # [hook, state]: the reference hook until the job registers its own
            inner = [reference, ddp.process_group]

            def gputop_comm_hook(state, bucket):
                hook, st = inner
                if not (me.ddp_on and p.monitoring) or is_compiling():
                    return hook(st, bucket)
                rec = None
                try:
                    buf = bucket.buffer()
                    rec = me._issue(DDP_OP, int(buf.numel()) * int(buf.element_size()), (buf,), KIND_BUCKET)
                except Exception as e:
                    p.hook_failed("ddp_comm", e)
                me._in_hook.depth = getattr(me._in_hook, "depth", 0) + 1
                try:
                    fut = hook(st, bucket)
                finally:
                    me._in_hook.depth -= 1
                if rec is not None:
                    try:
                        fut.add_done_callback(functools.partial(me._done, rec))
                    except Exception as e:
                        p.hook_failed("ddp_comm", e)
                return fut
            return gputop_comm_hook, inner

        def first_forward(ddp, args):
            if is_compiling() or not p.monitoring:
                # Nobody watches yet: keep torch's C++ all-reduce (the Python hook cost 1.7% of
                # steps/s on an H200), and look again at the next forward. The reference hook
                # computes what the default does, so taking over between two steps is safe.
                return None
            try:
                handle = ddp.__dict__.pop("_gputop_pre", None)
                if handle is not None:
                    handle.remove()
                me._attach(ddp, register_hook, timed_hook)
            except Exception as e:
                p.hook_failed("ddp_comm", e)
            return None

        @functools.wraps(orig_init)
        def __init__(ddp, *args, **kwargs):
            orig_init(ddp, *args, **kwargs)
            if me.ddp_on:
                try:
                    ddp.__dict__["_gputop_pre"] = ddp.register_forward_pre_hook(first_forward)
                except Exception as e:
                    p.hook_failed("ddp_comm", e)

        @functools.wraps(orig_register)
        def register_comm_hook(ddp, state, hook):
            inner = ddp.__dict__.get("_gputop_inner")
            if inner is None or ddp.__dict__.get("_gputop_user_hook"):
                return orig_register(ddp, state, hook)   # ours is not there (or a second hook: torch refuses)
            # Ours is registered (the reducer takes one hook only): the job's hook runs in its place.
            ddp._check_comm_hook(hook)
            if getattr(ddp, "logger", None) is not None:
                ddp.logger._set_comm_hook_name(hook.__qualname__)
            ddp._comm_hooks.append((hook, state))
            ddp.__dict__["_gputop_user_hook"] = True
            inner[:] = [hook, state]

        def _register_builtin_comm_hook(ddp, comm_hook_type):
            inner = ddp.__dict__.get("_gputop_inner")
            name = getattr(comm_hook_type, "name", str(comm_hook_type))
            py = builtin_python.get(name)
            if inner is None or py is None or ddp.__dict__.get("_gputop_user_hook"):
                ddp.__dict__["_gputop_builtin"] = str(comm_hook_type)
                return orig_builtin(ddp, comm_hook_type)
            # After our hook went in: torch's Python twin of that builtin, in its place.
            ddp.__dict__["_gputop_user_hook"] = True
            inner[:] = [py, ddp.process_group]

        DDP.__init__ = __init__
        DDP.register_comm_hook = register_comm_hook
        self._undo.append(lambda: setattr(DDP, "__init__", orig_init))
        self._undo.append(lambda: setattr(DDP, "register_comm_hook", orig_register))
        if orig_builtin is not None:
            functools.update_wrapper(_register_builtin_comm_hook, orig_builtin)
            DDP._register_builtin_comm_hook = _register_builtin_comm_hook
            self._undo.append(lambda: setattr(DDP, "_register_builtin_comm_hook", orig_builtin))
        self.ddp_on = True
        p.set_hook("ddp_comm", "on", "waiting for a DistributedDataParallel model's first forward")

    def _attach(self, ddp, register_hook, timed_hook) -> None:
        """At a DDP model's first forward: our hook, unless the model already has a path of its own."""
        p = self.p
        why = None
        if getattr(ddp, "_use_python_reducer", False):
            why = WHY_PY_REDUCER
        elif ddp.__dict__.get("_gputop_builtin"):
            why = WHY_BUILTIN.format(name=ddp.__dict__["_gputop_builtin"])
        elif getattr(ddp, "_comm_hooks", None):
            hook = ddp._comm_hooks[0][0]
            why = WHY_OWN_HOOK.format(name=getattr(hook, "__qualname__", type(hook).__name__))
        elif getattr(ddp, "reducer", None) is None:
            why = "a DDP model has no reducer (no parameter needs a gradient)"
        if why is None:
            hook, inner = timed_hook(ddp)
            try:
                register_hook(ddp.reducer, None, hook)
            except RuntimeError as e:   # someone registered on the reducer directly
                why = f"a DDP model's reducer already has a comm hook ({e}): seen from stacks only"
            else:
                ddp.__dict__["_gputop_inner"] = inner
                self.models_timed += 1
        if why is not None:
            if len(self.models_untimed) < 8:
                self.models_untimed.append(why)
        state = "on" if self.models_timed else "off"
        msg = (f"times DDP's gradient all-reduce per bucket on {self.models_timed} model(s) (torch's reference "
               "allreduce_hook, the same math as no hook)" if self.models_timed else why)
        if self.models_untimed and self.models_timed:
            msg += f"; not on {len(self.models_untimed)}: {self.models_untimed[0]}"
        p.set_hook("ddp_comm", state, msg)
        p.config_dirty = True

    # -- hot path (training thread, autograd thread, comm threads) ------------------------------
    def _issue(self, op: str, nbytes: int, args, kind: int = KIND_SYNC) -> list | None:
        p = self.p
        cuda = False
        ev0 = None
        try:
            t = next((a for a in args if a is not None), None) if args else None
            if isinstance(t, (list, tuple)):
                t = t[0] if t else None
            cuda = bool(getattr(t, "is_cuda", False))
            if cuda:
                if not p.cuda_events_on or self.torch.cuda.is_current_stream_capturing():
                    rec = [p.step_total + 1, op, nbytes, kind, _mono(), None, None, None, True]
                    self._push(rec)
                    return rec
                ev0 = self._event()
                ev0.record()
        except Exception as e:
            p.hook_failed("collectives", e)
            return None
        rec = [p.step_total + 1, op, nbytes, kind, _mono(), None, ev0, None, cuda]
        self._push(rec)
        return rec

    def _push(self, rec) -> None:
        self.issued += 1
        if len(self.ops) == MAX_OPS:
            self.lost += 1          # the deque drops its oldest record on this append
        self.ops.append(rec)

    def _after_call(self, rec, res) -> None:
        try:
            if res is None or not hasattr(res, "get_future"):
                self._done(rec, None)   # a sync call: it has completed
            else:
                rec[KIND] = KIND_ASYNC
                res.get_future().add_done_callback(functools.partial(self._done, rec))
        except Exception as e:
            rec[KIND] = -1              # never settles as timed: counted, not timed
            self.p.hook_failed("collectives", e)

    def _done(self, rec, _fut) -> None:
        try:
            if rec[EV0] is not None:
                ev1 = self._event()
                ev1.record()            # (in a CUDA Future's callback the current stream waits for the work)
                rec[EV1] = ev1
            rec[T1] = _mono()
        except Exception:
            rec[T1] = _mono()
            rec[EV0] = None

    def _event(self):
        try:
            return self._free_ev.pop()
        except IndexError:
            return self.torch.cuda.Event(enable_timing=True)

    # -- probe thread -------------------------------------------------------------------------
    def window_fields(self) -> dict:
        """The ``coll_*`` fields of one window message: the steps settled since the last one.
        Empty for a process that never used torch.distributed (its numbers are unknown, not 0).
        Never raises: the window message must go out whatever happens here."""
        try:
            return self._window_fields()
        except Exception as e:
            self.carry = []
            return {"coll_off": f"collective timing failed this window: {type(e).__name__}: {e}"[:300]}

    def _window_fields(self) -> dict:
        if not self.issued and not self._dist_initialized():
            return {}
        pop = self.ops.popleft
        carry = self.carry
        while True:
            try:
                carry.append(pop())
            except IndexError:
                break
        open_step = self.p.step_total + 1
        by_step: dict[int, list] = {}
        for rec in carry:
            by_step.setdefault(rec[STEP], []).append(rec)
        now = _mono()
        keep: list = []
        out = {"coll_steps": 0, "coll_s": 0.0, "coll_exposed_s": 0.0, "coll_n": 0, "coll_bytes": 0,
               "coll_untimed": 0, "coll_bucket_n": 0, "coll_bucket_bytes": 0, "coll_bucket_max": 0}
        ops: dict[str, list] = {}
        for step in sorted(by_step):
            recs = by_step[step]
            if step >= open_step or not all(self._finished(r) for r in recs):
                if now - recs[0][T0] > UNSETTLED_GIVE_UP_S:
                    self.lost += len(recs)
                else:
                    keep.extend(recs)
                continue
            self._settle(recs, out, ops)
        self.carry = keep
        out["coll_ops"] = {k: [v[0], v[1], round(v[2], 6)] for k, v in
                           sorted(ops.items(), key=lambda kv: -kv[1][2])[:MAX_OP_NAMES]}
        out["coll_s"] = round(out["coll_s"], 6)
        out["coll_exposed_s"] = round(out["coll_exposed_s"], 6)
        out["coll_lost"] = self.lost
        out["coll_off"] = self.why_off()
        return out

    def _dist_initialized(self) -> bool:
        try:
            return bool(self.torch.distributed.is_initialized())
        except Exception:
            return False

    def why_off(self) -> str | None:
        """None while collectives can be timed; else why the numbers are missing or partial."""
        p = self.p
        ddp = p.hooks.get("ddp_comm")
        if self.models_untimed and not self.models_timed:
            return self.models_untimed[0]
        if ddp is not None and ddp[0] in ("failed", "unavailable"):
            return ddp[1]
        coll = p.hooks.get("collectives")
        if coll is not None and coll[0] in ("failed", "unavailable"):
            return coll[1]
        return None

    def _finished(self, rec) -> bool:
        if rec[KIND] == -1:
            return True
        if rec[T1] is None:
            return False
        ev0, ev1 = rec[EV0], rec[EV1]
        if ev0 is None:
            return True
        try:
            return bool(ev1 is not None and ev1.query() and ev0.query())
        except Exception:
            rec[EV0] = None
            return True

    def _settle(self, recs: list, out: dict, ops: dict) -> None:
        """One ended step: union of intervals, exposed tail, per-op and bucket totals."""
        spans = []          # (start, end, kind)
        ref = None
        for r in recs:
            op, nbytes = r[OP], r[NBYTES]
            entry = ops.get(op)
            if entry is None:
                if len(ops) >= MAX_OP_NAMES:
                    op = "(other)"
                entry = ops.setdefault(op, [0, 0, 0.0])
            entry[0] += 1
            entry[1] += nbytes
            out["coll_n"] += 1
            out["coll_bytes"] += nbytes
            if r[KIND] == KIND_BUCKET:
                out["coll_bucket_n"] += 1
                out["coll_bucket_bytes"] += nbytes
                out["coll_bucket_max"] = max(out["coll_bucket_max"], nbytes)
            span = None
            if r[KIND] != -1 and r[T1] is not None:
                if r[EV0] is not None:
                    try:
                        if ref is None:
                            ref = r[EV0]
                        a = ref.elapsed_time(r[EV0]) / 1000.0
                        b = ref.elapsed_time(r[EV1]) / 1000.0
                        span = (a, max(a, b), r[KIND])
                    except Exception:
                        span = None
                    self._recycle(r)
                elif not r[CUDA]:
                    span = (r[T0], max(r[T0], r[T1]), r[KIND])
            if span is None:
                out["coll_untimed"] += 1
                continue
            entry[2] += span[1] - span[0]
            spans.append(span)
        if not spans:
            return
        out["coll_steps"] += 1
        spans.sort()
        busy, end = 0.0, None
        for a, b, _k in spans:
            if end is None or a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        exposed = sum(b - a for a, b, k in spans if k == KIND_SYNC)
        tail = [(a, b) for a, b, k in spans if k != KIND_SYNC]
        if tail:
            exposed += max(0.0, max(b for _a, b in tail) - max(a for a, _b in tail))
        out["coll_s"] += busy
        out["coll_exposed_s"] += min(exposed, busy)

    def _recycle(self, rec) -> None:
        for i in (EV0, EV1):
            ev = rec[i]
            if ev is not None and len(self._free_ev) < 256:
                self._free_ev.append(ev)
            rec[i] = None
