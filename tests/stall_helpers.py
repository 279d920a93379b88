"""Shared by the stall tests: a real job launched with the probe (as `gputop run` does), watched
by a recorded LiveSession with the real sources, the stall detector and the snapshot source."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from gputop.derive.budget_processor import BudgetProcessor
from gputop.derive.stall import StallDetector
from gputop.derive.threads import ThreadStateProcessor
from gputop.session.launch import launch_with_probe
from gputop.session.recording import Recorder, RecordingWriter
from gputop.session.session import LiveSession, SessionClock, base_meta
from gputop.session.store import CallbackSubscriber
from gputop.sources.host import HostSource
from gputop.sources.nvml import NvmlSource
from gputop.sources.probe_client import ProbeClientSource
from gputop.sources.stacks import StackSource
from gputop.sources.stall_snapshot import StallSnapshotSource
from gputop.sources.target import Target
from gputop.verdicts.engine import VerdictEngine

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "workloads" / "stall_train.py"
MIN_S = 2.0       # the detector's floor for these short tests (the default is 10 s)


def marker_line(tag: str) -> int:
    """The line of the workload that carries ``# <tag>``."""
    for i, line in enumerate(WORKLOAD.read_text().splitlines(), 1):
        if re.search(rf"#\s*{tag}\b", line):
            return i
    raise AssertionError(tag)


def run_job(tmp: pathlib.Path, args: list[str], timeout_s: float = 120.0, probe: bool = True,
            min_s: float = MIN_S, factor: float | None = None, idle_s: float | None = None) -> dict:
    """Run the workload to its end under a recorded session; every published sample comes back.
    ``probe=False``: no probe, so the steps are the ones the stacks show; ``idle_s``: the
    detector's idle test (default 30 s)."""
    env = dict(os.environ, GPUTOP_PROBE_DIR=str(tmp / "sock"), OMP_NUM_THREADS="1")
    ticks, events = tmp / "ticks.txt", tmp / "events.jsonl"
    cmd = [sys.executable, str(WORKLOAD), "--ticks", str(ticks), "--events", str(events), *args]
    log = open(tmp / "job.log", "w")
    start = launch_with_probe if probe else subprocess.Popen
    proc = start(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    samples: list = []
    try:
        clock = SessionClock()
        target = Target(proc.pid)
        snapshot = StallSnapshotSource(clock)
        # These tests time the detector with 2-4 s floors against the stack source's 2 s windows
        # and a 2 Hz host (its exit notice must beat a 2 s floor): the scenes run past the
        # source's 20 s warm-up, after which it would use 5 s windows (a stop is then named and
        # cleared up to 3 s later: docs/verdicts.md), and the host's default is 1 Hz.
        sources = [HostSource(clock, target, interval_s=0.5), StackSource(clock, target, steady_window_s=2),
                   NvmlSource(clock, target),
                   ProbeClientSource(clock, target, scan_interval_s=0.5), snapshot]
        meta = base_meta(clock, ["tests/stall"])
        meta["target"] = target.describe()
        rec = tmp / "stall.gtrec"
        kw = {k: v for k, v in (("factor", factor), ("idle_s", idle_s)) if v is not None}
        detector = StallDetector(min_s=min_s, **kw)
        session = LiveSession(sources, clock, meta, recorder=Recorder(RecordingWriter(str(rec), meta)),
                              processors=[ThreadStateProcessor(), BudgetProcessor(), detector,
                                          VerdictEngine()])
        session.bus.subscribe(CallbackSubscriber(samples.extend))
        session.start()
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() == 0, f"the job failed or hung: {(tmp / 'job.log').read_text()[-3000:]}"
        time.sleep(3.0)   # after a normal end: never called stalled
        session.stop()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
    evs = [json.loads(line) for line in events.read_text().splitlines()]
    to_session = lambda t: t - clock.start_monotonic  # noqa: E731  (monotonic -> session time)

    def read_ticks(path: pathlib.Path) -> list[tuple[float, int]]:
        return [(to_session(float(t)), int(n)) for t, n in (ln.split() for ln in path.read_text().splitlines())]

    return {"samples": samples, "events": [{**e, "t": to_session(e["t"])} for e in evs],
            "ticks": read_ticks(ticks) if ticks.exists() else [],
            "rank_ticks": {int(p.suffix[1:]): read_ticks(p) for p in tmp.glob("ticks.txt.*")},
            "recording": rec}


# Every stall job the collected tests need runs at the same time (most of each one's time is
# waiting: start-up, training, the stop, the threshold), each watched by its own session; a test
# module names its jobs in STALL_JOBS = {name: run_job's keyword arguments but tmp} and its
# fixture waits only for its own.
_STARTED: dict[str, Future] = {}
_START_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def stall_job(request, tmp_path_factory, name: str) -> dict:
    """The finished job ``name``; the first call starts every job of every collected module."""
    global _POOL
    with _START_LOCK:
        specs: dict[str, dict] = {}
        modules = (getattr(item, "module", None) for item in request.session.items)   # (a doctest has none)
        for module in dict.fromkeys(m for m in modules if m is not None):
            specs.update(getattr(module, "STALL_JOBS", {}))
        specs.update(getattr(request.module, "STALL_JOBS", {}))
        todo = {n: spec for n, spec in specs.items() if n not in _STARTED}
        if todo:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(8, thread_name_prefix="stall-job")
            for n, spec in todo.items():
                _STARTED[n] = _POOL.submit(run_job, tmp_path_factory.mktemp(n), **spec)
    return _STARTED[name].result()


def of_kind(samples, kind, key=None):
    return [s for s in samples if s.kind == kind and (key is None or s.key == key)]


def scene(job, name, rank=None):
    """(start, end) session times of one scene of the job (rank 0's by default)."""
    evs = [e for e in job["events"] if e.get("scene") == name and (rank is None or e.get("rank") == rank)]
    start = min(e["t"] for e in evs if e.get("start"))
    end = max(e["t"] for e in evs if e.get("end"))
    return start, end
