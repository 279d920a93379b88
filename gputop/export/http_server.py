"""The exporter's HTTP side: a threading WSGI server with limits (gputop/export/prometheus.py
serves its metrics through it).

Anyone on the machine (or the network, with 0.0.0.0) can connect, and the server shares gputop's
process: an idle or slow client must never pin a thread or a descriptor for long, nor take the
session down with "Too many open files" (issue 13). So: at most ``MAX_CONNECTIONS`` open
connections, one thread each; when full, a new connection evicts the oldest one still sending
its request (so idle clients never lock a scraper out); while every open one is being
answered, new ones wait in the listen backlog (``LISTEN_BACKLOG``); a request must arrive within
``REQUEST_TIMEOUT_S`` and a whole connection end within ``ANSWER_TIMEOUT_S``. docs/prometheus.md
("Limits") says the same for users.
"""

from __future__ import annotations

import errno
import select
import socket
import sys
import threading
import time
from socketserver import ThreadingMixIn
from typing import Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "gputop_"
DEFAULT_PORT = 9464
MAX_CONNECTIONS = 32        # open connections (each has one thread); a scrape is one at a time
REQUEST_TIMEOUT_S = 5.0     # to send the request line and headers (Prometheus sends at once)
ANSWER_TIMEOUT_S = 30.0     # a whole connection, answer included (a scrape takes ~10 ms)
IDLE_EVICT_AFTER_S = 0.05  # full, a connection this old that sent nothing more may be evicted
LISTEN_BACKLOG = 128        # socketserver's default of 5 refused bursts of concurrent scrapes
HEALTH_EVERY_S = 5.0        # the exporter's health sample: on change and this often
EXPORTER_SOURCE = "exporter"


def bind_problem(host: str, port: int, e: OSError) -> str:
    where = f"cannot serve Prometheus metrics on {host}:{port}"
    if isinstance(e, socket.gaierror):
        return f"{where}: unknown host {host!r}; use an address of this machine, 127.0.0.1 or 0.0.0.0"
    if e.errno == errno.EADDRINUSE:
        return (f"{where}: the port is already in use (another gputop or exporter?); "
                "choose another port with --prometheus")
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"{where}: {host} is not an address of this machine; "
                "use 127.0.0.1 (this machine only) or 0.0.0.0 (all interfaces)")
    if e.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need root); choose a port such as {DEFAULT_PORT}"
    return f"{where}: {e.strerror or e}"


class _Discard:
    def write(self, text) -> None:
        pass

    def flush(self) -> None:
        pass


class _QuietHandler(WSGIRequestHandler):
    """Nothing on stderr, ever: in the UI it would land in the middle of the screen. The socket
    has a timeout (every read and write), and the server knows once the request was read."""

    timeout = REQUEST_TIMEOUT_S

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s
        super().setup()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.request_read(self.request)
        return ok

    def log_message(self, format, *args) -> None:
        pass

    def get_stderr(self):
        return _Discard()


class _Conn:
    __slots__ = ("sock", "opened", "reading")

    def __init__(self, sock, opened: float) -> None:
        self.sock = sock
        self.opened = opened
        self.reading = True   # until its request line and headers are in


