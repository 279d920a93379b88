"""Mixed precision's skipped steps: which ``GradScaler.step`` calls did not step the optimizer.

``GradScaler.step(optimizer)`` steps the optimizer only when no gradient is inf/NaN; otherwise
it skips the step and ``update()`` halves the loss scale. A job whose fp16 forward overflows
every step learns nothing at full speed, its GPU busy (issue 30, item 3). The scaler itself
reads ``found_inf`` on the host to decide (``.item()`` in ``_maybe_opt_step``), so the probe
needs no read of its own where it can see the step: a ``step`` call during which torch's
optimizer-step hook fired stepped (the count of hook calls is TorchHooks.optimizer_calls).

Where the hook did not fire, the step was skipped -- or the hook could not see it (an optimizer
that is not a ``torch.optim.Optimizer``, a compiled ``optimizer.step``). Then the scaler's own
``found_inf`` for that optimizer says which: a read of a value the scaler has just read itself
(on a GPU, a sync on a stream with nothing new queued when it was skipped). An optimizer found
stepping unseen is not read again: its calls count as ``unknown``, as do those of optimizers that
take ``found_inf`` into their own kernel (``_step_supports_amp_scaling``: ``fused=True``), which
are stepped every time.

The loss scale: read from the scaler where its tensor is on the CPU (free); on a GPU it is not
read (that would sync) but followed as torch's ``_amp_update_scale_`` moves it (in float32):
times the backoff factor after an update whose steps found an inf, times the growth factor after
``growth_interval`` such updates in a row without one, set by ``update(new_scale)``; unknown
(None) from the first update it cannot follow (a fused optimizer's step, a tensor ``new_scale``
on the GPU, a scaler that overrides ``update`` such as FSDP's ShardedGradScaler) on. A growth
tracker restored from a checkpoint is not known: the followed scale starts at ``init_scale``.

Under torch.compile nothing here runs while dynamo traces (``is_compiling``): a guard on the
probe's counts would recompile the traced code every step.

Imports: the standard library only (torch is handed in).
"""

from __future__ import annotations

import functools
import struct

MAX_BLIND = 64   # optimizers remembered as stepping where the hook cannot see them


def _f32(x: float) -> float:
    """``x`` as float32 holds it (torch keeps the scale in float32: it underflows to 0)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return float("inf")


class ScalerWatch:
    def __init__(self, hooks) -> None:
        self.hooks = hooks            # TorchHooks: its optimizer_calls count, is_compiling
        self.on = False
        self.steps = 0                # GradScaler.step calls with the scaler enabled
        self.skipped = 0
        self.unknown = 0              # calls whose skip the probe cannot see
        self.scale: float | None = None
        self.scale_read = False       # True: read from a CPU tensor; False: followed
        self._lost = False            # the followed scale is unknown from now on
        self._good = 0                # updates in a row without an inf (the growth interval)
        self._since_update: list = []  # skipped (True/False/None) of each step since the last update
        self._blind: set[int] = set()  # optimizers (id) seen stepping without the hook

    def install(self, torch) -> None:
        cls = torch.amp.grad_scaler.GradScaler
        orig_step, orig_update = cls.step, cls.update
        compiler = getattr(torch, "compiler", None)
        is_compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
        watch = self

        @functools.wraps(orig_step)
        def step(scaler, optimizer, *args, **kwargs):
            if is_compiling() or not watch.on or not scaler.is_enabled():
                return orig_step(scaler, optimizer, *args, **kwargs)
            before = watch.hooks.optimizer_calls
            out = orig_step(scaler, optimizer, *args, **kwargs)
            try:
                seen = watch.hooks.optimizer_calls > before if watch.hooks.opt_on else None
                watch._stepped(scaler, optimizer, seen)
            except Exception as e:
                watch.hooks.probe.hook_failed("grad_scaler", e)
            return out

        @functools.wraps(orig_update)
        def update(scaler, new_scale=None):
            out = orig_update(scaler, new_scale)
            if not is_compiling() and watch.on and scaler.is_enabled():
                try:
                    watch._updated(scaler, new_scale)
                except Exception as e:
                    watch.hooks.probe.hook_failed("grad_scaler", e)
            return out

        cls.step, cls.update = step, update
        self.hooks._undo.append(lambda: (setattr(cls, "step", orig_step), setattr(cls, "update", orig_update)))
        self.on = True

    def _stepped(self, scaler, optimizer, seen: bool | None) -> None:
        """One GradScaler.step call: ``seen`` whether the optimizer hook fired (None: hook off)."""
        self.steps += 1
        skipped: bool | None
        if seen is None or getattr(optimizer, "_step_supports_amp_scaling", False) or id(optimizer) in self._blind:
            skipped = None
        elif seen:
            skipped = False
        else:
            found = _found_inf(scaler, optimizer)
            if found is None:
                skipped = None
            elif found:
                skipped = True
            else:   # it stepped and the hook did not see it: never read for this one again
                skipped = None
                if len(self._blind) < MAX_BLIND:
                    self._blind.add(id(optimizer))
        if skipped is None:
            self.unknown += 1
        else:
            self.skipped += skipped
        self._since_update.append(skipped)

    def _updated(self, scaler, new_scale) -> None:
        steps, self._since_update = self._since_update, []
        scale = getattr(scaler, "_scale", None)
        if scale is not None and getattr(getattr(scale, "device", None), "type", None) == "cpu":
            self.scale, self.scale_read, self._lost = float(scale), True, False
            return
        self.scale_read = False
        if new_scale is not None:
            if isinstance(new_scale, (int, float)):
                self.scale, self._lost, self._good = _f32(float(new_scale)), False, 0
            else:
                self.scale, self._lost = None, True   # a tensor on the GPU: not read
            return
        if self._lost or None in steps or not steps:
            self.scale, self._lost = None, True
            return
        if self.scale is None:
            self.scale = _f32(float(getattr(scaler, "_init_scale", 65536.0)))
        if any(steps):   # torch backs off if any optimizer's step found an inf
            self.scale = _f32(self.scale * float(getattr(scaler, "_backoff_factor", 0.5)))
            self._good = 0
        else:
            self._good += 1
            if self._good >= int(getattr(scaler, "_growth_interval", 2000)):
                self.scale = _f32(self.scale * float(getattr(scaler, "_growth_factor", 2.0)))
                self._good = 0

    def totals(self) -> dict | None:
        """Counts since the probe loaded (the client takes differences from a connection's first
        message on); None before any call."""
        if not self.steps:
            return None
        return {"steps": self.steps, "skipped": self.skipped, "unknown": self.unknown, "scale": self.scale,
                "scale_read": self.scale_read}


def _found_inf(scaler, optimizer) -> bool | None:
    """Whether the scaler found an inf/NaN for this optimizer's step (its own record, read after
    it read it itself); None where it keeps none."""
    states = getattr(scaler, "_per_optimizer_states", None)
    state = states.get(id(optimizer)) if isinstance(states, dict) else None
    found = state.get("found_inf_per_device") if isinstance(state, dict) else None
    if not found:
        return None
    return any(float(v) != 0.0 for v in found.values())
