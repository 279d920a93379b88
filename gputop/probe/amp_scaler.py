"""Mixed precision's skipped steps: which ``GradScaler.step`` calls did not step the optimizer.

``GradScaler.step(optimizer)`` steps the optimizer only when no gradient is inf/NaN; otherwise
it skips the step and ``update()`` halves the loss scale. A job whose fp16 forward overflows
every step learns nothing at full speed, its GPU busy (issue 30, item 3). The scaler itself
reads ``found_inf`` on the host to decide (``.item()`` in ``_maybe_opt_step``), so the probe
needs no read of its own: a ``step`` call during which torch's optimizer-step hook did not fire
was skipped (the count of hook calls is TorchHooks.optimizer_calls). No sync, no tensor read.

The loss scale: read from the scaler where its tensor is on the CPU (free); on a GPU it is not
read (that would sync) but followed as torch's ``_amp_update_scale_`` moves it: times the
backoff factor after a skipped step, times the growth factor after ``growth_interval``
steps in a row that were not skipped, set by ``update(new_scale)``.

Optimizers that take the scaler's ``found_inf`` themselves (fused/capturable Adam:
``_step_supports_amp_scaling``) are stepped every time and skip inside the kernel: their skips
are not seen (``unknown`` counts those calls).

Imports: the standard library only (torch is handed in).
"""

from __future__ import annotations

import functools


class ScalerWatch:
    def __init__(self, hooks) -> None:
        self.hooks = hooks            # TorchHooks: its optimizer_calls count
        self.on = False
        self.steps = 0                # GradScaler.step calls with the scaler enabled
        self.skipped = 0
        self.unknown = 0              # calls whose skip the probe cannot see (fused optimizers)
        self.scale: float | None = None
        self.scale_read = False       # True: read from a CPU tensor; False: followed
        self._good = 0                # steps in a row not skipped (for the growth interval)
        self._last_skipped = False

    def install(self, torch) -> None:
        cls = torch.amp.grad_scaler.GradScaler
        orig_step, orig_update = cls.step, cls.update
        watch = self

        @functools.wraps(orig_step)
        def step(scaler, optimizer, *args, **kwargs):
            if not watch.on or not scaler.is_enabled():
                return orig_step(scaler, optimizer, *args, **kwargs)
            before = watch.hooks.optimizer_calls
            out = orig_step(scaler, optimizer, *args, **kwargs)
            try:
                # (the optimizer hook switched off: whether it stepped is not known)
                watch._stepped(scaler, optimizer, watch.hooks.optimizer_calls > before if watch.hooks.opt_on else None)
            except Exception as e:
                watch.hooks.probe.hook_failed("grad_scaler", e)
            return out

        @functools.wraps(orig_update)
        def update(scaler, new_scale=None):
            out = orig_update(scaler, new_scale)
            if watch.on and scaler.is_enabled():
                try:
                    watch._updated(scaler, new_scale)
                except Exception as e:
                    watch.hooks.probe.hook_failed("grad_scaler", e)
            return out

        cls.step, cls.update = step, update
        self.hooks._undo.append(lambda: (setattr(cls, "step", orig_step), setattr(cls, "update", orig_update)))
        self.on = True

    def _stepped(self, scaler, optimizer, stepped: bool | None) -> None:
        self.steps += 1
        if stepped is None or getattr(optimizer, "_step_supports_amp_scaling", False):
            self.unknown += 1
            self._last_skipped = None
            return
        self._last_skipped = not stepped
        self.skipped += not stepped

    def _updated(self, scaler, new_scale) -> None:
        scale = getattr(scaler, "_scale", None)
        if scale is not None and getattr(getattr(scale, "device", None), "type", None) == "cpu":
            self.scale, self.scale_read = float(scale), True
            return
        self.scale_read = False
        if isinstance(new_scale, (int, float)):
            self.scale = float(new_scale)
            return
        if self.scale is None:
            self.scale = float(getattr(scaler, "_init_scale", 65536.0))
        if self._last_skipped:
            self.scale *= float(getattr(scaler, "_backoff_factor", 0.5))
            self._good = 0
        elif self._last_skipped is False:
            self._good += 1
            if self._good >= int(getattr(scaler, "_growth_interval", 2000)):
                self.scale *= float(getattr(scaler, "_growth_factor", 2.0))
                self._good = 0
        else:
            self.scale = None   # a fused optimizer skipped or not: the scale is not known

    def totals(self) -> dict | None:
        """Counts since the probe loaded (the window takes differences); None before any call."""
        if not self.steps:
            return None
        return {"steps": self.steps, "skipped": self.skipped, "unknown": self.unknown, "scale": self.scale,
                "scale_read": self.scale_read}
