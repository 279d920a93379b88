"""The probe's socket server: the probe thread that owns the Unix socket, accepts monitors,
and every ``WINDOW_S`` sends each monitor the window, memory, config and sync messages.

A daemon thread (``_serve``): it drains the step records into one window message
(gputop/probe/window.py), reads allocator memory and config, and sends to each monitor with
non-blocking writes into bounded per-monitor queues (oldest messages dropped first). With no
monitor attached it sleeps in ``select`` on the listening socket and costs nothing.

``ProbeServer`` is a mixin of ``gputop.probe.core.Probe``: the hot path (core.py) and the
server share one object, so the training thread's counters are plain attributes the probe
thread reads.

What a client can cost the job is bounded (issue 13): a monitor sends nothing the probe needs,
so a client that sends more than ``MAX_CLIENT_INPUT`` bytes is dropped (a flood costs one
small read); accepts are rate-limited (``ACCEPTS_PER_S``), so a reconnect loop cannot keep the
probe thread busy; and with ``MAX_MONITORS`` attached, a new client evicts one that has not read
what it was sent (an idle client), so idle clients cannot lock a real monitor out. A socket
directory that cannot be used safely (another user's, a symlink, open to others) is replaced by
a private fallback directory (``wire.fallback_dir``), with one line on stderr.

Imports: the standard library only.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque

from gputop.probe import wire
from gputop.probe.util import _env_int, _mono, say
from gputop.probe.window import _WindowState

WINDOW_S = 1.0              # aggregation window while a monitor is attached (recording size)
IDLE_POLL_S = 1.0           # select timeout with no monitor: the thread mostly sleeps
MAX_OUTBOX_BYTES = 1 << 20  # per monitor; oldest messages are dropped beyond this
MAX_MONITORS = 8
MAX_CLIENT_INPUT = 4096     # bytes a client may send in all; a monitor sends none
ACCEPTS_PER_S = 10.0        # sustained rate of new connections served (burst ACCEPT_BURST)
ACCEPT_BURST = 20.0
EVICT_UNREAD_AFTER_S = 1.0  # full, a client this old that left what it was sent unread may be evicted
SIOCOUTQ = 0x5411           # Linux: bytes in a socket's send queue not yet read by the peer
MEMORY_EVERY_S = 1.0
CONFIG_EVERY_S = 2.0
SYNC_TOP_EVERY_S = 2.0


class _Monitor:
    """One attached monitor: its socket and a bounded queue of encoded messages."""

    __slots__ = ("sock", "outbox", "out_bytes", "dropped", "partial", "peer", "received", "since")

    def __init__(self, sock: socket.socket, peer: tuple[int, int, int] | None) -> None:
        self.sock = sock
        self.outbox: deque[bytes] = deque()
        self.out_bytes = 0
        self.dropped = 0
        self.partial = b""
        self.peer = peer
        self.received = 0        # bytes it sent us
        self.since = _mono()

    def unread(self) -> int:
        """Bytes sent to this client that it has not read yet (queued here or in the socket)."""
        n = self.out_bytes + len(self.partial)
        try:
            n += struct.unpack("i", fcntl.ioctl(self.sock.fileno(), SIOCOUTQ, b"\0" * 4))[0]
        except OSError:
            pass
        return n

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


class ProbeServer:
    """The socket side of a Probe: activation, the socket, the probe thread, the monitors."""

    def _reset_server_state(self) -> None:
        self.listening = False
        self.refused: str | None = None    # why this process has no socket
        self.sock_path: str | None = None
        self._listener: socket.socket | None = None
        self._monitors: list[_Monitor] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self.clients_dropped = 0           # sent too much (garbage, a flood)
        self.clients_evicted = 0           # idle while the monitors were full
        self.clients_refused = 0           # full of monitors that all read
        self._accept_tokens = ACCEPT_BURST
        self._accept_at = 0.0
        self._listen_paused_until: float | None = None
        self._said_dropped = False

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
        if reason is not None:
            # Someone else's directory (or a symlink, or one open to others) must not switch the
            # probe off: listen in the private fallback, where gputop also looks.
            fallback = wire.fallback_dir(os.environ, os.getuid())
            why = (_too_long(wire.socket_path(fallback, self.pid)) or wire.ensure_private_dir(fallback)) \
                if fallback else "no home directory"
            if why is None:
                # (one line per process: said only once the fallback is known to be usable)
                say(f"{reason}; listening in {fallback} instead")
                directory, reason = fallback, None
            else:
                reason = f"{reason}; and the fallback {fallback or '(none)'}: {why}"
        if reason is None:
            path = wire.socket_path(directory, self.pid)
            reason = _too_long(path)
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
        if self.flops is not None:
            self.flops.after_fork_in_child()

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
                if self._listen_paused_until is not None:
                    if now >= self._listen_paused_until:
                        self._listen_paused_until = None
                        sel.register(self._listener, selectors.EVENT_READ, "listen")
                    else:
                        timeout = min(timeout, self._listen_paused_until - now)
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
        now = _mono()
        self._accept_tokens = min(ACCEPT_BURST, self._accept_tokens + (now - self._accept_at) * ACCEPTS_PER_S)
        self._accept_at = now
        if self._accept_tokens < 1:
            # A reconnect loop: leave new connections in the backlog for a while.
            sel.unregister(self._listener)
            self._listen_paused_until = now + (1 - self._accept_tokens) / ACCEPTS_PER_S
            return
        self._accept_tokens -= 1
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
        if len(self._monitors) >= MAX_MONITORS and not self._evict_idle(sel, now):
            self.clients_refused += 1
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

    def _evict_idle(self, sel, now: float) -> bool:
        """Full: drop the client that left the most of what it was sent unread (attached for
        EVICT_UNREAD_AFTER_S at least). False if every client reads: then the new one is refused."""
        best, most = None, 0
        for m in self._monitors:
            if now - m.since < EVICT_UNREAD_AFTER_S:
                continue
            n = m.unread()
            if n > most:
                best, most = m, n
        if best is None:
            return False
        self.clients_evicted += 1
        self._drop_monitor(sel, best)
        return True

    def _read_monitor(self, sel, m: _Monitor) -> None:
        try:
            data = m.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the monitor went away (closed, or killed)
            self._drop_monitor(sel, m)
            return
        # Whatever a monitor sends is read and ignored: there is nothing it can ask for. One that
        # sends more than a little is not a monitor: dropped, so it costs the job one read.
        m.received += len(data)
        if m.received > MAX_CLIENT_INPUT:
            self.clients_dropped += 1
            if not self._said_dropped:
                self._said_dropped = True
                say(f"dropped a client of the probe socket that sent over {MAX_CLIENT_INPUT} bytes "
                    "(a monitor sends none); said once")
            self._drop_monitor(sel, m)

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
            try:
                if th.forward_steps is not None:
                    th.forward_steps.tick(now)   # a job with no optimizer: the model's calls as steps
            except Exception as e:
                th.forward_steps.stop(f"failed: {type(e).__name__}: {e}")
                self._note(f"probe forward steps failed: {type(e).__name__}: {e}")
            try:
                self.kernel_sampler.tick(now)   # (a trace, when one is due: it takes WINDOW_S and more)
            except Exception as e:
                self._note(f"probe kernel sample failed: {type(e).__name__}: {e}")
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


def _too_long(path: str) -> str | None:
    """Why a Unix socket cannot be bound at ``path`` (too long for sun_path), or None."""
    if len(path.encode()) > wire.MAX_SOCKET_PATH:
        return f"socket path {path} is longer than {wire.MAX_SOCKET_PATH} bytes: set {wire.ENV_DIR} to a shorter directory"
    return None
