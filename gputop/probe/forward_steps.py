"""Steps of a job that never steps an optimizer (inference, evaluation alone): the end of each
call of its outermost module, the model.

The probe's steps come from the optimizer's step (core.Probe.on_optimizer_step) or from
``gputop.probe.step()``. An inference loop has neither, so it had no step time, no split of a
step, no GPU time per step and no kernel trace. Its unit of work is a call of the model (one
batch; one decoding step under ``generate``; one denoising step of a diffusion sampler), so that
call's end is its step boundary.

Finding the model, cheaply and without touching the job's objects:

- Only when a monitor is attached, ``ARM_AFTER_S`` after the job imported torch, and only while
  it has never stepped an optimizer, called ``gputop.probe.step()`` or ``torch.compile``.
- Then a global module hook (``register_module_forward_pre_hook``) notes which module is called
  with no other module's call open on its thread: none of the frames above the call is
  nn.Module's ``_call_impl`` (the stack itself, not a count of calls in and out, which goes
  wrong when looking starts inside a call: torchvision's Bottleneck calls its one ReLU three
  times, and a count started inside a Bottleneck took that ReLU for the model, on an H100). A
  module without parameters is not the model (a transform a Dataset calls per sample, in the
  loop's thread when ``num_workers=0``). The first module called so ``LEARN_CALLS`` times is
  the model. The hook sends every module call down nn.Module's slow path while it is in, so it
  goes as soon as the model is known, and ``LEARN_MAX_S`` after the first top-level call at
  most (while nothing is called, as while a large model loads, it costs nothing).
- The model's class then gets a ``__call__`` (``_make_call``) that calls the class's own and,
  for that one instance (a weak reference: the probe never keeps a model alive), marks a step.
  Never a hook on the instance: nn.Module keeps hooks in the instance's own dicts, so
  ``torch.save(model)`` and ``copy.deepcopy(model)`` (an EMA copy) would carry the probe's
  function with them. Every other instance of that class pays one Python call more (~1 us).
- Calls count as steps only after the model has been called for ``ENGAGE_S`` with no optimizer
  step (a training job's first forwards come before its first optimizer step; gradient
  accumulation makes several). An optimizer step, ``gputop.probe.step()`` or torch.compile seen
  later ends it for good, and the class gets its own ``__call__`` back. A model that is freed
  (the next checkpoint loaded) is looked for again. A forked child turns it off (its probe is
  dormant). A call made during a CUDA graph capture is not a step.

Limits: a loop that calls a small module with parameters several times per item at the top
level (an RNN cell stepped from the loop itself) gets that call as its step; a loop that
replays a CUDA graph instead of calling the model has no steps after the capture; several
threads calling the model share one step count (a step is the time between two calls, from any
of them); a spawned child process (``mp.spawn``) starts dormant and gets none. Under torch.fx
tracing, and under any tool that patches ``nn.Module.__call__`` after the model was found,
other instances of the model's class go through the probe's ``__call__`` (fx traces them
through instead of keeping them as leaf modules). ``gputop.probe.step()`` marks steps exactly
in all of these.

Imports: the standard library only (torch is handed in).
"""

from __future__ import annotations

import sys
import threading
import weakref

from gputop.probe.util import _mono

ARM_AFTER_S = 10.0   # no optimizer step this long after torch came in (and a monitor attached): look for a model
LEARN_CALLS = 3      # the first module with parameters called this many times at the top level is the model
LEARN_MAX_S = 60.0   # the global hook stays in this long at most after the first top-level call it saw
MAX_CANDIDATES = 64  # top-level modules remembered while learning
ENGAGE_S = 5.0       # the model's calls are steps once it has been called this long with no optimizer step

ACTIVE: ForwardSteps | None = None   # the probe's, while a class's __call__ is ours (read by that __call__)


