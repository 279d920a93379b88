"""The probe's hot path: step/data/GPU/sync accounting on the training thread.

The **hot path** (``boundary``, ``on_batch``, ``on_loader_iter``, ``count_sync``) runs on the
training thread inside torch hooks. It only reads a clock, updates a few counters and appends a
tuple to a bounded deque; with a monitor attached and CUDA in use it also records a CUDA event
on the current stream (never waits on it); once, it reads the thread's CUDA device; in a
dormant probe, the first step starts the probe thread (which then opens the socket). Every
caller wraps it so a failure switches that hook off (``hook_failed``) instead of raising into
the training loop.

The **probe thread** that reads these counters and serves them to monitors is
gputop/probe/server.py (``ProbeServer``, a mixin of ``Probe``) with gputop/probe/window.py
(one window's message). The names other modules import from here stay here.

Imports: the standard library only (torch is handed in by torch_hooks once the job imports it).
"""

from __future__ import annotations

import os
import weakref
from collections import deque

from gputop.probe.server import (CONFIG_EVERY_S, IDLE_POLL_S, MAX_MONITORS, MAX_OUTBOX_BYTES,  # noqa: F401
                                 MEMORY_EVERY_S, SYNC_TOP_EVERY_S, WINDOW_S, ProbeServer, _clean_stale_sockets,
                                 _Monitor, _peer_cred)
from gputop.probe.kernel_sample import KernelSampler
from gputop.probe.util import _env_int, _mono, say  # noqa: F401 (torch_hooks and __init__ import them from here)
from gputop.probe.window import MAX_FREE_EVENTS, _WindowState, _why_off  # noqa: F401

STEP_BUFFER = 8192          # per-step records kept between windows (drop oldest)
MAX_PENDING_EVENTS = 512    # CUDA events recorded but not yet read; beyond this, skip timing
MAX_SYNC_LINES = 256        # distinct source lines tracked for implicit syncs
LEAD_OPTIMIZER_QUIET_S = 2.0

SYNC_MESSAGE = "called a synchronizing CUDA operation"


