"""The Prometheus exporter's HTTP limits (issue 13 item 5), on loopback with real sockets.

The exporter runs in a child process (a live session with no sources, as in a headless
``gputop --prometheus``) under ``ulimit -n 256``, so its threads and descriptors can be counted
from /proc and running out of descriptors would kill it for real. Before the limits, 300 idle
connections held 300 threads and 300 descriptors: the child died with "Too many open files".
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

CAP = 16
REQUEST_TIMEOUT_S = 1.0

CHILD = textwrap.dedent(f"""
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from gputop.export.prometheus import PrometheusExporter
    from gputop.session.session import LiveSession, SessionClock
    session = LiveSession([], SessionClock(), {{"host": "test"}})
    session.start()
    exp = PrometheusExporter("127.0.0.1", 0, session, request_timeout_s={REQUEST_TIMEOUT_S}, max_connections={CAP})
    print(exp.port, flush=True)
    sys.stdin.read()   # until the test closes our stdin
    exp.stop()
    session.stop()
""")


@pytest.fixture
def exporter():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = int(p.stdout.readline())
        yield p, port
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _counts(pid: int) -> tuple[int, int]:
    """(threads, open descriptors) of a process."""
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def _scrape(port: int, timeout: float = 2.0) -> dict[str, dict]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _closed_by_server(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closed ``sock`` (EOF or reset), or None if it did not within ``within``."""
    t0 = time.monotonic()
    sock.settimeout(within)
    try:
        while True:
            if not sock.recv(4096):
                return time.monotonic() - t0
    except (ConnectionResetError, BrokenPipeError):
        return time.monotonic() - t0
    except socket.timeout:
        return None


def test_idle_connections_are_capped_and_a_scrape_still_gets_through(exporter):
    p, port = exporter
    _scrape(port)   # warm: the first scrape imports and builds everything
    threads0, fds0 = _counts(p.pid)
    idle = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(s)
        # evicting the oldest idle connection takes a few ms each (IDLE_EVICT_AFTER_S): on a
        # loaded machine the 300 take a while to settle, so wait for the cap, then hold it to it
        deadline = time.monotonic() + 10
        while True:
            time.sleep(0.3)
            threads, fds = _counts(p.pid)
            if threads <= threads0 + CAP + 2 and fds <= fds0 + CAP + 2 or time.monotonic() > deadline:
                break
        # one thread and one descriptor per open connection, at most CAP of them (+2 for the
        # connection being evicted while the newest is accepted)
        assert threads <= threads0 + CAP + 2, (threads0, threads)
        assert fds <= fds0 + CAP + 2, (fds0, fds)
        t0 = time.monotonic()
        got = _scrape(port, timeout=2.0)
        took = time.monotonic() - t0
        assert took < 2.0, took
        assert p.poll() is None, p.stderr.read()
        closed = got["gputop_exporter_connections_closed_total"]
        assert closed[(("reason", "evicted"),)] >= 300 - CAP
        assert got["gputop_exporter_connections"][()] <= CAP
    finally:
        for s in idle:
            s.close()


def test_a_slowloris_client_is_dropped_after_the_timeout(exporter):
    _p, port = exporter
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    slow = socket.create_connection(("127.0.0.1", port), timeout=5)
    stop = threading.Event()

    def trickle():   # one header byte every 0.2 s: each read succeeds, the request never ends
        try:
            slow.sendall(b"GET /metrics HTTP/1.1\r\n")
            while not stop.is_set():
                slow.sendall(b"X")
                time.sleep(0.2)
        except OSError:
            pass

    th = threading.Thread(target=trickle, daemon=True)
    th.start()
    try:
        took = _closed_by_server(idle, within=REQUEST_TIMEOUT_S + 3)
        assert took is not None and took >= REQUEST_TIMEOUT_S * 0.8, took
        took = _closed_by_server(slow, within=3)
        assert took is not None, "a client trickling its headers was never dropped"
    finally:
        stop.set()
        th.join(timeout=2)
        idle.close()
        slow.close()
    got = _scrape(port)
    # the idle one ended at its socket timeout; the trickling one at its deadline
    assert got["gputop_exporter_connections_closed_total"][(("reason", "timed_out"),)] >= 1
    # the session's health says what the exporter closed (the exporter publishes it on change)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        up = got.get("gputop_source_up", {})
        if (("host", "test"), ("source", "exporter")) in up:
            break
        time.sleep(0.5)
        got = _scrape(port)
    assert up[(("host", "test"), ("source", "exporter"))] == 1


def test_bursts_of_concurrent_scrapes_all_succeed(exporter):
    _p, port = exporter
    results: list[object] = []
    lock = threading.Lock()

    def one():
        try:
            _scrape(port, timeout=10)
            r: object = True
        except Exception as e:  # noqa: BLE001 - counted and shown below
            r = e
        with lock:
            results.append(r)

    for _ in range(3):
        ths = [threading.Thread(target=one) for _ in range(100)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=20)
    failed = [r for r in results if r is not True]
    assert len(results) == 300 and not failed, failed[:3]
