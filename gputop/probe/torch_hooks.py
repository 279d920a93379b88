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
- ``grad_scaler``: wraps ``torch.amp.GradScaler.step``/``update`` to count skipped steps
  (amp_scaler.py: a step call during which the optimizer hook did not fire).
- ``cuda_events``: CUDA events at step boundaries (core.Probe), only with a monitor attached.
- ``forward_steps``: in a job that steps no optimizer, the model's calls as steps
  (forward_steps.py: a global module hook for a few calls to find it, then its class's ``__call__``).
- ``syncs``: ``torch.cuda.set_sync_debug_mode("warn")`` while a monitor is attached and CUDA is
  in use; each implicit sync then raises a UserWarning at the Python line that caused it, which
  a wrapper of ``warnings._showwarnmsg`` counts (and hides) instead of showing. A wrapper of
  ``warnings._add_filter`` (behind ``simplefilter``, ``filterwarnings`` and
  ``catch_warnings(action=...)``) turns counting off on the caller's thread *before* a filter
  that would make the sync warning an error goes in, so a sync can never raise in the job.
  That hook's plumbing is in sync_capture.py (SyncCapture, a base of TorchHooks).

The probe thread makes CUDA calls (event queries, device properties) only after it has made
the job's own device current on itself, and only if that device already has a context: the
current device is per thread, and a CUDA call on a thread whose current device (0 by default)
has no context would create one there, on a GPU the rank does not use.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import warnings
import weakref

from gputop.probe import wire
from gputop.probe.amp_scaler import ScalerWatch
from gputop.probe.compiles import CompileWatch
from gputop.probe.core import Probe, _env_int, _mono
# The syncs hook (its own concern: warnings plumbing); its names importable from here as before.
from gputop.probe.sync_capture import (  # noqa: F401
    ERROR_FILTER_WHY, SYNC_FILTER, SYNC_PROTOTYPE_MESSAGE, SyncCapture, _errors_on_sync,
)

MAX_LOADERS = 16
MAX_COMPILE_CALLS = 16


class TorchHooks(SyncCapture):
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
        # CUDA graphs being captured (for the kernel trace only): weak, so a graph whose capture
        # the job began and never ended (an exception between, the graph dropped) stops counting
        self.open_graphs: weakref.WeakSet = weakref.WeakSet()
        self.last_capture_t: float | None = None   # monotonic time a capture last began or ended
        self.compiles = CompileWatch()     # dynamo's compilations, read per window (probe thread)
        self.optimizer_calls = 0           # optimizer steps torch's global hook saw
        self.scaler = ScalerWatch(self)    # GradScaler's skipped steps (gputop/probe/amp_scaler.py)
        self._sync_filter = None           # SYNC_FILTER while we keep it in warnings.filters
        self._showwarnmsg = None           # our wrapper of warnings._showwarnmsg, once installed
        self._add_filter = None            # our wrapper of warnings._add_filter, once installed
        # Serialises "turn sync counting on" (probe thread) with "an error filter goes in" (any
        # thread). Held only for flag flips and list operations, never while calling a warnings
        # function or waiting for anything. Reentrant: the _add_filter wrapper turns counting off
        # while holding it.
        self._sync_lock = threading.RLock()
        self._error_filters_pending = 0    # error filters being added right now
        self._enabling_thread: int | None = None   # thread turning the sync mode on, while it does
        self._we_set_sync_mode = False
        self._probe_thread = threading.local()     # .device: the device made current on that thread
        self.device_why = "waiting for the job's next step to learn its CUDA device"
        self.cuda_available = False
        torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        probe_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
        self.skip_prefixes = (torch_dir, probe_dir, os.path.abspath(warnings.__file__))

    # -- install / uninstall ------------------------------------------------------------------
    def install(self) -> None:
        p, torch = self.probe, self.torch
        for name, fn in (("optimizer_step", self._install_optimizer), ("dataloader", self._install_dataloader),
                         ("autocast", self._install_autocast), ("compile", self._install_compile),
                         ("grad_scaler", self._install_grad_scaler), ("graph_capture", self._install_graph_capture)):
            try:
                fn()
            except Exception as e:  # an API that moved: skip the hook, say which
                p.set_hook(name, "unavailable",
                           f"could not install on torch {torch.__version__}: {type(e).__name__}: {e}")
        self.forward_steps = None          # steps of a job with no optimizer (gputop/probe/forward_steps.py)
        try:
            from gputop.probe.forward_steps import ForwardSteps
            self.forward_steps = ForwardSteps(p, torch)
        except Exception as e:
            p.set_hook("forward_steps", "unavailable", f"{type(e).__name__}: {e}")
        try:
            from gputop.probe.flops import FlopCounter
            p.flops = FlopCounter(p, torch)
            p.set_hook("flops", "on" if p.flops.armed else "unavailable", p.flops.off or "")
        except Exception as e:
            p.set_hook("flops", "unavailable", f"{type(e).__name__}: {e}")
        self.collectives = None            # DDP/FSDP collective timing (gputop/probe/collectives.py)
        try:
            from gputop.probe.collectives import Collectives
            self.collectives = Collectives(p, torch)
            self.collectives.install()
        except Exception as e:
            p.set_hook("collectives", "unavailable", f"could not install: {type(e).__name__}: {e}")
        # A CUDA build? (Never torch.cuda.is_available() here: it would initialise the driver in
        # a process that may fork DataLoader workers next; is_initialized() is a plain flag.)
        self.cuda_available = bool(getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None))
        if not self.cuda_available:
            p.set_hook("cuda_events", "off", "this torch has no CUDA: no GPU time per step")
            p.set_hook("syncs", "off", "this torch has no CUDA: no device syncs to count")
        else:
            p.set_hook("cuda_events", "off", "waiting for a monitor and for the job to use CUDA")
            if not hasattr(torch.cuda, "set_sync_debug_mode"):
                p.set_hook("syncs", "unavailable",
                           f"torch {torch.__version__} has no torch.cuda.set_sync_debug_mode (needs >= 1.10)")
            elif not (callable(getattr(warnings, "_showwarnmsg", None))
                      and callable(getattr(warnings, "_add_filter", None))):
                p.set_hook("syncs", "unavailable",
                           f"Python {sys.version.split()[0]}'s warnings module has no _showwarnmsg/"
                           "_add_filter: the probe cannot count syncs without risking the job's warnings")
            else:
                p.set_hook("syncs", "off", "waiting for a monitor and for the job to use CUDA")

    def uninstall(self) -> None:
        self.opt_on = self.dl_on = self.amp_on = self.compile_on = False
        self.scaler.on = False
        if getattr(self, "forward_steps", None) is not None:
            self.forward_steps.stop("the probe was removed")
        if getattr(self, "collectives", None) is not None:
            self.collectives.uninstall()
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

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()      # (the sync capture's lock)
        if getattr(self, "forward_steps", None) is not None:
            self.forward_steps.after_fork_in_child()

    def disable(self, name: str) -> None:
        if name == "optimizer_step":
            self.opt_on = False
        elif name == "dataloader":
            self.dl_on = False
        elif name == "autocast":
            self.amp_on = False
        elif name == "compile":
            self.compile_on = False
        elif name == "grad_scaler":
            self.scaler.on = False
        elif name == "forward_steps" and getattr(self, "forward_steps", None) is not None:
            self.forward_steps.stop("failed: switched off")
        elif name in ("collectives", "ddp_comm") and getattr(self, "collectives", None) is not None:
            self.collectives.disable(name)
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
            if is_compiling():   # first: nothing here may be traced into a compiled step (a guard
                return           # on a changing count would recompile it every step)
            hooks.optimizer_calls += 1     # (GradScaler's skipped steps: amp_scaler.py)
            if not hooks.opt_on:
                return
            try:
                p.on_optimizer_step(optimizer)
            except Exception as e:
                p.hook_failed("optimizer_step", e)

        handle = register(gputop_optimizer_step_hook)
        self._undo.append(handle.remove)
        self.opt_on = True
        p.set_hook("optimizer_step", "on", "steps from torch's global optimizer-step hook")

    def _install_grad_scaler(self) -> None:
        if not self.opt_on:
            self.probe.set_hook("grad_scaler", "unavailable", "needs the optimizer_step hook to see skipped steps")
            return
        self.scaler.install(self.torch)
        self.probe.set_hook("grad_scaler", "on", "GradScaler.step calls that did not step the optimizer")

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
                        dtype = str(getattr(ac, 'fast_dtype', '?')).replace('torch.', '')
                        key = f"{getattr(ac, 'device', '?')}:{dtype}"
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
                        hooks.compile_calls.append({"mode": kwargs.get("mode"),
                                                    "backend": str(kwargs.get("backend", "inductor")),
                                                    "fullgraph": bool(kwargs.get("fullgraph", False))})
                except Exception as e:
                    p.hook_failed("compile", e)
            return orig(*args, **kwargs)

        torch.compile = compile
        self._undo.append(lambda: setattr(torch, "compile", orig))
        self.compile_on = True
        p.set_hook("compile", "on", "notes torch.compile calls")

    @property
    def captures_open(self) -> int:
        """CUDA graph captures under way (begun, not ended, the graph still alive)."""
        return len(self.open_graphs)

    def _install_graph_capture(self) -> None:
        """Only where the job asked for kernel traces (gputop/probe/kernel_sample.py): note the CUDA
        graph captures the job makes itself (``torch.cuda.graph``, ``make_graphed_callables``, a
        library's), so that no trace starts or stops during one: stopping a trace synchronizes the
        device from the probe's thread, which a capture in torch's default ("global") mode does
        not survive. A capture is a rare call (warm-up, a new shape), never a step's hot path."""
        p, torch = self.probe, self.torch
        sampler = getattr(p, "kernel_sampler", None)
        if sampler is None or not sampler.on:
            return
        cls = torch.cuda.graphs.CUDAGraph
        begin, end = cls.capture_begin, cls.capture_end
        hooks = self

        def note(graph, on: bool) -> None:
            try:
                (hooks.open_graphs.add if on else hooks.open_graphs.discard)(graph)
            except TypeError:   # (an object that takes no weak reference: counted by time alone)
                pass
            hooks.last_capture_t = time.monotonic()

        @functools.wraps(begin)
        def capture_begin(graph, *args, **kwargs):
            note(graph, True)   # (before the call: a trace must not start while it may be under way)
            try:
                return begin(graph, *args, **kwargs)
            except BaseException:
                note(graph, False)
                raise

        @functools.wraps(end)
        def capture_end(graph, *args, **kwargs):
            try:
                return end(graph, *args, **kwargs)
            finally:
                note(graph, False)

        cls.capture_begin, cls.capture_end = capture_begin, capture_end
        self._undo.append(lambda: (setattr(cls, "capture_begin", begin), setattr(cls, "capture_end", end)))
        p.set_hook("graph_capture", "on", "notes CUDA graph captures: the kernel trace keeps clear of them")

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
            # where the optimizer's parameters live, by element count ("cpu": an optimizer step
            # on the CPU, an offload by hand or ZeRO-Offload, while the model runs on the GPU)
            devices: dict[str, int] = {}
            for q in params:
                kind = q.device.type
                devices[kind] = devices.get(kind, 0) + int(q.numel())
            self.optimizer = {
                "class": type(opt).__name__, "param_tensors": len(params),
                "params": int(sum(q.numel() for q in params)), "param_dtypes": dtypes,
                "param_devices": devices,
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
        if in_use:
            p.cuda_seen = True   # the training thread reads its device at its next step
        ready = in_use and self.bind_probe_thread()
        ev = p.hooks.get("cuda_events", ["off"])[0]
        if ev != "failed":
            # Events only once this thread can query them without creating a context.
            want = p.monitoring and ready
            if want and not p.cuda_events_on:
                p.cuda_events_on = True
                p.set_hook("cuda_events", "on", "CUDA events at step boundaries, read with query()")
            elif not want and p.cuda_events_on:
                p.cuda_events_on = False
            if not in_use:
                p.set_hook("cuda_events", "off", "the job has not used CUDA yet")
            elif not ready:
                p.set_hook("cuda_events", "off", self.device_why)
        sy = p.hooks.get("syncs", ["off"])[0]
        if sy in ("failed", "unavailable"):
            return
        want = p.monitoring and in_use
        try:
            if want != p.sync_capture:
                self.set_sync_capture(want)
            elif not in_use:
                p.set_hook("syncs", "off", "the job has not used CUDA yet")
            if p.sync_capture:
                self._check_sync_plumbing()
        except Exception as e:
            p.hook_failed("syncs", e)

    def bind_probe_thread(self) -> bool:
        """Make the job's device current on the calling (probe) thread, once per device. The
        current device is per thread: without this the probe thread's CUDA calls go to device 0,
        and a CUDA call on a device without a context creates one there (hundreds of MiB on a
        GPU the rank does not use). So: only the device the training thread reported, and only
        if it already has a context (then set_device creates nothing). False, with
        ``device_why``, when not (yet) possible."""
        dev = self.probe.cuda_device
        if dev is None:
            self.device_why = "waiting for the job's next step to learn its CUDA device"
            return False
        if getattr(self._probe_thread, "device", None) == dev:
            return True
        torch = self.torch
        try:
            has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
            if has_context is None:
                self.device_why = (f"torch {torch.__version__} cannot tell whether cuda:{dev} has a context: "
                                   "the probe makes no CUDA calls of its own")
                return False
            if not has_context(dev):
                self.device_why = (f"the job's current device cuda:{dev} has no CUDA context: the probe "
                                   "will not create one (call torch.cuda.set_device in the job)")
                return False
            torch.cuda.set_device(dev)
        except Exception as e:
            self.device_why = f"could not use cuda:{dev} on the probe thread: {type(e).__name__}: {e}"
            return False
        self._probe_thread.device = dev
        return True

    # -- memory and settings (probe thread) -------------------------------------------------------
    def memory(self) -> dict | None:
        if not self.cuda_in_use():
            return None
        dev = self.probe.cuda_device
        if dev is None or not self.bind_probe_thread():
            return None  # not known (yet), or no context there: never another GPU's numbers
        s = self.torch.cuda.memory_stats(dev)   # the allocator's own counters: no CUDA call
        return {"type": wire.MSG_MEMORY, "mono": _mono(), "device": dev,
                "allocated": s.get("allocated_bytes.all.current"), "reserved": s.get("reserved_bytes.all.current"),
                "peak_allocated": s.get("allocated_bytes.all.peak"), "peak_reserved": s.get("reserved_bytes.all.peak"),
                "alloc_retries": s.get("num_alloc_retries"), "ooms": s.get("num_ooms"),
                # cudaMalloc/cudaFree calls: a steady job makes none once its cache is built; a thrashing one
                # (retries, or torch.cuda.empty_cache() in the loop), some every step. torch 2.13 counts the calls
                # (cuMemMap/Unmap too, with expandable segments); before it, the segments created and freed
                # are the same count without expandable segments
                "device_allocs": _first_int(s, "num_device_alloc", "segment.all.allocated"),
                "device_frees": _first_int(s, "num_device_free", "segment.all.freed")}

    def config(self) -> dict:
        torch, env = self.torch, os.environ
        cfg: dict = {"torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
                     "cuda_build": self.cuda_available}
        cfg["cuda_initialized"] = self.cuda_in_use()
        cfg["cudnn"] = _safe(lambda: torch.backends.cudnn.version()) if cfg["cuda_initialized"] else None
        dev = self.probe.cuda_device if cfg["cuda_initialized"] else None
        cfg["device"] = cfg["device_name"] = cfg["capability"] = None
        if dev is not None and self.bind_probe_thread():   # else the cuda_events hook says why
            cfg["device"] = dev
            cfg["device_name"] = _safe(lambda: torch.cuda.get_device_name(dev))
            cap = _safe(lambda: torch.cuda.get_device_capability(dev))
            cfg["capability"] = f"{cap[0]}.{cap[1]}" if cap else None
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
            cfg["sync_debug_mode_job"] = _safe(lambda: torch.cuda.get_sync_debug_mode())
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


def _first_int(stats: dict, *keys: str) -> int | None:
    """The first of ``keys`` that ``stats`` holds as an int (torch's counters differ by version)."""
    for k in keys:
        v = stats.get(k)
        if type(v) is int:
            return v
    return None
