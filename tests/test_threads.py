"""Thread states: the fusion of py-spy frames with kernel wait classes, the processor, the
recording/replay round trip and the report section.

The fusion tests feed ``fuse`` hand-made aggregates (it is arithmetic over counts); the live
tests run the real source against real targets and replay the real recording.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import pytest

from gputop.derive import frame_rules as fr
from gputop.derive.threads import (KIND_THREAD_STATE, STATES, ThreadAgg, ThreadStateProcessor, fuse, report_section,
                                   thread_state)
from gputop.model import Sample
from gputop.session.recording import Recorder, RecordingReader, RecordingWriter
from gputop.session.replay import RECORDED_SUFFIX, ReplaySession
from gputop.session.session import LiveSession, SessionClock
from gputop.session.store import SampleStore
from gputop.sources.stacks import KIND_STACKS, KIND_THREAD_KERNEL, WAIT_CLASSES, StackSource
from gputop.sources.target import Target

from stacks_helpers import Proc, wait_for, workload

pytestmark = pytest.mark.timeout(120)


def agg(frames: dict | None = None, k: dict | None = None, cpu=None, runq=None, span=1.0, gil_known=True,
        python_proc=True, pid=1, tid=1, main=True) -> ThreadAgg:
    a = ThreadAgg(pid, tid, name="t", main_proc=main)
    if frames:
        a.cats = Counter(frames)
        a.n = sum(frames.values())
        a.frames_s = span
    if k is not None:
        a.k = [k.get(c, 0) for c in WAIT_CLASSES]
        a.span_s = span
        a.gil_known = gil_known
        a.python_proc = python_proc
        if cpu is not None:
            a.cpu_s, a.runq_s, a.sched_span_s = cpu * span, (runq or 0.0) * span, span
    return a


def close(x, y, tol=0.02):
    return x is not None and abs(x - y) <= tol


def total(shares):
    return sum(v for s, v in shares.items() if s in STATES and v is not None)


def test_gil_bound_main_thread():
    s = fuse(agg({fr.PYTHON: 200}, {"run": 25, "gil": 75}, cpu=0.25))
    assert close(s["gil"], 0.75) and close(s["running"], 0.25) and close(s["idle"], 0.0)
    assert close(total(s), 1.0, 1e-9)


def test_sleeper_is_idle_with_its_small_gil_wait():
    s = fuse(agg({fr.IDLE: 200}, {"sleep": 80, "gil": 10, "run": 1}, cpu=0.01))
    assert close(s["gil"], 0.11) and close(s["idle"], 0.88) and s["running"] < 0.02


def test_blocked_dataloader_wait_is_not_double_counted_as_idle():
    s = fuse(agg({fr.DATA: 60, fr.PYTHON: 40}, {"run": 40, "poll": 60}, cpu=0.4))
    assert close(s["data"], 0.6) and close(s["idle"], 0.0) and close(s["running"], 0.4)


def test_spinning_cuda_sync_keeps_the_real_idle_time():
    s = fuse(agg({fr.CUDA: 50, fr.PYTHON: 30, fr.IDLE: 20}, {"run": 80, "sleep": 20}, cpu=0.8))
    assert close(s["cuda"], 0.5) and close(s["idle"], 0.2) and close(s["running"], 0.3)


def test_run_queue_time_is_split_by_ratio():
    # 30% data wait, on CPU 35%, waiting for a CPU 35%, no other waits.
    s = fuse(agg({fr.DATA: 30, fr.PYTHON: 70}, {"run": 70, "poll": 30}, cpu=0.35, runq=0.35))
    assert close(s["cpu_wait"], 0.35) and close(s["running"], 0.35) and close(total(s), 1.0, 1e-9)


def test_frames_alone_cannot_tell_running_from_gil_wait():
    s = fuse(agg({fr.PYTHON: 70, fr.IDLE: 30}))
    assert s["gil"] is None and s["running"] is None and s["cpu_wait"] is None
    assert close(s["idle"], 0.3) and close(s["unknown"], 0.7)


def test_gil_unknown_without_syscall_access_leaves_unknown_not_zero():
    s = fuse(agg({fr.PYTHON: 100}, {"run": 30, "other": 70}, cpu=0.3, gil_known=False))
    assert s["gil"] is None and close(s["running"], 0.3) and close(s["unknown"], 0.7)


def test_native_thread_from_the_kernel_only():
    s = fuse(agg(None, {"run": 50, "lock": 50}, cpu=0.5))
    assert s["data"] is None and s["cuda"] is None and s["collective"] is None
    assert close(s["running"], 0.5) and close(s["idle"], 0.5) and close(s["gil"], 0.0)
    s = fuse(agg(None, {"run": 10, "lock": 90}, cpu=0.1, gil_known=False, python_proc=False))
    assert s["gil"] is None and close(s["idle"], 0.9)


def test_unknown_stacks_stay_unknown():
    s = fuse(agg({fr.UNKNOWN: 50, fr.PYTHON: 50}, {"run": 100}, cpu=1.0))
    assert close(s["unknown"], 0.5) and close(s["running"], 0.5)


def test_thread_state_publishes_percent_and_hides_quiet_native_threads():
    d = thread_state(agg({fr.PYTHON: 10}, {"run": 10}, cpu=1.0))
    assert d["role"] == "main" and d["running_pct"] == 100.0 and d["top"] == "running"
    assert set(f"{s}_pct" for s in STATES) <= set(d)
    assert thread_state(agg(None, {"lock": 100}, cpu=0.001, tid=2)) is None
    assert thread_state(agg(None, {"run": 100}, cpu=0.9, tid=3))["python"] is False
    json.dumps(d)


# -- live: source -> session -> recording -> replay -> report ----------------------------------

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real 8 s session on a GIL-contended target (1 spinner + a sleeper), recorded."""
    path = str(tmp_path_factory.mktemp("rec") / "stacks.gtrec")
    p = Proc(workload("stacks_gil.py", "--spinners", "1", "--sleeper"))
    try:
        p.first()
        clock = SessionClock()
        src = StackSource(clock, Target(p.pid), rate_hz=20, window_s=2)
        rec = Recorder(RecordingWriter(path, {"target": {"pid": p.pid}}))
        proc = ThreadStateProcessor()
        sess = LiveSession([src], clock, {"target": {"pid": p.pid}}, recorder=rec, processors=[proc])
        sess.start()
        wait_for(lambda: sum(1 for _ in sess.store.series(KIND_STACKS, str(p.pid))) >= 3, 20, 0.2)
        main_key = f"{p.pid}:{p.pid}"
        live = sess.store.latest(KIND_THREAD_STATE, main_key)
        sess.stop()
    finally:
        p.kill()
    return {"path": path, "pid": p.pid, "live_main": live, "lines": list(p.lines), "t0": clock.start_monotonic}


