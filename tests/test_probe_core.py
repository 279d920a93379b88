"""The probe's core, mostly without torch: windows from marker steps over a real socket, the
clock conversion, the bounded per-monitor queue, a fork, a dormant probe waking without socket
work on the training thread, and (with a stand-in for CUDA's per-thread device) which device the
probe thread uses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
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
    # the last window closes up to WINDOW_S (1 s) after the last step, then travels: wait for it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(s.get("steps") or 0 for s in list(got) if s.kind == KIND_PROBE_STEP) < n:
        time.sleep(0.05)
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


WAKE_SCRIPT = textwrap.dedent('''
    import json, os, socket, sys, threading, time
    from gputop.probe import core, wire

    d = sys.argv[1]
    os.mkdir(d, 0o700)
    # Left-overs the waking probe must deal with: a socket at its own path that refuses
    # connections (a dead process with our PID) and one of a process that is gone.
    dead = 4_000_000
    while True:
        try:
            os.kill(dead, 0)
            dead += 1
        except ProcessLookupError:
            break
    for pid in (os.getpid(), dead):
        s = socket.socket(socket.AF_UNIX)
        s.bind(wire.socket_path(d, pid))
        s.close()

    main = threading.get_ident()
    seen = []
    WATCH = ("socket.", "os.listdir", "os.scandir", "os.kill", "os.mkdir", "os.chmod", "os.remove")

    def audit(event, args):
        if event.startswith(WATCH):
            seen.append([event, threading.get_ident() == main])

    p = core.Probe(dormant=True, origin="test")
    sys.addaudithook(audit)
    p.on_marker_step()                   # the training thread's first step wakes the probe
    on_training_thread = sorted({e for e, m in seen if m})
    deadline = time.monotonic() + 10
    # listening, and the scan of stale sockets done (the dead process's removed): the scan may come
    # after the listen, and on a loaded box it once had not run yet (no os.kill seen)
    while (not p.listening or len(os.listdir(d)) > 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    out = {"on_training_thread": on_training_thread, "on_probe_thread": sorted({e for e, m in seen if not m}),
           "listening": p.listening, "files": sorted(os.listdir(d)), "steps": p.step_total, "pid": os.getpid()}
    p.stop_server()
    out["files_after_stop"] = os.listdir(d)
    print(json.dumps(out))
''')


def test_a_dormant_probe_wakes_at_the_first_step_and_its_own_thread_opens_the_socket(tmp_path):
    """The wake happens on the training thread: it may only start the probe thread. The
    connect (with its timeout), the directory scan, kill(pid, 0) per stale socket and any
    stderr line happen on that thread. Checked with an audit hook that notes each socket and
    file-system call and the thread that made it."""
    script = tmp_path / "wake.py"
    script.write_text(WAKE_SCRIPT)
    d = tmp_path / "sock"
    out = subprocess.run([sys.executable, str(script), str(d)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, wire.ENV_DIR: str(d)})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["on_training_thread"] == []
    assert {"socket.connect", "socket.bind", "os.listdir", "os.kill"} <= set(res["on_probe_thread"])
    assert res["listening"] and res["steps"] == 1
    # The stale sockets are gone (ours replaced, the dead process's removed); stop removes ours.
    assert res["files"] == [f"{res['pid']}.sock"]
    assert res["files_after_stop"] == []


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


class _PerThreadCuda:
    """A stand-in for torch.cuda's device state (no GPU here), modelled on CUDA's rules: the
    current device is per thread (0 on a new thread); set_device creates a context on a device
    that has none; the probe may only tell with _cuda_hasPrimaryContext. It records which
    thread asked what. This checks the probe's device bookkeeping only; on a GPU,
    benchmarks/probe_device.py checks that a rank on cuda:1 gets no context on cuda:0."""

    def __init__(self, contexts):
        self.tls = threading.local()
        self.contexts = set(contexts)
        self.stats: dict = {}   # more of memory_stats' counters
        self.calls: list[tuple[str, int, object]] = []
        gpu = self

        class cuda:
            @staticmethod
            def is_initialized():
                return True

            @staticmethod
            def current_device():
                return getattr(gpu.tls, "device", 0)

            @staticmethod
            def set_device(d):
                gpu.calls.append(("set_device", threading.get_ident(), d))
                gpu.contexts.add(d)
                gpu.tls.device = d

            @staticmethod
            def memory_stats(d=None):
                d = cuda.current_device() if d is None else d
                gpu.calls.append(("memory_stats", threading.get_ident(), d))
                return {"allocated_bytes.all.current": 1000 + d, **gpu.stats}

            @staticmethod
            def get_device_name(d=None):
                return f"GPU{cuda.current_device() if d is None else d}"

            @staticmethod
            def get_device_capability(d=None):
                return (9, 0)

            @staticmethod
            def get_sync_debug_mode():
                return 0

        class C:
            @staticmethod
            def _cuda_hasPrimaryContext(d):
                return d in gpu.contexts

        self.cuda, self.C = cuda, C


class _TorchWith:
    """The real torch module, with cuda and _C replaced by the stand-in."""

    def __init__(self, real, gpu):
        self._real, self.cuda, self._C = real, gpu.cuda, gpu.C

    def __getattr__(self, name):
        return getattr(self._real, name)


def _hooks_on(gpu):
    import torch

    from gputop.probe.torch_hooks import TorchHooks
    p = core.Probe(dormant=True, origin="test")
    h = TorchHooks(p, torch)
    h.cuda_available = True
    p.torch = h.torch = _TorchWith(torch, gpu)
    p.torch_hooks = h
    p.set_hook("syncs", "unavailable", "not under test here")
    p.monitoring = True
    return p, h


def test_the_probe_thread_uses_the_training_threads_cuda_device():
    from concurrent.futures import ThreadPoolExecutor
    gpu = _PerThreadCuda(contexts={3})
    gpu.tls.device = 3                     # this (training) thread: a rank that set cuda:3
    p, h = _hooks_on(gpu)
    probe_thread = ThreadPoolExecutor(max_workers=1)   # one thread, like the probe's own
    on_probe = lambda fn: probe_thread.submit(fn).result()   # noqa: E731
    try:
        # The job has initialised CUDA but not stepped since: the device is not known yet, so
        # no memory, no device in the config, no events, and no CUDA call on the probe thread.
        on_probe(lambda: h.manage(p))
        assert on_probe(h.memory) is None
        assert p.cuda_seen and p.cuda_device is None
        cfg = on_probe(h.config)
        assert cfg["device"] is None and cfg["device_name"] is None
        assert not p.cuda_events_on and "learn its CUDA device" in p.hooks["cuda_events"][1]
        assert gpu.calls == []
        # The next step, on the training thread, reads the training thread's device.
        p.on_marker_step()
        assert p.cuda_device == 3
        on_probe(lambda: h.manage(p))
        mem = on_probe(h.memory)
        cfg = on_probe(h.config)
        probe_id = on_probe(threading.get_ident)
        assert mem["device"] == 3 and mem["allocated"] == 1003
        assert cfg["device"] == 3 and cfg["device_name"] == "GPU3"
        assert ("set_device", probe_id, 3) in gpu.calls and ("memory_stats", probe_id, 3) in gpu.calls
        assert p.cuda_events_on
        assert gpu.contexts == {3}          # no context anywhere else
    finally:
        probe_thread.shutdown()


def test_the_probe_creates_no_context_on_a_device_the_job_has_none_on():
    """A job that puts its tensors on cuda:3 without set_device has current device 0 and no
    context there: the probe thread must not make one (set_device would)."""
    from concurrent.futures import ThreadPoolExecutor
    gpu = _PerThreadCuda(contexts={3})
    p, h = _hooks_on(gpu)
    probe_thread = ThreadPoolExecutor(max_workers=1)
    try:
        probe_thread.submit(h.manage, p).result()
        p.on_marker_step()
        assert p.cuda_device == 0
        probe_thread.submit(h.manage, p).result()
        cfg = probe_thread.submit(h.config).result()
        assert probe_thread.submit(h.memory).result() is None
        assert cfg["device"] is None and cfg["device_name"] is None
        assert not any(c[0] == "set_device" for c in gpu.calls) and gpu.contexts == {3}
        assert not p.cuda_events_on and "has no CUDA context" in p.hooks["cuda_events"][1]
    finally:
        probe_thread.shutdown()


def test_the_allocators_calls_reach_gputop_from_the_counters_each_torch_has(tmp_path):
    """cudaMalloc/cudaFree calls (allocator_thrash's evidence that the cache is rebuilt every step):
    torch 2.13 counts them (num_device_alloc/num_device_free), torch 2.11 (the GPU machine's) has
    only the segments created and freed, the same count without expandable segments. The probe
    sends whichever there is, and gputop's client forwards every allocator field the probe sends:
    a hand list there once dropped these two, so no recording had them."""
    from concurrent.futures import ThreadPoolExecutor
    gpu = _PerThreadCuda(contexts={0})
    gpu.tls.device = 0
    p, h = _hooks_on(gpu)
    probe_thread = ThreadPoolExecutor(max_workers=1)
    on_probe = lambda fn: probe_thread.submit(fn).result()   # noqa: E731
    try:
        on_probe(lambda: h.manage(p))   # (the device is learnt at the next step, as in the test above)
        p.on_marker_step()
        on_probe(lambda: h.manage(p))
        gpu.stats = {"segment.all.allocated": 41, "segment.all.freed": 38, "num_alloc_retries": 0, "num_ooms": 0}
        old = on_probe(h.memory)
        assert (old["device_allocs"], old["device_frees"]) == (41, 38), old
        gpu.stats.update(num_device_alloc=50, num_device_free=47)
        mem = on_probe(h.memory)
        assert (mem["device_allocs"], mem["device_frees"]) == (50, 47), mem
    finally:
        probe_thread.shutdown()

    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    d = tmp_path / "sock"
    d.mkdir(mode=0o700)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(d / f"{target.pid}.sock"))
    os.chmod(d / f"{target.pid}.sock", 0o600)
    srv.listen(1)

    def serve():   # a probe's side of the wire: its hello, then that memory message
        conn, _ = srv.accept()
        hello = {"type": wire.MSG_HELLO, "v": 1, "mono": time.monotonic(), "pid": target.pid, "argv": ["job"]}
        conn.sendall((json.dumps(hello) + "\n" + json.dumps({**mem, "mono": time.monotonic()}) + "\n").encode())
        time.sleep(5)
        conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    got: list = []
    src = ProbeClientSource(SessionClock(), Target(target.pid), probe_dirs=[str(d)], scan_interval_s=0.2)
    try:
        src.start(got.append)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not [s for s in got if s.kind == "probe_memory"]:
            time.sleep(0.05)
    finally:
        src.stop()
        target.kill()
        target.wait()
        srv.close()
    sample = next(s for s in got if s.kind == "probe_memory")
    sent = {k: v for k, v in mem.items() if k not in ("type", "mono", "device")}
    assert {k: sample.data.get(k) for k in sent} == sent, (sample.data, sent)
