"""gputop's in-process probe: step timing, data wait, GPU time per step and implicit syncs,
measured inside the training process and served to ``gputop`` over a Unix socket.

Enable it in one of three ways:

* ``gputop run -- python train.py ...`` (also ``torchrun``): loads it through ``sitecustomize``;
* ``import gputop.probe; gputop.probe.install()`` near the top of the training script;
* custom loops without a torch optimizer: also call ``gputop.probe.step()`` once per step.

Then ``gputop --pid PID`` (or the ``gputop run`` UI) finds it by itself. docs/probe.md has the
details: what is measured, the wire format, the socket directory rules.

Promises: this package imports only the standard library (and torch, once the job imported it);
it never raises into the job (a failing hook is switched off and reported); it never makes the
training thread wait for the GPU or for a monitor; with no monitor attached it costs a clock
read and a counter per step. Importing it does nothing until ``install()``.
"""

from __future__ import annotations

import os
import sys
import threading

from gputop.probe import kernel_sample
from gputop.probe.core import Probe, say

__all__ = ["install", "step", "uninstall", "status"]

_PROBE: Probe | None = None
_LOCK = threading.Lock()
_REGISTRY_ATTR = "_gputop_probe"   # on the sys module: one probe per process, across module copies


def install(*, dormant: bool | None = None, origin: str = "install") -> Probe | None:
    """Load the probe into this process. Safe to call more than once (later calls return the
    same probe). Never raises: on a problem it prints one line to stderr and returns None or a
    probe that does not listen (``status()`` says why).

    ``dormant``: count steps but open no socket until this process steps an optimizer (or
    calls ``step()``). The default is dormant in multiprocessing children (DataLoader workers,
    ``mp.spawn`` ranks), so that only processes that train get a probe.
    """
    global _PROBE
    try:
        with _LOCK:
            if _PROBE is not None and _PROBE.pid == os.getpid():
                return _PROBE
            other = getattr(sys, _REGISTRY_ATTR, None)
            if other is not None and getattr(other, "pid", None) == os.getpid() and other is not _PROBE:
                say(f"another gputop probe is already installed in this process (from {other.install_file}); "
                    "not installing a second one")
                return None
            if dormant is None:
                dormant = _is_multiprocessing_child()
            kernel_sample.prepare_env()   # (before torch loads: kineto reads it)
            probe = Probe(dormant=dormant, origin=origin)
            _PROBE = probe
            setattr(sys, _REGISTRY_ATTR, probe)
            if not dormant:
                probe.start_server()
            _watch_torch(probe)
            return probe
    except Exception as e:  # the job comes first
        say(f"could not install: {type(e).__name__}: {e}")
        return None


def step() -> None:
    """Mark the end of one training step (for loops without a torch optimizer, or to override
    the optimizer hook). Once called, only these markers count steps. A no-op without a probe."""
    p = _PROBE
    if p is None:
        return
    try:
        p.on_marker_step()
    except Exception as e:
        p.hook_failed("marker", e)


def uninstall() -> None:
    """Remove every hook, close the socket and stop the probe thread (benchmarks and tests)."""
    global _PROBE
    with _LOCK:
        p = _PROBE
        if p is None:
            return
        _PROBE = None
        if getattr(sys, _REGISTRY_ATTR, None) is p:
            delattr(sys, _REGISTRY_ATTR)
        _unwatch_torch()
        if p.torch_hooks is not None:
            p.torch_hooks.uninstall()
        p.stop_server()


def status() -> dict:
    """What the probe in this process is doing (for the curious and for tests)."""
    p = _PROBE
    if p is None:
        return {"installed": False}
    return {"installed": True, "pid": p.pid, "dormant": p.dormant, "listening": p.listening,
            "socket": p.sock_path, "refused": p.refused, "torch": getattr(p.torch, "__version__", None),
            "steps": p.step_total, "batches": p.batch_total, "monitoring": p.monitoring,
            "hooks": {k: list(v) for k, v in dict(p.hooks).items()}}


def _is_multiprocessing_child() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv) or []
    if "--multiprocessing-fork" in argv or any("from multiprocessing" in a for a in argv):
        return True
    mp = sys.modules.get("multiprocessing")  # not imported: cannot be a multiprocessing child
    try:
        return mp is not None and mp.parent_process() is not None
    except Exception:
        return False


# -- torch: hook in now if the job already imported it, or right after it does ----------------
_WATCHER = None


def _on_torch(probe: Probe, torch) -> None:
    if probe.torch is not None or probe is not _PROBE:
        return
    try:
        from gputop.probe.torch_hooks import TorchHooks
        hooks = TorchHooks(probe, torch)
        probe.torch = torch
        probe.torch_hooks = hooks
        hooks.install()
    except Exception as e:
        say(f"could not hook into torch: {type(e).__name__}: {e}")


def _torch_ready():
    t = sys.modules.get("torch")
    if t is None:
        return None
    spec = getattr(t, "__spec__", None)
    if spec is not None and getattr(spec, "_initializing", False):
        return None  # being imported right now: the watcher will see it finish
    return t if hasattr(t, "optim") else None


def _watch_torch(probe: Probe) -> None:
    global _WATCHER
    t = _torch_ready()
    if t is not None:
        _on_torch(probe, t)
        return
    if _WATCHER is None:
        _WATCHER = _TorchImportWatcher()
        sys.meta_path.insert(0, _WATCHER)


def _unwatch_torch() -> None:
    global _WATCHER
    if _WATCHER is not None:
        try:
            sys.meta_path.remove(_WATCHER)
        except ValueError:
            pass
        _WATCHER = None


class _LoaderProxy:
    """Runs torch's own loader, then hooks the probe in once ``import torch`` has finished."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._inner.exec_module(module)
        finally:
            try:  # give torch back its own loader before anyone asks
                module.__loader__ = self._inner
                if module.__spec__ is not None:
                    module.__spec__.loader = self._inner
            except Exception:
                pass
        _unwatch_torch()
        p = _PROBE
        if p is not None:
            _on_torch(p, module)


class _TorchImportWatcher:
    """A meta-path finder that only notices ``import torch``; other finders do the finding."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        except Exception:
            return None
        finally:
            self._busy.on = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderProxy(spec.loader)
        return spec

    def invalidate_caches(self) -> None:
        pass


def _after_fork_in_child() -> None:
    p = _PROBE
    if p is not None:
        try:
            p.after_fork_in_child()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
