"""The probe proper: step/data/GPU/sync accounting in the training process, and its socket server.

Two kinds of code live here and must not be confused:

* **Hot path** (``boundary``, ``on_batch``, ``on_loader_iter``, ``count_sync``): runs on the
  training thread inside torch hooks. It only reads a clock, updates a few counters and appends
  a tuple to a bounded deque; with a monitor attached and CUDA in use it also records a CUDA
  event on the current stream (never waits on it); once, it reads the thread's CUDA device; in a
  dormant probe, the first step starts the probe thread (which then opens the socket). Every caller wraps it so a failure switches
  that hook off (``hook_failed``) instead of raising into the training loop.
* **Probe thread** (``_serve``): a daemon thread that owns the socket, accepts monitors, and every
  ``WINDOW_S`` drains the step records into one window message, reads finished CUDA events with
  ``query()`` (non-blocking), reads allocator memory and config, and sends to each monitor with
  non-blocking writes into bounded per-monitor queues (oldest messages dropped first). With no
  monitor attached it sleeps in ``select`` on the listening socket and costs nothing.

Imports: the standard library only (torch is handed in by torch_hooks once the job imports it).
"""

from __future__ import annotations

import atexit
import os
import selectors
import socket
import struct
import sys
import threading
import time
import weakref
from collections import deque

from gputop.probe import wire

_mono = time.monotonic

WINDOW_S = 1.0              # aggregation window while a monitor is attached (recording size)
IDLE_POLL_S = 1.0           # select timeout with no monitor: the thread mostly sleeps
STEP_BUFFER = 8192          # per-step records kept between windows (drop oldest)
MAX_PENDING_EVENTS = 512    # CUDA events recorded but not yet read; beyond this, skip timing
MAX_FREE_EVENTS = 256
MAX_SYNC_LINES = 256        # distinct source lines tracked for implicit syncs
MAX_OUTBOX_BYTES = 1 << 20  # per monitor; oldest messages are dropped beyond this
MAX_MONITORS = 8
MEMORY_EVERY_S = 1.0
CONFIG_EVERY_S = 2.0
SYNC_TOP_EVERY_S = 2.0
LEAD_OPTIMIZER_QUIET_S = 2.0

SYNC_MESSAGE = "called a synchronizing CUDA operation"


def say(line: str) -> None:
    """One line on the job's stderr, for faults the user must know about (never a traceback)."""
    try:
        sys.stderr.write(f"gputop probe [pid {os.getpid()}]: {line}\n")
        sys.stderr.flush()
    except Exception:
        pass


class _Monitor:
    """One attached monitor: its socket and a bounded queue of encoded messages."""

    __slots__ = ("sock", "outbox", "out_bytes", "dropped", "partial", "peer")

    def __init__(self, sock: socket.socket, peer: tuple[int, int, int] | None) -> None:
        self.sock = sock
        self.outbox: deque[bytes] = deque()
        self.out_bytes = 0
        self.dropped = 0
        self.partial = b""
        self.peer = peer

    def queue(self, data: bytes) -> None:
        self.outbox.append(data)
        self.out_bytes += len(data)
        while self.out_bytes > MAX_OUTBOX_BYTES and len(self.outbox) > 1:
            old = self.outbox.popleft()
            self.out_bytes -= len(old)
            self.dropped += 1

    def flush(self) -> bool:
        """Send what the socket takes without blocking. False when the monitor is gone."""
        flags = getattr(socket, "MSG_NOSIGNAL", 0)  # a vanished monitor must never SIGPIPE the job
        while self.partial or self.outbox:
            if not self.partial:
                self.partial = self.outbox.popleft()
                self.out_bytes -= len(self.partial)
            try:
                n = self.sock.send(self.partial, flags)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            self.partial = self.partial[n:]
        return True