def truth_gil(lines: list[dict], a: float, b: float) -> dict[int, float]:
    """GIL wait per thread id over [a, b] (monotonic) from the workload's own counters:
    (wall - cpu - runq) / wall for compute threads, (overshoot - runq) / wall for the sleeper."""
    la = min(lines, key=lambda d: abs(d["mono"] - a))
    lb = min(lines, key=lambda d: abs(d["mono"] - b))
    wall = lb["mono"] - la["mono"]
    out = {}
    for name, tb in lb["threads"].items():
        ta = la["threads"][name]
        drunq = tb["runq"] - ta["runq"]
        if name == "sleeper":
            out[tb["tid"]] = (tb["overshoot"] - ta["overshoot"] - drunq) / wall
        else:
            out[tb["tid"]] = (wall - (tb["cpu"] - ta["cpu"]) - drunq) / wall
    return out


def test_live_states_for_a_gil_contended_target(recorded):
    d = recorded["live_main"]
    assert d is not None, "the processor published the main thread's state live"
    d = d.data
    assert d["role"] == "main" and d["name"] == "MainThread" and d["python"] is True
    assert d["gil_pct"] > 5 and d["idle_pct"] < 5
    assert math.isclose(sum(d[f"{s}_pct"] for s in STATES), 100.0, abs_tol=0.6)


