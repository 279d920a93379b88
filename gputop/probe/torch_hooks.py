"""The probe's hooks into torch, installed once the job has imported torch.

Each hook is optional: a torch that lacks the API gets that hook marked ``unavailable`` with the
reason (and what to do instead); a hook that raises is switched off and marked ``failed``
(core.Probe.hook_failed). Every wrapper calls the original first or last exactly as torch would,
so switching a hook off leaves plain torch behaviour.

Hooks:
- ``optimizer_step``: torch.optim.optimizer.register_optimizer_step_post_hook (torch >= 2.0),
  one global hook for every optimizer.
- ``dataloader``: wraps ``_BaseDataLoaderIter.__next__`` (time blocked per batch) and
  ``DataLoader.__iter__`` (worker start-up, also time the loop waits for data).
- ``autocast``: wraps ``torch.amp.autocast_mode.autocast.__enter__`` to see AMP in use.
- ``compile``: wraps ``torch.compile`` to see it in use (mode, backend).
- ``cuda_events``: CUDA events at step boundaries (core.Probe), only with a monitor attached.
- ``syncs``: ``torch.cuda.set_sync_debug_mode("warn")`` while a monitor is attached and CUDA is
  in use; each implicit sync then raises a UserWarning at the Python line that caused it, which
  a ``warnings.showwarning`` wrapper counts (and hides) instead of printing.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

from gputop.probe import wire
from gputop.probe.core import SYNC_MESSAGE, Probe, _mono

MAX_LOADERS = 16
MAX_COMPILE_CALLS = 16


class TorchHooks:
    def __init__(self, probe: Probe, torch) -> None:
        self.probe = probe
        self.torch = torch
        self._undo: list = []
        self.opt_on = self.dl_on = self.amp_on = self.compile_on = False
        self.loaders: dict[tuple, dict] = {}
        self.optimizer: dict | None = None
        self.autocast: set[str] = set()
        self.compile_calls: list[dict] = []
        self.compile_count = 0
        self._sync_filter = None
        self._prev_showwarning = None
        self._we_set_sync_mode = False
        self.cuda_available = False
        torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        probe_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
        self.skip_prefixes = (torch_dir, probe_dir, os.path.abspath(warnings.__file__))

    # -- install / uninstall ------------------------------------------------------------------
    def install(self) -> None:
        p, torch = self.probe, self.torch
        for name, fn in (("optimizer_step", self._install_optimizer), ("dataloader", self._install_dataloader),
                         ("autocast", self._install_autocast), ("compile", self._install_compile)):
            try:
                fn()
            except Exception as e:  # an API that moved: skip the hook, say which
                p.set_hook(name, "unavailable", f"could not install on torch {torch.__version__}: {type(e).__name__}: {e}")
        # A CUDA build? (Never torch.cuda.is_available() here: it would initialise the driver in
        # a process that may fork DataLoader workers next; is_initialized() is a plain flag.)
        self.cuda_available = bool(getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None))
        if not self.cuda_available:
            p.set_hook("cuda_events", "off", "this torch has no CUDA: no GPU time per step")
            p.set_hook("syncs", "off", "this torch has no CUDA: no device syncs to count")
        else:
            p.set_hook("cuda_events", "off", "waiting for a monitor and for the job to use CUDA")
            if not hasattr(torch.cuda, "set_sync_debug_mode"):
                p.set_hook("syncs", "unavailable", f"torch {torch.__version__} has no torch.cuda.set_sync_debug_mode (needs >= 1.10)")
            else:
                p.set_hook("syncs", "off", "waiting for a monitor and for the job to use CUDA")

    def uninstall(self) -> None:
        self.opt_on = self.dl_on = self.amp_on = self.compile_on = False
        try:
            self.set_sync_capture(False)
        except Exception:
            pass
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo = []

    def disable(self, name: str) -> None:
        if name == "optimizer_step":
            self.opt_on = False
        elif name == "dataloader":
            self.dl_on = False
        elif name == "autocast":
            self.amp_on = False
        elif name == "compile":
            self.compile_on = False
        elif name == "syncs":
            try:
                self.set_sync_capture(False)
            except Exception:
                pass

    def _install_optimizer(self) -> None:
        p, torch = self.probe, self.torch
        import torch.optim.optimizer as optmod
        register = getattr(optmod, "register_optimizer_step_post_hook", None)
        if register is None:
            p.set_hook("optimizer_step", "unavailable",
                       f"torch {torch.__version__} has no register_optimizer_step_post_hook (needs >= 2.0): "
                       "call gputop.probe.step() once per step to count steps")
            return
        is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
        hooks = self

        def gputop_optimizer_step_hook(optimizer, args, kwargs):
            if not hooks.opt_on or is_compiling():
                return
            try:
                p.on_optimizer_step(optimizer)
            except Exception as e:
                p.hook_failed("optimizer_step", e)

        handle = register(gputop_optimizer_step_hook)
        self._undo.append(handle.remove)
        self.opt_on = True
        p.set_hook("optimizer_step", "on", "steps from torch's global optimizer-step hook")

    def _install_dataloader(self) -> None:
        p, torch = self.probe, self.torch
        import torch.utils.data.dataloader as dl
        base = getattr(dl, "_BaseDataLoaderIter", None)
        if base is None or not hasattr(base, "__next__"):
            p.set_hook("dataloader", "unavailable",
                       f"torch {torch.__version__} has no DataLoader._BaseDataLoaderIter.__next__: no data-wait timing")
            return
        hooks = self
        orig_next = base.__dict__["__next__"]
        orig_iter = dl.DataLoader.__dict__["__iter__"]

        @functools.wraps(orig_next)
        def __next__(it):
            if not hooks.dl_on:
                return orig_next(it)
            t0 = _mono()
            batch = orig_next(it)
            try:
                p.on_batch(it, t0, _mono(), batch)
            except Exception as e:
                p.hook_failed("dataloader", e)
            return batch

        @functools.wraps(orig_iter)
        def __iter__(loader):
            if not hooks.dl_on:
                return orig_iter(loader)
            t0 = _mono()
            it = orig_iter(loader)
            try:
                p.on_loader_iter(_mono() - t0)
            except Exception as e:
                p.hook_failed("dataloader", e)
            return it

        base.__next__ = __next__
        dl.DataLoader.__iter__ = __iter__

        def undo():
            base.__next__ = orig_next
            dl.DataLoader.__iter__ = orig_iter
        self._undo.append(undo)
        self.dl_on = True
        p.set_hook("dataloader", "on", "time blocked in next() on DataLoader iterators")

    def _install_autocast(self) -> None:
        p = self.probe
        import torch.amp.autocast_mode as am
        cls = am.autocast
        orig = cls.__dict__["__enter__"]
        hooks = self

        @functools.wraps(orig)
        def __enter__(ac):
            if hooks.amp_on:
                try:
                    if getattr(ac, "_enabled", True):
                        key = f"{getattr(ac, 'device', '?')}:{str(getattr(ac, 'fast_dtype', '?')).replace('torch.', '')}"
                        if key not in hooks.autocast and len(hooks.autocast) < 8:
                            hooks.autocast.add(key)
                            p.config_dirty = True
                except Exception as e:
                    p.hook_failed("autocast", e)
            return orig(ac)

        cls.__enter__ = __enter__
        self._undo.append(lambda: setattr(cls, "__enter__", orig))
        self.amp_on = True
        p.set_hook("autocast", "on", "notes autocast regions entered")

    def _install_compile(self) -> None:
        p, torch = self.probe, self.torch
        orig = getattr(torch, "compile", None)
        if orig is None:
            p.set_hook("compile", "unavailable", f"torch {torch.__version__} has no torch.compile")
            return
        hooks = self

        @functools.wraps(orig)
        def compile(*args, **kwargs):
            if hooks.compile_on:
                try:
                    hooks.compile_count += 1
                    p.config_dirty = True
                    if len(hooks.compile_calls) < MAX_COMPILE_CALLS:
                        hooks.compile_calls.append({"mode": kwargs.get("mode"), "backend": str(kwargs.get("backend", "inductor")),
                                                    "fullgraph": bool(kwargs.get("fullgraph", False))})
                except Exception as e:
                    p.hook_failed("compile", e)
            return orig(*args, **kwargs)

        torch.compile = compile
        self._undo.append(lambda: setattr(torch, "compile", orig))
        self.compile_on = True
        p.set_hook("compile", "on", "notes torch.compile calls")

    # -- called from the hot path, once per new iterator / lead optimizer -----------------------
    def loader_seen(self, it) -> int | None:
        """Note a DataLoader iterator's settings; return its batch size (None if unknown)."""
        sampler = getattr(it, "_index_sampler", None)
        batch_size = getattr(sampler, "batch_size", None) if getattr(it, "_auto_collation", True) else None
        cfg = {
            "dataset": type(getattr(it, "_dataset", None)).__name__,
            "batch_size": batch_size,
            "num_workers": getattr(it, "_num_workers", None),
            "pin_memory": getattr(it, "_pin_memory", None),
            # Only the multi-process iterator has a prefetch factor; None = not applicable.
            "prefetch_factor": getattr(it, "_prefetch_factor", None),
            "persistent_workers": getattr(it, "_persistent_workers", None),
            "drop_last": getattr(it, "_drop_last", None),
            "timeout": getattr(it, "_timeout", None),
        }
        key = tuple(cfg.values())
        entry = self.loaders.get(key)
        if entry is None and len(self.loaders) < MAX_LOADERS:
            entry = self.loaders[key] = {**cfg, "iterators": 0}
            self.probe.config_dirty = True
        if entry is not None:
            entry["iterators"] += 1
        return batch_size if isinstance(batch_size, int) else None

    def note_optimizer(self, opt) -> None:
        self.probe.config_dirty = True
        try:
            params = [q for g in opt.param_groups for q in g.get("params", [])][:10000]
            dtypes = sorted({str(q.dtype).replace("torch.", "") for q in params[:256]})
            defaults = getattr(opt, "defaults", {}) or {}
            self.optimizer = {
                "class": type(opt).__name__, "param_tensors": len(params),
                "params": int(sum(q.numel() for q in params)), "param_dtypes": dtypes,
                "fused": defaults.get("fused"), "foreach": defaults.get("foreach"),
                "capturable": defaults.get("capturable"),
            }
        except Exception as e:
            self.optimizer = {"class": type(opt).__name__, "error": f"{type(e).__name__}: {e}"}

    def in_dataloader_worker(self) -> bool:
        try:
            import torch.utils.data as tud
            return tud.get_worker_info() is not None
        except Exception:
            return False

    # -- probe thread ---------------------------------------------------------------------------
    def cuda_in_use(self) -> bool:
        if not self.cuda_available:
            return False
        try:
            return bool(self.torch.cuda.is_initialized())
        except Exception:
            return False

    def manage(self, p: Probe) -> None:
        """Each window: CUDA timing and sync capture follow 'a monitor is attached and the job
        uses CUDA'. Never initialises CUDA itself (that would cost the job a context)."""
        if not self.cuda_available:
            return
        in_use = self.cuda_in_use()
        ev = p.hooks.get("cuda_events", ["off"])[0]
        if ev != "failed":
            want = p.monitoring and in_use
            if want and not p.cuda_events_on:
                p.cuda_events_on = True
                p.set_hook("cuda_events", "on", "CUDA events at step boundaries, read with query()")
            elif not want and p.cuda_events_on:
                p.cuda_events_on = False
            if not in_use:
                p.set_hook("cuda_events", "off", "the job has not used CUDA yet")
        sy = p.hooks.get("syncs", ["off"])[0]
        if sy in ("failed", "unavailable"):
            return
        want = p.monitoring and in_use
        if want != p.sync_capture:
            self.set_sync_capture(want)
        elif not in_use:
            p.set_hook("syncs", "off", "the job has not used CUDA yet")
        if p.sync_capture:
            self._check_sync_plumbing()

    def set_sync_capture(self, on: bool) -> None:
        p, torch = self.probe, self.torch
        if on:
            if self._error_filter_present():
                p.set_hook("syncs", "off", "the job turns warnings into errors (-W error or a filter): sync counting "
                                           "stays off so that a sync can never raise in the job")
                return
            mode = torch.cuda.get_sync_debug_mode()
            if mode != 0:
                p.set_hook("syncs", "off", f"the job set torch.cuda.set_sync_debug_mode({mode}) itself: left alone, not counted")
                return
            self._ensure_showwarning()
            if self._sync_filter is None:
                warnings.filterwarnings("always", message=SYNC_MESSAGE, category=UserWarning)
                self._sync_filter = warnings.filters[0]
            p.sync_capture = True
            self._we_set_sync_mode = True
            with warnings.catch_warnings():
                # torch warns that the sync debug mode is a prototype: noise in the job's stderr
                warnings.simplefilter("ignore", UserWarning)
                torch.cuda.set_sync_debug_mode(1)
            p.set_hook("syncs", "on", "counts implicit device syncs per step (sync debug mode 'warn', hidden)")
        else:
            if self._we_set_sync_mode:
                if self.cuda_in_use() and torch.cuda.get_sync_debug_mode() == 1:
                    torch.cuda.set_sync_debug_mode(0)
            p.sync_capture = False
            if self._sync_filter is not None:
                try:
                    warnings.filters.remove(self._sync_filter)
                    warnings._filters_mutated()
                except (ValueError, AttributeError):
                    pass
                self._sync_filter = None
            if p.hooks.get("syncs", [""])[0] == "on":
                p.set_hook("syncs", "off", "no monitor attached")

    def _ensure_showwarning(self) -> None:
        if warnings.showwarning is getattr(self, "_showwarning", None):
            return
        prev = warnings.showwarning
        p, hooks = self.probe, self

        def _showwarning(message, category, filename, lineno, file=None, line=None):
            try:
                if str(message).startswith(SYNC_MESSAGE):
                    if p.sync_capture:
                        p.count_sync(filename, lineno, sys._getframe(1))
                        return None
                    if hooks._we_set_sync_mode and hooks.torch.cuda.get_sync_debug_mode() == 0:
                        return None  # a straggler from our own capture, emitted just after it ended
            except Exception as e:
                p.hook_failed("syncs", e)
            return prev(message, category, filename, lineno, file, line)

        self._showwarning = _showwarning
        warnings.showwarning = _showwarning

        def undo():
            if warnings.showwarning is _showwarning:
                warnings.showwarning = prev
        self._undo.append(undo)

    def _check_sync_plumbing(self) -> None:
        """The job (or a library) may change warnings after we started: logging.captureWarnings
        replaces showwarning (wrap it again); a catch_warnings() block that ends drops a filter
        inserted while it ran (insert ours again); a filter that turns warnings into errors
        would make every sync raise in the job: stop capturing at once."""
        p = self.probe
        if self._error_filter_present():
            self.set_sync_capture(False)
            p.set_hook("syncs", "off", "the job turns warnings into errors (-W error or a filter): sync counting "
                                       "stays off so that a sync can never raise in the job")
            return
        if warnings.showwarning is not getattr(self, "_showwarning", None):
            self._ensure_showwarning()
        first = self._first_matching_filter()
        if first is not self._sync_filter:
            warnings.filterwarnings("always", message=SYNC_MESSAGE, category=UserWarning)
            self._sync_filter = warnings.filters[0]

    def _first_matching_filter(self):
        for f in warnings.filters:
            _action, msg_re, cat, _mod, _line = f
            if (msg_re is None or msg_re.match(SYNC_MESSAGE)) and isinstance(cat, type) and issubclass(UserWarning, cat):
                return f
        return None

    def _error_filter_present(self) -> bool:
        for f in warnings.filters:
            action, msg_re, cat, _mod, _line = f
            if action == "error" and (msg_re is None or msg_re.match(SYNC_MESSAGE)) \
                    and isinstance(cat, type) and issubclass(UserWarning, cat):
                return True
        return False

    def memory(self) -> dict | None:
        if not self.cuda_in_use():
            return None
        cuda = self.torch.cuda
        dev = self.probe.cuda_device
        if dev is None:
            dev = cuda.current_device()
        s = cuda.memory_stats(dev)
        return {"type": wire.MSG_MEMORY, "mono": _mono(), "device": dev,
                "allocated": s.get("allocated_bytes.all.current"), "reserved": s.get("reserved_bytes.all.current"),
                "peak_allocated": s.get("allocated_bytes.all.peak"), "peak_reserved": s.get("reserved_bytes.all.peak"),
                "alloc_retries": s.get("num_alloc_retries"), "ooms": s.get("num_ooms")}

    def config(self) -> dict:
        torch, env = self.torch, os.environ
        cfg: dict = {"torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
                     "cuda_build": self.cuda_available}
        cfg["cuda_initialized"] = self.cuda_in_use()
        cfg["cudnn"] = _safe(lambda: torch.backends.cudnn.version()) if cfg["cuda_initialized"] else None
        if cfg["cuda_initialized"]:
            dev = self.probe.cuda_device if self.probe.cuda_device is not None else torch.cuda.current_device()
            cfg["device"] = dev
            cfg["device_name"] = _safe(lambda: torch.cuda.get_device_name(dev))
            cap = _safe(lambda: torch.cuda.get_device_capability(dev))
            cfg["capability"] = f"{cap[0]}.{cap[1]}" if cap else None
        else:
            cfg["device"] = cfg["device_name"] = cfg["capability"] = None
        cfg["amp_autocast"] = sorted(list(self.autocast))
        cfg["tf32_matmul"] = _safe(lambda: bool(torch.backends.cuda.matmul.allow_tf32))
        cfg["tf32_cudnn"] = _safe(lambda: bool(torch.backends.cudnn.allow_tf32))
        cfg["float32_matmul_precision"] = _safe(torch.get_float32_matmul_precision)
        cfg["cudnn_benchmark"] = _safe(lambda: bool(torch.backends.cudnn.benchmark))
        cfg["cudnn_deterministic"] = _safe(lambda: bool(torch.backends.cudnn.deterministic))
        cfg["deterministic_algorithms"] = _safe(torch.are_deterministic_algorithms_enabled)
        cfg["anomaly_detection"] = _safe(torch.is_anomaly_enabled)
        cfg["num_threads"] = _safe(torch.get_num_threads)
        graphs = None
        dyn = sys.modules.get("torch._dynamo.utils")
        if dyn is not None:
            stats = getattr(dyn, "counters", {}).get("stats")
            graphs = int(stats.get("unique_graphs", 0)) if stats is not None else 0
        cfg["compile"] = {"calls": self.compile_count, "uses": list(self.compile_calls), "graphs": graphs}
        cfg["cuda_launch_blocking"] = env.get("CUDA_LAUNCH_BLOCKING")
        cfg["sync_debug_mode_job"] = None
        if self.cuda_in_use() and not self.probe.sync_capture:
            cfg["sync_debug_mode_job"] = _safe(torch.cuda.get_sync_debug_mode)
        cfg["rank"] = _env_int(env, "RANK")
        cfg["local_rank"] = _env_int(env, "LOCAL_RANK")
        cfg["world_size"] = _env_int(env, "WORLD_SIZE")
        dist = getattr(torch, "distributed", None)
        if dist is not None and _safe(dist.is_available) and _safe(dist.is_initialized):
            cfg["dist_backend"] = _safe(lambda: str(dist.get_backend()))
            cfg["rank"] = _safe(dist.get_rank)
            cfg["world_size"] = _safe(dist.get_world_size)
        else:
            cfg["dist_backend"] = None
        cfg["optimizer"] = dict(self.optimizer) if self.optimizer else None
        cfg["loaders"] = [dict(v) for v in list(self.loaders.values())]
        return cfg


def _safe(fn):
    try:
        return fn()
    except Exception:
        return None


def _env_int(env, name):
    v = env.get(name)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None