def _make_call(call_impl, is_compiling):
    """The model's class's ``__call__``: the class's own (as Python found it) and then, for the
    model itself, a step. It closes over torch's functions only and finds the probe through
    ``sys.modules``: a class defined in ``__main__`` is pickled by value by cloudpickle (Ray,
    Dask), its ``__dict__`` with it, and then carries nothing of the probe's (its copy elsewhere
    finds no probe and calls the original). Under torch.compile it is the original alone: dynamo
    folds ``is_compiling()`` to True, so nothing of the probe's is traced (no guard on its state,
    no recompile when it changes, no graph break under fullgraph=True)."""

    def __call__(module, *args, **kwargs):
        if is_compiling():
            return call_impl(module, *args, **kwargs)
        out = call_impl(module, *args, **kwargs)
        fs = getattr(sys.modules.get("gputop.probe.forward_steps"), "ACTIVE", None)
        if fs is not None:
            fs.after_call(module)
        return out

    __call__.__wrapped__ = call_impl
    return __call__


class ForwardSteps:
    """One per probe (torch_hooks.TorchHooks.forward_steps). ``tick`` runs on the probe thread;
    the hook and the class's ``__call__`` on the job's threads."""

    def __init__(self, probe, torch) -> None:
        self.probe = probe
        self.torch = torch
        self.state = "waiting"             # waiting | learning | on | off
        self.why = "waiting for a job that never steps an optimizer"
        self.t_torch = _mono()             # when the job's torch came in
        self._lock = threading.Lock()      # state changes: found (job's thread) against stop (probe thread)
        self._handles: list = []           # the global hook while learning
        self._first_top_t: float | None = None   # the first top-level module call the hook saw
        self._call_impl_code = getattr(getattr(torch.nn.Module, "_call_impl", None), "__code__", None)
        self._counts: dict[int, list] = {}   # id(module) -> [calls, weakref]
        self._cls = None                   # the model's class, while its __call__ is ours
        self._cls_had_call = False         # it had a __call__ of its own (restored on undo)
        self._cls_call = None
        self.model_ref = None              # weakref to the model
        self.model_name: str | None = None
        self.first_call_t: float | None = None
        self.calls = 0                     # calls of the model seen since it was found
        is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        self._is_compiling = is_compiling or (lambda: False)

    # -- probe thread ---------------------------------------------------------------------------
    def _refused(self) -> str | None:
        p, th = self.probe, self.probe.torch_hooks
        if p.marker_mode:
            return "the job calls gputop.probe.step()"
        if p.step_source == "optimizer" or (th is not None and th.optimizer_calls):
            return "the job steps an optimizer: its steps are those"
        if th is not None and th.compile_count:
            return "torch.compile is in use: the model's calls are compiled code"
        return None

    def tick(self, now: float) -> None:
        """Each window: arm, give up, stop, or look again for a model that was freed; then the
        hook's state for the monitors."""
        p = self.probe
        if self.state != "off":
            why = self._refused()
            if why is not None:
                self.stop(why)
            elif self.state == "waiting":
                if not p.dormant and p.monitoring and now - self.t_torch >= ARM_AFTER_S:
                    self._learn()
            elif self.state == "learning":
                # (counted from the first top-level call: a model that takes minutes to load is
                # called late, and while nothing is called the hook costs nothing)
                first = self._first_top_t
                if first is not None and now - first > LEARN_MAX_S:
                    self.stop(f"no module with parameters was called {LEARN_CALLS} times at the top level in "
                              f"{LEARN_MAX_S:.0f} s")
            elif self.state == "on" and self.model_ref is not None and self.model_ref() is None:
                # the model was freed (the next checkpoint loaded, say): look again
                self._unpatch()
                self.state, self.first_call_t = "waiting", None
                self.why = "the model was freed: looking for the next one"
        if p.hooks.get("forward_steps", [None])[0] != "failed":
            state = "on" if self.state == "on" else "off"
            p.set_hook("forward_steps", state, self.why)

    def _learn(self) -> None:
        pre = getattr(self.torch.nn.modules.module, "register_module_forward_pre_hook", None)
        if pre is None or self._call_impl_code is None:
            self.stop(f"torch {self.torch.__version__} has no global module hook: call gputop.probe.step() per batch")
            return
        self._first_top_t = None
        self.state = "learning"
        self.why = "looking for the model: the module with parameters the job calls at the top level"
        self._handles.append(pre(self._pre))

    def _drop_learners(self) -> None:  # (any thread: a RemovableHandle's remove is a dict delete)
        handles, self._handles = self._handles, []
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass
        self._counts = {}

    def _unpatch(self) -> None:
        global ACTIVE
        with self._lock:
            cls, self._cls = self._cls, None
            if ACTIVE is self:
                ACTIVE = None
        if cls is not None:
            try:
                if self._cls_had_call:
                    cls.__call__ = self._cls_call
                else:
                    del cls.__call__
            except Exception:
                pass

    def stop(self, why: str) -> None:
        """Off for good (any thread): the global hook out, the class's own __call__ back."""
        with self._lock:
            self.state, self.why = "off", why
        self._drop_learners()
        self._unpatch()
        if self.probe.step_source == "forward":
            self.probe.config_dirty = True

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) inherits the hook and the class's __call__ but not
        the probe thread that would take them out; its probe is dormant. So: off there (a fresh
        lock first: the parent's may have been held at the fork)."""
        self._lock = threading.Lock()
        self.stop("a forked child: steps are the parent's")

    # -- the job's threads: learning ------------------------------------------------------------
    def _pre(self, module, args) -> None:
        if self._is_compiling() or self.state != "learning":
            return
        try:
            # this call's own _call_impl is the first above the hook; another one further up is
            # a module whose call is open around it
            code, f, seen = self._call_impl_code, sys._getframe(1), 0
            while f is not None:
                if f.f_code is code:
                    seen += 1
                    if seen > 1:
                        return
                f = f.f_back
            if self._first_top_t is None:
                self._first_top_t = _mono()
            c = self._counts.get(id(module))
            if c is None or c[1]() is not module:
                if len(self._counts) >= MAX_CANDIDATES:
                    return
                # (a module without parameters is not the model: a transform -- Resize, Normalize --
                # that a Dataset calls per sample, in the loop's thread when num_workers=0)
                if next(module.parameters(), None) is None:
                    self._counts[id(module)] = [float("-inf"), weakref.ref(module)]
                    return
                c = self._counts[id(module)] = [0, weakref.ref(module)]
            c[0] += 1
            if c[0] >= LEARN_CALLS:
                self._found(module)
        except Exception as e:
            self.stop(f"could not find the model: {type(e).__name__}: {e}")

    def _found(self, model) -> None:
        """On the job's thread, in the model's third top-level call (before its forward runs)."""
        global ACTIVE
        self._drop_learners()
        cls = type(model)
        had = "__call__" in cls.__dict__
        orig = cls.__dict__["__call__"] if had else None
        call = _make_call(cls.__call__, self._is_compiling)   # (the class's own __call__ as Python finds it)
        call.__qualname__ = f"{cls.__qualname__}.__call__"
        with self._lock:   # (the probe thread may stop this meanwhile: then the class stays as it is)
            if self.state != "learning":
                return
            self._cls, self._cls_had_call, self._cls_call = cls, had, orig
            self.model_ref, self.model_name = weakref.ref(model), f"{cls.__module__}.{cls.__qualname__}"
            self.first_call_t = None
            ACTIVE = self
            cls.__call__ = call
            self.state = "on"
        self.why = (f"steps are calls of the model ({self.model_name}): the job steps no optimizer; "
                    f"counted after {ENGAGE_S:.0f} s of calls")

    # -- the job's threads: the model's calls ---------------------------------------------------
    def after_call(self, module) -> None:
        """The model's class's __call__ returned (not under torch.compile)."""
        ref = self.model_ref
        if ref is None or module is not ref():
            return
        try:
            if self.state != "on":
                return
            p = self.probe
            if p.dormant or p.marker_mode or p.step_source == "optimizer":
                return
            if p.cuda_seen and self.torch.cuda.is_current_stream_capturing():
                return   # a graph capture: its replays run the work, this call does not
            now = _mono()
            self.calls += 1
            if self.first_call_t is None:
                self.first_call_t = now
                return
            if now - self.first_call_t < ENGAGE_S:
                return
            p.on_forward_step(now)
        except Exception as e:
            self.stop(f"failed and switched off: {type(e).__name__}: {e}")
            self.probe.hook_failed("forward_steps", e)