def test_gil_wait_agrees_with_the_workloads_own_counters(recorded):
    """Loose here (a shared 2-core CI box): benchmarks/gil_accuracy.py makes the +-10 point claim."""
    with RecordingReader(recorded["path"]) as rd:
        samples = rd.all_samples()
    kern = [s for s in samples if s.kind == KIND_THREAD_KERNEL]
    a, b = min(s.data["t0"] for s in kern), max(s.t for s in kern)
    truth = truth_gil(recorded["lines"], recorded["t0"] + a, recorded["t0"] + b)
    states = {d["tid"]: d for d in report_section(samples)["threads"]}
    assert len(truth) == 3
    for tid, g in truth.items():
        assert abs(states[tid]["gil_pct"] - 100 * g) <= 15, (states[tid]["name"], states[tid]["gil_pct"], 100 * g)


def test_replay_rederives_the_same_states(recorded):
    r = ReplaySession(recorded["path"], processors=[ThreadStateProcessor()], start_playing=False)
    r.seek(r.t_end)
    pid = recorded["pid"]
    key = f"{pid}:{pid}"
    old = r.store.latest(KIND_THREAD_STATE + RECORDED_SUFFIX, key)
    assert old is not None
    # the replayed state nearest the live one's time (on a loaded machine the live session's last
    # run can come too late to be recorded, so the latest of each may be one interval apart)
    replayed = r.store.window(KIND_THREAD_STATE, old.t - 5.0).get(key, [])
    again = min(replayed, key=lambda s: abs(s.t - old.t), default=None)
    assert again is not None and abs(again.t - old.t) <= 1.5, (old.t, [s.t for s in replayed])
    for s in ("gil", "running", "idle"):
        assert abs(again.data[f"{s}_pct"] - old.data[f"{s}_pct"]) <= 12, s
    sleeper = next(d for k, d in r.store.latest_of_kind(KIND_THREAD_STATE).items() if d.data["name"] == "sleeper")
    assert sleeper.data["idle_pct"] > 60 and sleeper.data["gil_pct"] < 35
    r.stop()


def test_report_section_from_the_recording(recorded):
    with RecordingReader(recorded["path"]) as rd:
        samples = rd.all_samples()
    rep = report_section(samples)
    json.dumps(rep)
    assert rep["available"] is True and rep["covered_s"] > 4
    assert rep["main_thread"]["tid"] == recorded["pid"]
    assert rep["threads"][0]["role"] == "main"
    assert rep["gil_wait_pct"] > 20 and rep["data_wait_pct"] == 0.0 and rep["sync_wait_pct"] == 0.0
    assert rep["sampler"]["state"] == "ok" and rep["sampler"]["rate_hz"] > 10
    top = rep["top_frames"]["main_thread"][0]
    assert top["file"].endswith("stacks_gil.py") and top["self_pct"] > 50
    names = {d["name"] for d in rep["threads"]}
    assert {"MainThread", "spinner0", "sleeper"} <= names


def test_report_section_says_why_when_there_is_nothing():
    h = Sample(1.0, "health", "stacks", {"state": "failed", "message": "py-spy not found: pip install py-spy",
                                         "rate_hz": None})
    rep = report_section([h])
    assert rep["available"] is False and "pip install py-spy" in rep["why"]
    assert report_section([])["available"] is False