class Probe(ProbeServer):
    """One per process. Created by ``gputop.probe.install()``; see that function."""

    def __init__(self, *, dormant: bool, origin: str) -> None:
        self.origin = origin               # "install" (the script called it) or "launch" (gputop run)
        self.install_file = os.path.abspath(__file__)
        self._reset_process_state(dormant)
        self.torch = None                  # the torch module, once the job has imported it
        self.torch_hooks = None            # gputop.probe.torch_hooks.TorchHooks
        self.flops = None                  # gputop.probe.flops.FlopCounter (one counted step)
        self.kernel_sampler = KernelSampler(self)   # a kernel trace now and then, if the job asks
        self.hooks: dict[str, list[str]] = {}   # name -> [state, message]
        self._hooks_version = 0
        self.config_dirty = False          # a hook saw a new setting: send the config this window
        self.notes: deque[str] = deque(maxlen=32)
        self.thread_cpu_s = 0.0            # CPU time of the probe thread so far (its own cost)

    # -- per-process state (reset in a forked child) ---------------------------------------
    def _reset_process_state(self, dormant: bool) -> None:
        self.pid = os.getpid()
        self.installed_mono = _mono()
        self.dormant = dormant             # hooks count, but no socket until the first step
        self._reset_server_state()
        # hot-path counters (training thread writes, probe thread reads)
        self.step_total = 0
        self.batch_total = 0
        self.sample_total = 0
        self.unsized_total = 0
        self.wait_total = 0.0
        self.sync_total = 0
        self.last_boundary: float | None = None
        self.wait_in_step = 0.0
        self.batches_in_step = 0
        self.samples_in_step = 0
        self.sync_at_step = 0
        self.records: deque[tuple] = deque(maxlen=STEP_BUFFER)
        self.marker_mode = False
        self.step_source: str | None = None
        self.lead_optimizer: int | None = None
        self.lead_last = 0.0
        self.other_optimizer_steps = 0
        self.monitoring = False            # at least one monitor attached
        # CUDA events (recorded by the training thread only while monitoring and CUDA is in use)
        self.cuda_events_on = False
        # The job's CUDA device, learned on the training thread (the current device is per
        # thread: the probe thread's own would be device 0). cuda_seen: the probe thread saw the
        # job initialise CUDA, so the next step boundary reads the training thread's device.
        self.cuda_seen = False
        self.cuda_device: int | None = None
        self.ev_free: deque = deque()
        self.ev_pending: deque = deque()   # (step index, start event or None, end event)
        self.prev_end_ev = None
        self.step_start_ev = None
        self.ev_skipped = 0
        # implicit syncs
        self.sync_capture = False
        self.sync_capture_since: float | None = None   # when counting last turned on
        self.sync_lines: dict[str, int] = {}
        self._last_it_ref = None
        self._last_it_samples = None

    # -- hooks bookkeeping ------------------------------------------------------------------
    def set_hook(self, name: str, state: str, message: str = "") -> None:
        """state: on | off (not in use now, with why) | unavailable (this torch lacks it) | failed."""
        if self.hooks.get(name) != [state, message]:
            self.hooks[name] = [state, message]
            self._hooks_version += 1

    def hook_failed(self, name: str, exc: BaseException) -> None:
        """A hook raised: switch it off for good, tell the monitors, never raise into the job."""
        try:
            if self.torch_hooks is not None:
                self.torch_hooks.disable(name)
            if name == "cuda_events":
                self.cuda_events_on = False
            msg = f"{type(exc).__name__}: {exc}"[:300]
            self.set_hook(name, "failed", f"{msg} (hook switched off; the job is unaffected)")
            self._note(f"hook {name} failed and was switched off: {msg}")
        except Exception:
            pass

    def _note(self, text: str) -> None:
        """Queue a note for the monitors; the probe thread sends it (any thread may call this)."""
        self.notes.append(text)

    # -- hot path: steps ----------------------------------------------------------------------
    def on_optimizer_step(self, optimizer) -> None:
        """torch's global optimizer-step post hook. With several optimizers (a GAN, a separate
        optimizer for embeddings) one of them, the *lead*, marks step boundaries: the first that
        stepped, replaced only when it has been quiet for LEAD_OPTIMIZER_QUIET_S."""
        if self.marker_mode:
            return
        now = _mono()
        oid = id(optimizer)
        if oid != self.lead_optimizer:
            if self.lead_optimizer is not None and now - self.lead_last < LEAD_OPTIMIZER_QUIET_S:
                self.other_optimizer_steps += 1
                return
            self.lead_optimizer = oid
            if self.torch_hooks is not None:
                self.torch_hooks.note_optimizer(optimizer)
        self.lead_last = now
        self.step_source = "optimizer"
        self.boundary(now)

    def on_marker_step(self) -> None:
        """``gputop.probe.step()``: once called, markers alone mark steps (no double counting)."""
        self.marker_mode = True
        self.step_source = "marker"
        self.boundary(_mono())

    def on_forward_step(self, now: float) -> None:
        """A call of the model in a job that steps no optimizer (forward_steps.py); an optimizer
        step or a marker, once seen, marks the steps instead."""
        if self.marker_mode or self.step_source == "optimizer":
            return
        if self.step_source != "forward":
            self.step_source = "forward"
            self.config_dirty = True
        self.boundary(now)

    def boundary(self, now: float) -> None:
        last = self.last_boundary
        self.last_boundary = now
        n = self.step_total = self.step_total + 1
        syncs = self.sync_total
        self.records.append((n, now, None if last is None else now - last, self.wait_in_step,
                             self.batches_in_step, self.samples_in_step, syncs - self.sync_at_step))
        self.sync_at_step = syncs
        self.wait_in_step = 0.0
        self.batches_in_step = 0
        self.samples_in_step = 0
        fc = self.flops
        if fc is not None and fc.wants_boundary(self.monitoring):
            try:
                fc.at_boundary(n, now)
            except Exception as e:
                fc.stop()
                self.hook_failed("flops", e)
        if self.cuda_events_on:
            self._record_boundary_event(n)
        elif self.cuda_device is None and self.cuda_seen:
            self._learn_cuda_device()
        if self.dormant:
            self._wake()

    # -- hot path: data loading ---------------------------------------------------------------
    def on_loader_iter(self, seconds: float) -> None:
        """``iter(DataLoader)``: starting workers (or resetting persistent ones) blocks the loop
        too, so it counts as data wait."""
        self.wait_in_step += seconds
        self.wait_total += seconds

    def on_batch(self, it, t0: float, t1: float, batch) -> None:
        wait = t1 - t0
        self.wait_in_step += wait
        self.wait_total += wait
        self.batches_in_step += 1
        self.batch_total += 1
        ref = self._last_it_ref
        if ref is None or ref() is not it:
            # A new iterator (a new epoch, or another DataLoader): note its settings once.
            self._last_it_ref = weakref.ref(it)
            self._last_it_samples = self.torch_hooks.loader_seen(it)
        fc = self.flops
        if fc is not None and fc.watch_shapes:
            fc.note_batch(batch)
        n = _batch_len(batch)
        if n is None:
            n = self._last_it_samples
        if n is not None:
            self.samples_in_step += n
            self.sample_total += n
        else:
            self.unsized_total += 1   # no tensor and no batch_size: samples/s unknown, not zero
        if self.cuda_events_on and self.step_start_ev is None:
            self._record_data_event()
        if self.dormant:
            self._wake()

    # -- hot path: CUDA events ----------------------------------------------------------------
    def _learn_cuda_device(self) -> None:
        """Once, on the training thread, after the probe thread saw CUDA initialised: the device
        this thread works on (current_device() is per thread; CUDA is already initialised, so
        this creates nothing)."""
        try:
            self.cuda_device = int(self.torch.cuda.current_device())
        except Exception as e:
            self.cuda_seen = False   # do not retry every step
            self._note(f"could not read the job's CUDA device: {type(e).__name__}: {e}")

    def _take_event(self):
        try:
            return self.ev_free.pop()
        except IndexError:
            return self.torch.cuda.Event(enable_timing=True)

    def _record_boundary_event(self, n: int) -> None:
        try:
            cuda = self.torch.cuda
            if cuda.is_current_stream_capturing():  # an event in a graph capture would break it
                self.prev_end_ev = self.step_start_ev = None
                return
            if len(self.ev_pending) >= MAX_PENDING_EVENTS:
                self.ev_skipped += 1
                self.prev_end_ev = self.step_start_ev = None
                return
            stream = cuda.current_stream()
            ev = self._take_event()
            ev.record(stream)
            self.cuda_device = stream.device_index
            start = self.step_start_ev if self.step_start_ev is not None else self.prev_end_ev
            self.step_start_ev = None
            self.ev_pending.append((n, start, ev))
            self.prev_end_ev = ev
        except Exception as e:
            self.hook_failed("cuda_events", e)

    def _record_data_event(self) -> None:
        try:
            cuda = self.torch.cuda
            if cuda.is_current_stream_capturing() or len(self.ev_pending) >= MAX_PENDING_EVENTS:
                return
            ev = self._take_event()
            ev.record(cuda.current_stream())
            self.step_start_ev = ev
        except Exception as e:
            self.hook_failed("cuda_events", e)

    # -- hot path: implicit syncs (called from warnings.showwarning) ----------------------------
    def count_sync(self, filename: str, lineno: int, frame) -> None:
        self.sync_total += 1
        skip = self.torch_hooks.skip_prefixes if self.torch_hooks is not None else ()
        if skip and filename.startswith(skip):
            # The sync happened inside torch's own Python code (clip_grad_norm_, a loss's
            # .item()...): blame the first caller outside torch, which is what the user can change.
            f = frame
            while f is not None and f.f_code.co_filename.startswith(skip):
                f = f.f_back
            if f is not None:
                filename, lineno = f.f_code.co_filename, f.f_lineno
        key = f"{filename}:{lineno}"
        lines = self.sync_lines
        if key in lines or len(lines) < MAX_SYNC_LINES:
            lines[key] = lines.get(key, 0) + 1
        else:
            lines["(other lines)"] = lines.get("(other lines)", 0) + 1


def _batch_len(batch) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor (or None if not obvious)."""
    x = batch
    for _ in range(3):
        shape = getattr(x, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else None
        if isinstance(x, (list, tuple)) and x:
            x = x[0]
        elif isinstance(x, dict) and x:
            x = next(iter(x.values()))
        else:
            return None
    return None