class Probe:
    """One per process. Created by ``gputop.probe.install()``; see that function."""

    def __init__(self, *, dormant: bool, origin: str) -> None:
        self.origin = origin               # "install" (the script called it) or "launch" (gputop run)
        self.install_file = os.path.abspath(__file__)
        self._reset_process_state(dormant)
        self.torch = None                  # the torch module, once the job has imported it
        self.torch_hooks = None            # gputop.probe.torch_hooks.TorchHooks
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
        self.listening = False
        self.refused: str | None = None    # why this process has no socket
        self.sock_path: str | None = None
        self._listener: socket.socket | None = None
        self._monitors: list[_Monitor] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
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

    # -- activation -------------------------------------------------------------------------
    def _wake(self) -> None:
        """First training activity in a dormant process (a rank, not a DataLoader worker). Runs
        on the training thread, so it only starts the probe thread: that thread opens the socket
        (a connect with a timeout, a directory scan, a line on stderr if refused)."""
        self.dormant = False
        try:
            if self.torch_hooks is not None and self.torch_hooks.in_dataloader_worker():
                self.refused = "a DataLoader worker: no probe of its own"
                return
            self._start_thread(open_socket=True)
        except Exception as e:
            self.refused = f"could not start: {type(e).__name__}: {e}"

    def start_server(self) -> bool:
        """Open the socket on the calling thread, then start the probe thread; False (with
        ``refused`` set) if the socket cannot be opened. For ``install()`` at start-up; a dormant
        probe that wakes in the training loop uses ``_start_thread(open_socket=True)`` instead."""
        if self._thread is not None:
            return True
        if not self._open_socket():
            return False
        self._start_thread(open_socket=False)
        return True

    def _start_thread(self, *, open_socket: bool) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, args=(open_socket,), name="gputop-probe", daemon=True)
        self._thread.start()

    def _run(self, open_socket: bool) -> None:
        """The probe thread: open the socket if the caller did not, then serve until stopped."""
        try:
            if open_socket and not self._open_socket():
                return   # refused says why (and one line went to stderr)
            self._wake_r, self._wake_w = socket.socketpair()
            if self._stop.is_set():
                return
        except Exception as e:
            self.refused = f"could not start: {type(e).__name__}: {e}"
            say(self.refused)
            return
        self._serve()

    def _open_socket(self) -> bool:
        directory = wire.probe_dir()
        reason = wire.ensure_dir(directory)
        if reason is None:
            path = wire.socket_path(directory, self.pid)
            if len(path.encode()) > wire.MAX_SOCKET_PATH:
                reason = f"socket path {path} is longer than {wire.MAX_SOCKET_PATH} bytes: set {wire.ENV_DIR} to a shorter directory"
        if reason is not None:
            self.refused = f"not listening: {reason}"
            say(self.refused)
            return False
        if os.path.lexists(path):
            bad = wire.check_socket_file(path)
            if bad is not None:
                self.refused = f"not listening: {bad}; remove it"
                say(self.refused)
                return False
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(path)
                live = True
            except OSError:
                live = False  # refused: left behind by a dead process with our PID
            finally:
                probe.close()
            if live:
                self.refused = f"not listening: another gputop probe already listens on {path} in this process"
                say(self.refused)
                return False
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(MAX_MONITORS)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            self.refused = f"not listening: cannot bind {path}: {e.strerror or e}"
            say(self.refused)
            return False
        self._listener = sock
        self.sock_path = path
        self.listening = True
        self.refused = None
        _clean_stale_sockets(directory, self.pid)
        atexit.register(self._at_exit, self.pid, path)
        return True

    def _at_exit(self, pid: int, path: str) -> None:
        if os.getpid() != pid:
            return  # a forked child running atexit must not remove its parent's socket
        self.stop_server()

    def stop_server(self) -> None:
        self._stop.set()
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        self._thread = None
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
            self._listener = None
        if self.sock_path and os.getpid() == self.pid:
            try:
                os.unlink(self.sock_path)
            except OSError:
                pass
        self.sock_path = None
        self.listening = False
        for m in self._monitors:
            try:
                m.sock.close()
            except OSError:
                pass
        self._monitors = []
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._wake_r = self._wake_w = None
        self._set_monitoring(False)

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker, most often) inherits our state but not our
        thread. Close its copies of the sockets (the parent keeps its own; the file stays) and
        go dormant: the child opens a probe of its own only if it starts stepping an optimizer."""
        for s in [self._listener, self._wake_r, self._wake_w, *[m.sock for m in self._monitors]]:
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        self._reset_process_state(dormant=True)
        if self.torch_hooks is not None:
            self.torch_hooks.after_fork_in_child()

    # -- probe thread ---------------------------------------------------------------------------
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._listener, selectors.EVENT_READ, "listen")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            window_t0 = _mono()
            next_tick = window_t0 + WINDOW_S
            self._win_state = _WindowState(self)
            while not self._stop.is_set():
                now = _mono()
                if self._monitors:
                    timeout = max(0.0, next_tick - now)
                    if any(m.partial or m.outbox for m in self._monitors):
                        timeout = min(timeout, 0.05)
                else:
                    timeout = IDLE_POLL_S
                for key, _ in sel.select(timeout):
                    if key.data == "listen":
                        self._accept(sel)
                    elif key.data == "wake":
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    else:
                        self._read_monitor(sel, key.data)
                now = _mono()
                if self._monitors and now >= next_tick:
                    try:
                        self._tick(now)
                    except Exception as e:  # never let the thread die silently
                        self._broadcast({"type": wire.MSG_NOTE, "text": f"probe tick failed: {type(e).__name__}: {e}"})
                    next_tick = now + WINDOW_S
                elif not self._monitors:
                    next_tick = now + WINDOW_S
                for m in list(self._monitors):
                    if (m.partial or m.outbox) and not m.flush():
                        self._drop_monitor(sel, m)
                self.thread_cpu_s = time.thread_time()
        except Exception as e:
            self.refused = f"probe thread stopped: {type(e).__name__}: {e}"
            say(self.refused)
        finally:
            try:
                sel.close()
            except Exception:
                pass

    def _accept(self, sel) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        peer = _peer_cred(conn)
        if peer is not None and peer[1] not in (os.getuid(), 0):
            conn.close()  # only our own user or root may read the job's numbers
            return
        if len(self._monitors) >= MAX_MONITORS:
            conn.close()
            return
        conn.setblocking(False)
        m = _Monitor(conn, peer)
        first = not self._monitors
        self._monitors.append(m)
        sel.register(conn, selectors.EVENT_READ, m)
        if first:
            self._set_monitoring(True)
        m.queue(wire.encode(self._hello()))
        ws = self._win_state
        m.queue(wire.encode(ws.config_msg(force=True)))
        if ws.last_syncs is not None:
            m.queue(wire.encode(ws.last_syncs))
        m.flush()

    def _read_monitor(self, sel, m: _Monitor) -> None:
        try:
            data = m.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the monitor went away (closed, or killed)
            self._drop_monitor(sel, m)
        # Whatever a monitor sends is read and ignored: there is nothing it can ask for.

    def _drop_monitor(self, sel, m: _Monitor) -> None:
        try:
            sel.unregister(m.sock)
        except Exception:
            pass
        try:
            m.sock.close()
        except OSError:
            pass
        self._monitors = [x for x in self._monitors if x is not m]
        if not self._monitors:
            self._set_monitoring(False)

    def _set_monitoring(self, on: bool) -> None:
        if on == self.monitoring:
            return
        self.monitoring = on
        if on:
            # Start a fresh window: what happened before any monitor came is summarised only by
            # the cumulative totals, not replayed as one giant window.
            self.records.clear()
            self._win_state.restart()
        else:
            self.cuda_events_on = False
            self.ev_pending.clear()
            self.ev_free.clear()
            self.prev_end_ev = self.step_start_ev = None
            if self.torch_hooks is not None:
                try:
                    self.torch_hooks.set_sync_capture(False)
                except Exception as e:
                    self.hook_failed("syncs", e)

    def _broadcast(self, msg: dict) -> None:
        if not self._monitors:
            return
        msg.setdefault("mono", _mono())
        data = wire.encode(msg)
        for m in self._monitors:
            m.queue(data)

    def _hello(self) -> dict:
        env = os.environ
        return {
            "type": wire.MSG_HELLO, "v": wire.WIRE_VERSION, "mono": _mono(), "wall": time.time(),
            "pid": self.pid, "ppid": os.getppid(), "argv": list(getattr(sys, "orig_argv", sys.argv))[:64],
            "python": sys.version.split()[0], "origin": self.origin, "installed_mono": self.installed_mono,
            "rank": _env_int(env, "RANK"), "local_rank": _env_int(env, "LOCAL_RANK"),
            "world_size": _env_int(env, "WORLD_SIZE"),
            "torch": getattr(self.torch, "__version__", None),
            "window_s": WINDOW_S,
        }

    def _tick(self, now: float) -> None:
        ws = self._win_state
        th = self.torch_hooks
        if th is not None:
            try:
                th.manage(self)   # CUDA events and sync capture on/off as CUDA comes into use
            except Exception as e:
                self._note(f"probe could not update its hooks: {type(e).__name__}: {e}")
            # The window ends after that, so that sync counting turned on just now covers all
            # of the next window (a window counts syncs only if counting covered it from t0).
            now = _mono()
        while self.notes:
            self._broadcast({"type": wire.MSG_NOTE, "text": self.notes.popleft()})
        self._broadcast(ws.window_msg(now))
        if now - ws.memory_at >= MEMORY_EVERY_S:
            ws.memory_at = now
            mem = th.memory() if th is not None else None
            if mem is not None:
                self._broadcast(mem)
        if now - ws.config_at >= CONFIG_EVERY_S or self._hooks_version != ws.hooks_version or self.config_dirty:
            self.config_dirty = False
            msg = ws.config_msg(force=False)
            if msg is not None:
                self._broadcast(msg)
        if self.sync_lines and now - ws.syncs_at >= SYNC_TOP_EVERY_S:
            ws.syncs_at = now
            msg = ws.syncs_msg()
            if msg is not None:
                self._broadcast(msg)


class _WindowState:
    """What the probe thread carries from one window to the next."""

    def __init__(self, probe: Probe) -> None:
        self.p = probe
        self.restart()
        self.memory_at = 0.0
        self.config_at = 0.0
        self.syncs_at = 0.0
        self.config_sent: dict | None = None
        self.hooks_version = -1
        self.last_syncs: dict | None = None

    def restart(self) -> None:
        p = self.p
        self.t0 = _mono()
        self.batch_total = p.batch_total
        self.sample_total = p.sample_total
        self.unsized_total = p.unsized_total
        self.wait_total = p.wait_total
        self.sync_total = p.sync_total
        self.last_step = p.step_total
        self.sync_lines_prev = dict(p.sync_lines)
        self.rd_prev_end = None

    def window_msg(self, now: float) -> dict:
        p = self.p
        recs = []
        pop = p.records.popleft
        while True:
            try:
                recs.append(pop())
            except IndexError:
                break
        dropped = 0
        if recs:
            # Records are numbered: a gap means the bounded buffer dropped the oldest.
            dropped = max(0, recs[0][0] - self.last_step - 1)
            self.last_step = recs[-1][0]
        timed = [r for r in recs if r[2] is not None]
        durs = sorted(r[2] for r in timed)
        hist: dict[str, int] = {}
        for d in durs:
            b = str(wire.hist_bucket(d))
            hist[b] = hist.get(b, 0) + 1
        gpu = self._read_gpu() if p.torch_hooks is not None else []
        # Syncs count only for a window that sync counting covered from its start: a window in
        # which counting began (or stopped and began again) would report too few, so it gets None.
        since = p.sync_capture_since
        syncs_counted = p.sync_capture and since is not None and since <= self.t0
        if syncs_counted:
            sync_off = None
        elif p.sync_capture:
            sync_off = "sync counting was off for part of this window"
        else:
            sync_off = _why_off(p, "syncs")
        batch_total, sample_total, wait_total, sync_total = p.batch_total, p.sample_total, p.wait_total, p.sync_total
        unsized_total = p.unsized_total
        msg = {
            "type": wire.MSG_WINDOW, "mono": now, "t0": self.t0, "t1": now,
            "steps": len(recs), "step_total": p.step_total, "dropped": dropped,
            "step_source": p.step_source,
            "step_n": len(durs), "step_sum": sum(durs) if durs else None,
            "step_min": durs[0] if durs else None, "step_max": durs[-1] if durs else None,
            "step_p50": durs[len(durs) // 2] if durs else None, "step_hist": hist,
            "step_wait": sum(r[3] for r in timed) if timed else None,
            "step_batches": sum(r[4] for r in recs), "step_samples": sum(r[5] for r in recs),
            # (and only if counting also covered the first step, which began before the window)
            "step_syncs": sum(r[6] for r in timed) if (timed and syncs_counted and timed[0][1] - timed[0][2] >= since)
            else None,
            "batches": batch_total - self.batch_total, "batch_total": batch_total,
            "samples": sample_total - self.sample_total, "sample_total": sample_total,
            "unsized": unsized_total - self.unsized_total,
            "wait": wait_total - self.wait_total,
            "gpu_n": len(gpu), "gpu_sum": sum(gpu) if gpu else None, "gpu_max": max(gpu) if gpu else None,
            "gpu_off": None if p.cuda_events_on else _why_off(p, "cuda_events"),
            "gpu_skipped": p.ev_skipped,
            "syncs": (sync_total - self.sync_total) if syncs_counted else None, "sync_total": sync_total,
            "sync_off": sync_off,
            "sync_top": self._sync_top_delta(),
            "other_optimizer_steps": p.other_optimizer_steps,
            "monitors": len(p._monitors), "dropped_msgs": sum(m.dropped for m in p._monitors),
            "probe_cpu_s": p.thread_cpu_s,
        }
        self.t0 = now
        self.unsized_total = unsized_total
        self.batch_total, self.sample_total, self.wait_total, self.sync_total = (
            batch_total, sample_total, wait_total, sync_total)
        return msg

    def _read_gpu(self) -> list[float]:
        """GPU span of each finished step, read with query() only: never waits for the GPU."""
        p = self.p
        out: list[float] = []
        pending = p.ev_pending
        while pending:
            n, start, end = pending[0]
            try:
                if not end.query():
                    break
                secs = None
                if start is not None and start.query():
                    secs = start.elapsed_time(end) / 1000.0
            except Exception:
                secs = None  # e.g. events on two devices: no span for this step
            pending.popleft()
            if secs is not None and secs >= 0:
                out.append(secs)
            prev = self.rd_prev_end
            if start is not None and start is not prev:
                self._free(start)   # a data event, used once
            if prev is not None:
                self._free(prev)    # the previous boundary: no later step can start at it now
            self.rd_prev_end = end
        return out

    def _free(self, ev) -> None:
        if len(self.p.ev_free) < MAX_FREE_EVENTS and self.p.cuda_events_on:
            self.p.ev_free.append(ev)

    def _sync_top_delta(self) -> list:
        p = self.p
        if not p.sync_lines:
            return []
        cur = dict(p.sync_lines)
        prev = self.sync_lines_prev
        delta = [(k, v - prev.get(k, 0)) for k, v in cur.items() if v > prev.get(k, 0)]
        self.sync_lines_prev = cur
        delta.sort(key=lambda kv: -kv[1])
        return [[k, v] for k, v in delta[:3]]

    def syncs_msg(self) -> dict | None:
        top = sorted(dict(self.p.sync_lines).items(), key=lambda kv: -kv[1])[:10]
        msg = {"type": wire.MSG_SYNCS, "lines": [[k, v] for k, v in top], "total": self.p.sync_total}
        if self.last_syncs is not None and self.last_syncs["lines"] == msg["lines"]:
            return None
        self.last_syncs = msg
        return msg

    def config_msg(self, force: bool) -> dict | None:
        p = self.p
        self.config_at = _mono()
        self.hooks_version = p._hooks_version
        cfg = p.torch_hooks.config() if p.torch_hooks is not None else {
            "torch": None, "torch_info": "torch is not imported in this process (yet): steps only from gputop.probe.step() markers; no data, sync or GPU timing"}
        # dict(...) copies in one C call: the training thread may add an entry meanwhile.
        cfg["hooks"] = {k: list(v) for k, v in dict(p.hooks).items()}
        cfg["step_source"] = p.step_source
        if not force and cfg == self.config_sent:
            return None
        self.config_sent = cfg
        return {"type": wire.MSG_CONFIG, "mono": _mono(), "config": cfg}


def _why_off(p: Probe, hook: str) -> str:
    h = p.hooks.get(hook)
    if h is not None and h[1]:
        return h[1]
    if p.torch is None:
        return "torch is not imported"
    return "off"


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


def _env_int(env, name: str) -> int | None:
    v = env.get(name)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _peer_cred(conn: socket.socket) -> tuple[int, int, int] | None:
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
        return struct.unpack("3i", raw)
    except OSError:
        return None


def _clean_stale_sockets(directory: str, own_pid: int) -> None:
    """Remove sockets left by probes whose process is gone (killed with -9, crashed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = wire.pid_of_socket_name(name)
        if pid is None or pid == own_pid:
            continue
        try:
            os.kill(pid, 0)
            continue  # alive (or not ours to judge)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        path = os.path.join(directory, name)
        if wire.check_socket_file(path, os.getuid()) is None:
            try:
                os.unlink(path)
            except OSError:
                pass
