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
  times, and a count started inside a Bottleneck took that ReLU for the model, on an H100). The
  first module called so ``LEARN_CALLS`` times is the model. A global hook sends every module
  call down nn.Module's slow path while it is in, so it goes as soon as the model is known, and
  after ``LEARN_MAX_S`` at most.
- The model's class then gets a ``__call__`` that calls nn.Module's own and, for that one
  instance (a weak reference: the probe never keeps a model alive), marks a step. Never a hook
  on the instance: nn.Module keeps hooks in the instance's own dicts, so ``torch.save(model)``
  and ``copy.deepcopy(model)`` (an EMA copy) would carry the probe's function with them. Every
  other instance of that class pays one Python call more (~0.2 us).
- Calls count as steps only after the model has been called for ``ENGAGE_S`` with no optimizer
  step (a training job's first forwards come before its first optimizer step; gradient
  accumulation makes several). An optimizer step, ``gputop.probe.step()`` or torch.compile seen
  later ends it for good, and the class gets its own ``__call__`` back.
- A call made during a CUDA graph capture is not a step (the capture replays, not the call).

Limits: a loop that calls a small module several times per item at the top level (an RNN cell
stepped from the loop itself) gets that call as its step; a loop that replays a CUDA graph
instead of calling the model has no steps after the capture; ``gputop.probe.step()`` marks
steps exactly in both. Under torch.fx tracing, other instances of the model's class are traced
through the probe's ``__call__`` (not kept as leaf modules) while the probe watches.

Imports: the standard library only (torch is handed in).
"""

from __future__ import annotations

import sys
import threading
import weakref

from gputop.probe.util import _mono

ARM_AFTER_S = 10.0   # no optimizer step this long after torch came in (and a monitor attached): look for a model
LEARN_CALLS = 3      # the first module called this many times with no other module's call open is the model
LEARN_MAX_S = 60.0   # the global hooks stay in this long at most
MAX_CANDIDATES = 64  # top-level modules remembered while learning
ENGAGE_S = 5.0       # the model's calls are steps once it has been called this long with no optimizer step


class ForwardSteps:
    """One per probe (torch_hooks.TorchHooks.forward_steps). ``tick`` runs on the probe thread;
    the hooks and the class's ``__call__`` on the job's threads."""

    def __init__(self, probe, torch) -> None:
        self.probe = probe
        self.torch = torch
        self.state = "waiting"             # waiting | learning | on | off
        self.why = "waiting for a job that never steps an optimizer"
        self.t_torch = _mono()             # when the job's torch came in
        self._lock = threading.Lock()      # state changes: found (job's thread) against stop (probe thread)
        self._handles: list = []           # the global hook while learning
        self._learn_t: float | None = None
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
        """Each window: arm, give up, or stop; then the hook's state for the monitors."""
        p = self.probe
        if self.state != "off":
            why = self._refused()
            if why is not None:
                self.stop(why)
            elif self.state == "waiting":
                if not p.dormant and p.monitoring and now - self.t_torch >= ARM_AFTER_S:
                    self._learn(now)
            elif self.state == "learning" and now - (self._learn_t or now) > LEARN_MAX_S:
                self.stop(f"no module was called {LEARN_CALLS} times at the top level in {LEARN_MAX_S:.0f} s")
        if p.hooks.get("forward_steps", [None])[0] != "failed":
            p.set_hook("forward_steps", "on" if self.state in ("learning", "on") else "off", self.why)

    def _learn(self, now: float) -> None:
        pre = getattr(self.torch.nn.modules.module, "register_module_forward_pre_hook", None)
        if pre is None or self._call_impl_code is None:
            self.stop(f"torch {self.torch.__version__} has no global module hook: call gputop.probe.step() per batch")
            return
        self._learn_t = now
        self.state = "learning"
        self.why = "looking for the model: the module the job calls at the top level"
        self._handles.append(pre(self._pre))

    def _drop_learners(self) -> None:  # (any thread: a RemovableHandle's remove is a dict delete)
        handles, self._handles = self._handles, []
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass
        self._counts = {}

    def stop(self, why: str) -> None:
        """Off for good (any thread): the global hooks out, the class's own __call__ back."""
        with self._lock:
            self.state, self.why = "off", why
            cls, self._cls = self._cls, None
        self._drop_learners()
        if cls is not None:
            try:
                if self._cls_had_call:
                    cls.__call__ = self._cls_call
                else:
                    del cls.__call__
            except Exception:
                pass
        if self.probe.step_source == "forward":
            self.probe.config_dirty = True

    # -- the job's threads: learning ------------------------------------------------------------
    def _pre(self, module, args) -> None:
        if self.state != "learning" or self._is_compiling():
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
            c = self._counts.get(id(module))
            if c is None or c[1]() is not module:
                if len(self._counts) >= MAX_CANDIDATES:
                    return
                c = self._counts[id(module)] = [0, weakref.ref(module)]
            c[0] += 1
            if c[0] >= LEARN_CALLS:
                self._found(module)
        except Exception as e:
            self.stop(f"could not find the model: {type(e).__name__}: {e}")

    def _found(self, model) -> None:
        """On the job's thread, in the model's third top-level call (before its forward runs)."""
        self._drop_learners()
        cls = type(model)
        had = "__call__" in cls.__dict__
        orig = cls.__dict__["__call__"] if had else None
        call_impl = cls.__call__   # (the class's own, a base class's, or nn.Module's: as Python finds it)
        ref = weakref.ref(model)
        steps = self

        def __call__(module, *args, **kwargs):
            out = call_impl(module, *args, **kwargs)
            if module is ref():
                steps._model_called()
            return out

        __call__.__wrapped__ = call_impl
        __call__.__qualname__ = f"{cls.__qualname__}.__call__"
        with self._lock:   # (the probe thread may stop this meanwhile: then the class stays as it is)
            if self.state != "learning":
                return
            self._cls, self._cls_had_call, self._cls_call = cls, had, orig
            self.model_ref, self.model_name = ref, f"{cls.__module__}.{cls.__qualname__}"
            cls.__call__ = __call__
            self.state = "on"
        self.why = (f"steps are calls of the model ({self.model_name}): the job steps no optimizer; "
                    f"counted after {ENGAGE_S:.0f} s of calls")

    # -- the job's threads: the model's calls ---------------------------------------------------
    def _model_called(self) -> None:
        try:
            if self.state != "on" or self._is_compiling():
                return
            p = self.probe
            if p.dormant or p.marker_mode or p.step_source == "optimizer":
                return
            torch = self.torch
            if p.cuda_seen and torch.cuda.is_current_stream_capturing():
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
