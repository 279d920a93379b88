"""The probe's core without torch, in this process: windows from marker steps over a real
socket, the clock conversion, the bounded per-monitor queue, and a fork."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

import gputop.probe
from gputop.probe import core, wire
from gputop.session.session import SessionClock
from gputop.sources.probe_client import KIND_PROBE_STEP, ProbeClientSource
from gputop.sources.target import Target


@pytest.fixture
def probe(tmp_path, monkeypatch):
    d = tmp_path / "sock"
    monkeypatch.setenv(wire.ENV_DIR, str(d))
    p = core.Probe(dormant=False, origin="test")
    assert p.start_server(), p.refused
    yield p, d
    p.stop_server()


def test_marker_steps_become_windows_with_session_times(probe):
    p, d = probe
    assert os.listdir(d) == [f"{os.getpid()}.sock"]
    assert (os.stat(d / f"{os.getpid()}.sock").st_mode & 0o777) == 0o600
    clock = SessionClock()
    got = []
    src = ProbeClientSource(clock, Target(os.getpid()), probe_dirs=[str(d)], scan_interval_s=0.1)
    src.start(got.append)
    deadline = time.monotonic() + 10
    while not p.monitoring and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.monitoring
    n = 60
    for _ in range(n):  # 60 steps of ~20 ms, marked by hand as gputop.probe.step() would
        time.sleep(0.02)
        p.on_marker_step()
    time.sleep(1.2)
    src.stop()
    windows = [s for s in got if s.kind == KIND_PROBE_STEP]
    assert sum(s.get("steps") for s in windows) == n
    assert windows[-1].get("step_total") == n
    timed = sum(s.get("step_n") for s in windows)
    mean = sum(s.get("step_s_sum") or 0.0 for s in windows) / timed
    assert timed == n - 1 and 0.019 < mean < 0.04
    assert all(0 < s.get("window_s") < 2.0 for s in windows)
    assert all(s.get("batches") == 0 and s.get("batches_per_s") == 0.0 for s in windows)
    assert windows[-1].get("gpu_ms_mean") is None and windows[-1].get("syncs") is None
    # Session times: windows arrive in order, each stamped at its end, never in the future.
    ts = [s.t for s in windows]
    assert ts == sorted(ts) and ts[-1] <= clock.now()


def test_clock_offset_is_exact_on_one_machine(probe):
    """Same machine, same monotonic clock: the offset is -clock.start_monotonic to a few ms."""
    p, d = probe
    clock = SessionClock()
    src = ProbeClientSource(clock, Target(os.getpid()), probe_dirs=[str(d)], scan_interval_s=0.1)
    src.start(lambda s: None)
    time.sleep(1.5)
    info = src.describe()["probes"][str(os.getpid())]
    src.stop()
    assert info["clock_offset_s"] == pytest.approx(-clock.start_monotonic, abs=0.005)


def test_outbox_is_bounded_and_never_blocks():
    a, b = socket.socketpair()
    a.setblocking(False)
    m = core._Monitor(a, None)
    msg = b"x" * 10_000 + b"\n"
    t0 = time.monotonic()
    for _ in range(300):  # 3 MB to a peer that never reads
        m.queue(msg)
        assert m.flush() is True
    assert time.monotonic() - t0 < 2.0
    assert m.out_bytes <= core.MAX_OUTBOX_BYTES
    assert m.dropped > 0
    b.close()
    # The peer is gone: flush says so instead of raising (and never sends SIGPIPE).
    m.queue(msg)
    deadline = time.monotonic() + 2
    alive = True
    while alive and time.monotonic() < deadline:
        alive = m.flush()
    assert alive is False
    a.close()


def test_a_forked_child_goes_dormant_and_leaves_the_parents_socket(probe, monkeypatch):
    p, d = probe
    monkeypatch.setattr(gputop.probe, "_PROBE", p)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the at-fork handler has run
        try:
            ok = (p.pid == os.getpid() and p.dormant and not p.listening and p.sock_path is None
                  and p._thread is None and os.path.exists(d / f"{os.getppid()}.sock"))
            os.write(w, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 16) == b"ok"
    os.waitpid(pid, 0)
    os.close(r)
    assert p.listening and os.path.exists(d / f"{os.getpid()}.sock")
    # The parent's probe still serves monitors.
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(d / f"{os.getpid()}.sock"))
    s.settimeout(5)
    first = wire.LineReader().feed(s.recv(65536))[0]
    assert first["type"] == "hello" and first["pid"] == os.getpid()
    s.close()


def test_a_dormant_probe_opens_its_socket_at_the_first_step(tmp_path, monkeypatch):
    d = tmp_path / "sock"
    monkeypatch.setenv(wire.ENV_DIR, str(d))
    p = core.Probe(dormant=True, origin="test")
    try:
        assert not d.exists()
        p.on_marker_step()
        assert p.listening and os.listdir(d) == [f"{os.getpid()}.sock"]
        assert p.step_total == 1
    finally:
        p.stop_server()
    assert os.listdir(d) == []


def test_a_live_probe_socket_of_this_pid_is_not_stolen(probe):
    p, d = probe
    second = core.Probe(dormant=False, origin="test")
    assert second.start_server() is False
    assert "another gputop probe already listens" in second.refused
    assert p.listening


def test_hook_failure_is_reported_not_raised(probe):
    p, d = probe
    threading.Thread(target=lambda: None).start()
    p.hook_failed("dataloader", ValueError("boom"))
    assert p.hooks["dataloader"][0] == "failed" and "ValueError: boom" in p.hooks["dataloader"][1]


class _StreamClock:
    """A stand-in for one CUDA stream (no GPU here): an event gets the stream time at which
    the test says the GPU reaches it, and is complete once the test's GPU clock passes that.
    This checks the probe's event bookkeeping only -- pairing, reading in order, returning
    events to the pool only when no later step can still need them. Real CUDA events are
    checked on the GPU by benchmarks/probe_accuracy.py."""

    def __init__(self):
        self.gpu_now = 0.0          # how far the GPU has got
        self.next_at = 0.0          # stream time the next recorded event will complete at
        self.records = 0
        self.created = 0
        clock = self

        class Event:
            def __init__(self, enable_timing=True):
                clock.created += 1
                self.at = None

            def record(self, stream=None):
                clock.records += 1
                self.at = clock.next_at

            def query(self):
                return self.at is not None and self.at <= clock.gpu_now

            def elapsed_time(self, end):
                assert self.query() and end.query()
                return (end.at - self.at) * 1000.0

        class Stream:
            device_index = 0

        class Cuda:
            pass
        Cuda.Event = Event
        Cuda.is_current_stream_capturing = staticmethod(lambda: False)
        Cuda.current_stream = staticmethod(lambda: Stream())
        self.cuda = Cuda


def test_cuda_event_bookkeeping_pairs_and_reuses_events_safely():
    import types
    p = core.Probe(dormant=True, origin="test")
    gpu = _StreamClock()
    p.torch = types.SimpleNamespace(cuda=gpu.cuda)
    p.torch_hooks = types.SimpleNamespace(disable=lambda name: None)
    ws = core._WindowState(p)
    p.cuda_events_on = True
    got: list[float] = []
    # 40 steps: batch handed over at stream time 10*i + 2, step's work done at 10*i + 2 + (i % 5 + 1).
    # The GPU lags the host by up to 3 steps, so reads happen with events still in flight.
    expected = []
    for i in range(40):
        gpu.next_at = 10.0 * i + 2
        p._record_data_event()
        gpu.next_at = 10.0 * i + 2 + (i % 5 + 1)
        p._record_boundary_event(i + 1)
        expected.append(float(i % 5 + 1))
        gpu.gpu_now = 10.0 * (i - 3)
        got += ws._read_gpu()
    gpu.gpu_now = 1e9
    got += ws._read_gpu()
    assert got == expected
    assert not p.ev_pending
    # Events were reused from the pool instead of created per step (2 records per step).
    assert gpu.records == 80 and gpu.created <= 14
    # Without a DataLoader the span runs from the previous step boundary.
    for i in range(5):
        gpu.next_at = 1000.0 + 4 * i
        p._record_boundary_event(100 + i)
    # (the first of them from the last boundary of the loop above, at stream time 397)
    assert ws._read_gpu() == [603.0, 4.0, 4.0, 4.0, 4.0]