class _Server(ThreadingMixIn, WSGIServer):
    """A threading WSGI server with a cap on open connections and deadlines for each.

    Before accepting, the server thread waits for a free slot: full (``max_connections`` open),
    it evicts the oldest connection that is still sending its request, has been open for
    ``IDLE_EVICT_AFTER_S`` and has no bytes waiting to be read (an idle client, a slowloris), so
    idle clients can never lock a scraper out. If every open connection is being answered, new
    ones wait in the listen backlog. Deadlines (``service_actions``, run by ``serve_forever``
    every 0.5 s and while waiting for a slot) close connections that are too slow. An evicted or
    late socket is shut down, so the thread blocked in it returns at once and closes it."""

    daemon_threads = True   # a hung scraper never keeps gputop from exiting
    request_queue_size = LISTEN_BACKLOG
    max_connections = MAX_CONNECTIONS
    request_timeout_s = REQUEST_TIMEOUT_S
    answer_timeout_s = ANSWER_TIMEOUT_S

    def server_activate(self) -> None:
        self._conns: dict[int, _Conn] = {}   # id(sock) -> _Conn, oldest first
        self._conns_lock = threading.Lock()
        self._closing = False
        self._actions_at = 0.0
        self.stats = {"served": 0, "evicted": 0, "timed_out": 0, "errors": 0, "accept_errors": 0}
        self.last_error: str | None = None
        super().server_activate()

    def shutdown(self) -> None:
        self._closing = True   # ends a wait for a slot
        super().shutdown()

    def get_request(self):
        self._wait_for_slot()
        try:
            return super().get_request()
        except OSError as e:
            # Out of descriptors (EMFILE/ENFILE) or a client that reset before accept: count it
            # and pause briefly, rather than spin on a listening socket that stays readable.
            self.stats["accept_errors"] += 1
            self.last_error = f"accept: {e.strerror or e}"
            time.sleep(0.05)
            raise

    def _wait_for_slot(self) -> None:
        while not self._closing:
            now = time.monotonic()
            with self._conns_lock:
                if len(self._conns) < self.max_connections:
                    return
                victim = next((c for c in self._conns.values() if c.reading and now - c.opened >= IDLE_EVICT_AFTER_S
                               and not _readable(c.sock)), None)
                if victim is not None:
                    del self._conns[id(victim.sock)]
                    self.stats["evicted"] += 1
            if victim is not None:
                _shut(victim.sock)
                return
            if now - self._actions_at >= 0.5:
                self.service_actions()
            time.sleep(0.01)   # all open connections are busy: new ones wait in the backlog

    def process_request(self, request, client_address) -> None:
        with self._conns_lock:
            self._conns[id(request)] = _Conn(request, time.monotonic())
        try:
            super().process_request(request, client_address)
        except Exception as e:   # "can't start new thread": this one connection fails, nothing else
            self._forget(request)
            self.handle_error(request, client_address, e)
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def request_read(self, request) -> None:
        with self._conns_lock:
            c = self._conns.get(id(request))
            if c is not None:
                c.reading = False
            self.stats["served"] += 1

    def _forget(self, request) -> None:
        with self._conns_lock:
            self._conns.pop(id(request), None)

    def service_actions(self) -> None:
        now = self._actions_at = time.monotonic()
        late = []
        with self._conns_lock:
            for key, c in list(self._conns.items()):
                limit = self.request_timeout_s if c.reading else self.answer_timeout_s
                if now - c.opened > limit:
                    late.append(c.sock)
                    del self._conns[key]
            self.stats["timed_out"] += len(late)
        for sock in late:
            _shut(sock)
        on_tick = getattr(self, "on_tick", None)
        if on_tick is not None:
            on_tick()

    def open_connections(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def handle_error(self, request, client_address, error: BaseException | None = None) -> None:
        # A scraper that hung up mid-answer, or a bug: counted, never a traceback on the screen.
        e = error if error is not None else sys.exc_info()[1]
        if isinstance(e, (ConnectionError, TimeoutError, socket.timeout)) or e is None:
            return
        self.stats["errors"] += 1
        self.last_error = f"{type(e).__name__}: {e}"[:200]


def _readable(sock) -> bool:
    """Bytes (or EOF) wait on ``sock``: its thread has not read them yet, so it is not idle."""
    try:
        p = select.poll()
        p.register(sock.fileno(), select.POLLIN)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return False


def _shut(sock) -> None:
    """Wake the thread blocked on ``sock`` (its read returns EOF); the thread then closes it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def listen(host: str, port: int) -> _Server:
    """A threading WSGI server bound to (host, port), IPv4 or IPv6 as the address says. Our own
    rather than prometheus_client.start_http_server, which returns nothing to stop it with
    before prometheus-client 0.20, and has no timeouts or connection cap."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server_class = type("_Server", (_Server,), {"address_family": family})
    return server_class(sockaddr[:2], _QuietHandler)


class ServerCollector:
    """The exporter's own connection counters, so a dashboard sees a flood of clients."""

    def __init__(self, server: _Server) -> None:
        self.server = server

    def collect(self) -> Iterable:
        srv = self.server
        open_ = GaugeMetricFamily(PREFIX + "exporter_connections", "Connections open to gputop's exporter now "
                                  f"(at most {srv.max_connections}).")
        open_.add_metric([], srv.open_connections())
        closed = CounterMetricFamily(PREFIX + "exporter_connections_closed", "Connections gputop's exporter closed "
                                     "before answering: evicted (idle while the cap was reached), timed_out (too "
                                     "slow), accept_errors (could not accept: out of descriptors?).",
                                     labels=["reason"])
        for reason in ("evicted", "timed_out", "accept_errors"):
            closed.add_metric([reason], srv.stats[reason])
        return [open_, closed]