def test_processor_survives_a_damaged_recording():
    bad = [Sample(1.0, KIND_STACKS, "12", {"frames": "nope", "threads": [1, 2]}),
           Sample(1.0, KIND_STACKS, "x", {}),
           Sample(1.0, KIND_STACKS, "12", {"frames": [["f", "a.py", 1]], "threads": [
               {"tid": 12, "stacks": [[3, [0, 99]], ["x", [0]], [2, "no"]]}, {"tid": [1]}]}),
           Sample(1.0, KIND_THREAD_KERNEL, "12", {"cols": ["tid", "run"], "threads": [[12, 5], [1], "z"]}),
           Sample(1.0, KIND_THREAD_KERNEL, "12", {"cols": 3, "threads": None})]

    store = SampleStore()   # (no stacks health: the 2 s windows of an old file)
    store.on_samples(bad)
    out = ThreadStateProcessor().process(store, 2.0)
    assert [s.key for s in out] == ["12:12"]
    assert out[0].data["samples"] == 3


def test_dataloader_wait_and_workers(tmp_path):
    """A CPU DataLoader loop measuring its own time in next(): gputop's data wait must agree
    (loosely here; benchmarks/gil_accuracy.py measures it), and the workers must be found."""
    pytest.importorskip("torch")
    p = Proc(workload("stacks_dataloader.py", "--workers", "2", "--batch", "8", "--sample-ms", "3",
                      "--step-ms", "4"))
    try:
        p.first(timeout=90)
        clock = SessionClock()
        got: list = []
        src = StackSource(clock, Target(p.pid), rate_hz=20, window_s=2)
        src.start(got.append)
        wait_for(lambda: sum(s.kind == KIND_STACKS and s.key == str(p.pid) for s in got) >= 4, 30, 0.2)
        src.stop()
        lines = list(p.lines)
    finally:
        p.kill()
    kern = [s for s in got if s.kind == KIND_THREAD_KERNEL and s.key == str(p.pid)]
    stk = [s for s in got if s.kind == KIND_STACKS]
    a = min(s.data["t0"] for s in stk if s.key == str(p.pid))
    b = max(s.t for s in stk if s.key == str(p.pid))
    la = min(lines, key=lambda d: abs(d["mono"] - (clock.start_monotonic + a)))
    lb = min(lines, key=lambda d: abs(d["mono"] - (clock.start_monotonic + b)))
    truth = (lb["next_s"] - la["next_s"]) / (lb["mono"] - la["mono"])
    rep = report_section(got)
    assert rep["main_thread"]["name"] == "MainThread"
    # Within 15 points of the job's own clock on a box with cores to spare. On a box busier than
    # its cores (the suite beside two CPU hogs: load 6 on 2 cores), py-spy itself waits for a core
    # and runs mostly while the loop is blocked, so its samples over-count the wait (79 vs 63%
    # measured there): then only that the wait is seen, not its accuracy, which
    # benchmarks/gil_accuracy.py measures (data wait within 1.8 points on the H200)
    loaded = os.getloadavg()[0] > (os.cpu_count() or 1)
    assert abs(rep["data_wait_pct"] - 100 * truth) <= (15 if not loaded else 50), \
        (rep["data_wait_pct"], 100 * truth, os.getloadavg())
    assert rep["data_wait_pct"] > 10
    workers = rep["dataloader_workers"]
    assert len({w["pid"] for w in workers}) == 2, workers
    assert all(w["cpu_pct"] is not None and w["cpu_pct"] > 5 for w in workers if w["tid"] == w["pid"])
    assert kern


def test_the_classify_cache_keeps_only_the_window(tmp_path):
    """The processor's cache of classified stacks must not keep samples older than its window
    alive (an hour-long session grew by ~15 MiB before this)."""
    from gputop.derive.threads import ThreadStateProcessor
    from gputop.session.replay import ReplaySession
    import pathlib

    rec = pathlib.Path(__file__).parent / "data" / "h200" / "input_bound.gtrec"
    proc = ThreadStateProcessor()
    s = ReplaySession(str(rec), processors=[proc], start_playing=False, seek_window_s=0.0)
    s.play_to(s.t_end)
    oldest = min(sample.t for sample, _ in proc._cache._d.values())
    assert oldest >= s.position - proc.horizon_s - 0.001
