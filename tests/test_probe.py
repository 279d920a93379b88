"""The in-process probe, end to end: real training processes (CPU torch), real Unix sockets,
the real monitor (ProbeClientSource). Each test compares the probe with the job's own count.

Slow part: every job imports torch (several seconds on a busy 2-core machine), so one job
(``basic_run``) serves many assertions.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from gputop.derive.steps import off_reason, pool_steps, report_lines, report_section, step_split
from gputop.model import Sample
from gputop.probe import wire
from gputop.session.launch import LaunchError, launch_with_probe, probe_env
from gputop.session.recording import Recorder, RecordingReader, RecordingWriter
from gputop.session.session import LiveSession, SessionClock, base_meta
from gputop.session.store import CallbackSubscriber
from gputop.sources.probe_client import KIND_PROBE_CONFIG, KIND_PROBE_STEP, ProbeClientSource
from gputop.sources.target import Target

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "tests" / "workloads" / "probe_train.py")
NO_TORCH = str(ROOT / "tests" / "workloads" / "probe_no_torch.py")

pytestmark = pytest.mark.timeout(180)


class Collector:
    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.lock = threading.Lock()

    def __call__(self, s: Sample) -> None:
        with self.lock:
            self.samples.append(s)

    def of(self, kind: str, key: str | None = None) -> list[Sample]:
        with self.lock:
            return [s for s in self.samples if s.kind == kind and (key is None or s.key == key)]

    def last(self, kind: str, key: str | None = None) -> Sample | None:
        got = self.of(kind, key)
        return got[-1] if got else None

    def health(self) -> list[dict]:
        return [dict(s.data) for s in self.of("health", "probe")]


def wait_for(cond, timeout: float, what: str, interval: float = 0.05, job: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if job is not None and job.poll() is not None:
            raise AssertionError(f"the job exited (rc {job.returncode}) while waiting for {what}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def env_with_dir(d: Path, **extra) -> dict:
    env = dict(os.environ)
    env[wire.ENV_DIR] = str(d)
    env.pop("GPUTOP_PROBE_ROOT", None)
    env.update(extra)
    return env


def start_client(pid: int, scan: float = 0.25) -> tuple[ProbeClientSource, Collector]:
    col = Collector()
    src = ProbeClientSource(SessionClock(), Target(pid), scan_interval_s=scan)
    src.start(col)
    return src, col


def sockets_in(d: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(d) if n.endswith(".sock"))
    except FileNotFoundError:
        return []


def finish(proc: subprocess.Popen, hold: Path, timeout: float = 60) -> int:
    hold.touch()
    return proc.wait(timeout=timeout)


# ---------------------------------------------------------------------------------------------
# One launched job (`gputop run` path) with forked DataLoader workers, AMP and torch.compile
# noted, two monitors, and a third monitor that stalls and is then killed with SIGKILL.
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def basic_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("basic")
    d, hold, out = tmp / "sock", tmp / "hold", tmp / "out.json"
    steps = 160
    log = open(tmp / "job.log", "w")
    job = launch_with_probe([sys.executable, TRAIN, "--steps", str(steps), "--batch-size", "4", "--sample-ms", "1.5",
                             "--workers", "2", "--mp-context", "fork", "--amp", "--compile-wrap",
                             "--wait-monitor", "90", "--hold-file", str(hold), "--out", str(out)],
                            env=env_with_dir(d), stdout=log, stderr=subprocess.STDOUT)
    res: dict = {"job": job, "dir": d, "steps_wanted": steps, "tmp": tmp}
    try:
        # The first monitor runs inside a recorded live session, as `gputop run --record` would.
        clock = SessionClock()
        target = Target(job.pid)
        a = ProbeClientSource(clock, target, scan_interval_s=0.25)
        meta = base_meta(clock, ["tests/test_probe.py"])
        meta["target"] = target.describe()
        rec_path = tmp / "basic.gtrec"
        session = LiveSession([a], clock, meta, recorder=Recorder(RecordingWriter(str(rec_path), meta)))
        col_a = Collector()
        session.bus.subscribe(CallbackSubscriber(lambda ss: [col_a(s) for s in ss]))
        session.start()
        res["recording"] = rec_path
        wait_for(lambda: a.connected_pids(), 90, "the first monitor to attach", job=job)
        sock_path = wire.socket_path(str(d), job.pid)
        # A monitor that connects and never reads, killed later with SIGKILL mid-stream.
        stalled = subprocess.Popen([sys.executable, "-c",
                                    "import socket,sys,time\n"
                                    "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                                    "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)\n"
                                    "print('attached', flush=True); time.sleep(300)\n", sock_path],
                                   stdout=subprocess.PIPE, text=True)
        assert stalled.stdout.readline().strip() == "attached"
        wait_for(lambda: (s := col_a.last(KIND_PROBE_STEP)) and (s.get("step_total") or 0) >= 40, 60,
                 "40 steps seen by the first monitor")
        res["sockets_mid_run"] = sockets_in(d)
        res["children_mid_run"] = [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
        b, col_b = start_client(job.pid)
        wait_for(lambda: b.connected_pids(), 30, "the second monitor to attach")
        os.kill(stalled.pid, signal.SIGKILL)
        stalled.wait()
        res["killed_at"] = a.clock.now()
        wait_for(out.exists, 90, "the job to finish training", job=job)
        own = json.loads(out.read_text())
        res["own"] = own
        for src, col in ((a, col_a), (b, col_b)):
            wait_for(lambda col=col: (s := col.last(KIND_PROBE_STEP)) and s.get("step_total") == own["steps"], 20,
                     "the last window to arrive")
        res["rc"] = finish(job, hold)
        time.sleep(0.5)
        session.stop()
        b.stop()
        res.update(a=a, col_a=col_a, b=b, col_b=col_b)
        res["sockets_after"] = sockets_in(d)
        log.close()
        res["log"] = (tmp / "job.log").read_text()
        yield res
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_step_batch_and_sample_counts_match_the_job_exactly(basic_run):
    own, col = basic_run["own"], basic_run["col_a"]
    assert basic_run["rc"] == 0, basic_run["log"]
    assert own["steps"] == basic_run["steps_wanted"]
    windows = col.of(KIND_PROBE_STEP, str(own["pid"]))
    last = windows[-1].data
    assert last["step_total"] == own["steps"]
    # The job waited for the monitor before training, so every step sits in a window.
    assert sum(w.get("steps") for w in windows) == own["steps"]
    assert sum(w.get("dropped") or 0 for w in windows) == 0
    assert last["batch_total"] == own["batches"] == own["steps"]
    assert last["sample_total"] == own["samples"] == own["steps"] * 4


def test_step_time_and_data_wait_agree_with_the_jobs_own_timing(basic_run):
    own, col = basic_run["own"], basic_run["col_a"]
    windows = [w for w in col.of(KIND_PROBE_STEP) if w.get("step_n")]
    n = sum(w.get("step_n") for w in windows)
    step_sum = sum(w.get("step_s_sum") for w in windows)
    wait_sum = sum(w.get("data_wait_s_sum") for w in windows)
    assert n == len(own["step_times"]) == own["steps"] - 1
    own_sum = sum(own["step_times"])
    assert step_sum == pytest.approx(own_sum, rel=0.02)
    own_share = sum(own["step_waits"]) / own_sum
    assert wait_sum / step_sum == pytest.approx(own_share, abs=0.03)
    # Two workers at 1.5 ms x 4 samples keep up only partly: the loop waits for data, measurably.
    assert own_share > 0.05
    # Batches/s over the training windows vs the job's own rate.
    busy = [w for w in windows if w.get("window_s") and w.get("steps")]
    assert sum(w.get("batches") for w in busy) >= own["batches"] - 2


def test_config_facts(basic_run):
    own, col = basic_run["own"], basic_run["col_a"]
    cfg = col.last(KIND_PROBE_CONFIG, str(own["pid"])).data
    assert cfg["torch"] == own["torch"]
    assert cfg["cuda"] is None and cfg["cuda_build"] is False
    (loader,) = cfg["loaders"]
    assert loader["num_workers"] == 2 and loader["batch_size"] == 4
    assert loader["pin_memory"] is False and loader["persistent_workers"] is False
    assert loader["prefetch_factor"] == 2
    assert cfg["amp_autocast"] == ["cpu:bfloat16"]
    assert cfg["compile"]["calls"] == 1 and cfg["compile"]["uses"][0]["mode"] == "reduce-overhead"
    assert cfg["optimizer"]["class"] == "SGD" and cfg["optimizer"]["param_dtypes"] == ["float32"]
    # every parameter's elements on the CPU (an optimizer offloaded from a GPU model reads the same)
    assert cfg["optimizer"]["param_devices"] == {"cpu": cfg["optimizer"]["params"]} and cfg["optimizer"]["params"] > 0
    assert cfg["hooks"]["optimizer_step"][0] == "on" and cfg["hooks"]["dataloader"][0] == "on"
    # CPU torch: GPU time and sync counting are cleanly off, with the reason, never a zero.
    assert cfg["hooks"]["cuda_events"][0] == "off" and "no CUDA" in cfg["hooks"]["cuda_events"][1]
    last = col.last(KIND_PROBE_STEP).data
    assert last["gpu_ms_mean"] is None and "no CUDA" in off_reason(cfg, "cuda_events")
    assert last["syncs_per_step"] is None and "no CUDA" in off_reason(cfg, "syncs")
    # no kernel trace unless the job's environment asks for one (it costs the job: kernel_sample.py)
    assert last["kernel_ms_per_step"] is None and "GPUTOP_KERNEL_SAMPLE=1" in last["kernel_off"]
    assert cfg["step_source"] == "optimizer"
    # a training job's model calls are never steps: the forward-steps finder never arms (this job
    # called torch.compile before its first optimizer step: the first reason seen is said)
    state, why = cfg["hooks"]["forward_steps"]
    assert state == "off" and ("optimizer" in why or "torch.compile" in why), why
    assert cfg["float32_matmul_precision"] in ("highest", "high", "medium")


def test_forked_dataloader_workers_open_no_probe(basic_run):
    pid = basic_run["own"]["pid"]
    assert len(basic_run["children_mid_run"]) >= 2, "the job should have had its two workers running"
    assert basic_run["sockets_mid_run"] == [f"{pid}.sock"]
    assert basic_run["a"].describe()["probes"].keys() == {str(pid)}


def test_two_monitors_and_a_monitor_killed_mid_stream(basic_run):
    own = basic_run["own"]
    assert basic_run["rc"] == 0
    for col in (basic_run["col_a"], basic_run["col_b"]):
        assert col.last(KIND_PROBE_STEP).get("step_total") == own["steps"]
    # The first monitor kept receiving windows after the stalled one was killed, up to the
    # job's last step (the probe sends a window a second, so a fast job may end after one).
    after = [s for s in basic_run["col_a"].of(KIND_PROBE_STEP) if s.t > basic_run["killed_at"] + 0.2]
    assert after and after[-1].get("step_total") == own["steps"]
    states = [h["state"] for h in basic_run["col_a"].health()]
    assert "ok" in states


def test_socket_is_removed_when_the_job_exits(basic_run):
    assert basic_run["sockets_after"] == []


def test_probe_samples_record_and_replay_within_budget(basic_run, tmp_path):
    col = basic_run["col_a"]
    probe = [s for s in col.samples if s.kind.startswith("probe_") or s.key == "probe"]
    path = str(tmp_path / "p.gtrec")
    w = RecordingWriter(path, {"gputop_version": "test"})
    by_second: dict[int, list[Sample]] = {}
    for s in probe:
        by_second.setdefault(int(s.t), []).append(s)
    for sec in sorted(by_second):  # one chunk per second, as the Recorder writes
        w.write_samples(by_second[sec])
    w.close({"clean": True})
    with RecordingReader(path) as r:
        back = r.all_samples()
    assert len(back) == len(probe)
    got = [s for s in back if s.kind == KIND_PROBE_STEP]
    want = [s for s in probe if s.kind == KIND_PROBE_STEP]
    assert [s.get("step_total") for s in got] == [s.get("step_total") for s in sorted(want, key=lambda s: s.t)]
    span_min = (max(s.t for s in probe) - min(s.t for s in probe)) / 60
    per_min = os.path.getsize(path) / span_min
    assert per_min < 100_000, f"the probe alone records {per_min / 1e3:.0f} KB/min"


def test_report_section_from_the_run(basic_run):
    own, col = basic_run["own"], basic_run["col_a"]
    sec = report_section(col.samples)
    assert sec["found"] is True
    (rank,) = sec["ranks"]
    assert rank["steps"] == own["steps"] and rank["step_total_at_end"] == own["steps"]
    own_mean_ms = sum(own["step_times"]) / len(own["step_times"]) * 1000
    assert rank["step_ms"]["mean"] == pytest.approx(own_mean_ms, rel=0.02)
    srt = sorted(own["step_times"])
    assert rank["step_ms"]["p50"] == pytest.approx(srt[len(srt) // 2] * 1000, rel=0.1)
    assert rank["data_wait_share"] == pytest.approx(sum(own["step_waits"]) / sum(own["step_times"]), abs=0.03)
    assert rank["gpu_ms_per_step"] is None and "no CUDA" in rank["gpu_info"]
    assert rank["syncs_per_step"] is None
    assert rank["config"]["loaders"][0]["num_workers"] == 2
    json.dumps(sec)  # JSON-able
    text = "\n".join(report_lines(sec))
    assert f"{own['steps']} steps" in text and "num_workers 2" in text and "GPU n/a (this torch has no CUDA" in text
    split = step_split(col.last(KIND_PROBE_STEP).data) or step_split(
        next(s for s in reversed(col.of(KIND_PROBE_STEP)) if s.get("step_ms_mean")).data)
    assert split["gpu_ms"] is None
    assert split["data_wait_ms"] + split["other_ms"] == pytest.approx(split["step_ms"], rel=1e-6)


def test_report_section_without_probe_data_says_why():
    h = Sample(1.0, "health", "probe", {"state": "off", "message": "no probe in PID 1's process tree: ..."})
    sec = report_section([h, Sample(1.0, "gpu", "0", {"sm_active": 1.0})])
    assert sec == {"found": False, "message": "no probe in PID 1's process tree: ...", "ranks": []}
    assert report_lines(sec) == ["probe: no probe in PID 1's process tree: ..."]


def _window(t: float, **d) -> Sample:
    return Sample(t, KIND_PROBE_STEP, "7", d)


def test_one_step_pool_names_what_each_rate_divides_by():
    """An idle start-up window, then two training windows: per observed second, the idle second
    counts; while training (1 / mean step time) it does not. The report's probe and ranks
    sections print the same steps/s; the verdict signals read the same pool."""
    from gputop.derive import ranks
    from gputop.session.store import SampleStore
    from gputop.sources.ranks import KIND_RANK
    from gputop.verdicts.signals import build_signals

    windows = [
        _window(1.0, window_s=1.0, steps=0, step_n=0, step_s_sum=None, batches=0),
        _window(2.0, window_s=1.0, steps=10, step_n=9, step_s_sum=0.9, data_wait_s_sum=0.09, gpu_n=9,
                gpu_s_sum=0.45, syncs=None, batches=10, step_batches=10, samples=320, step_samples=320,
                step_hist={}, step_ms_max=120.0),
        _window(3.0, window_s=1.0, steps=10, step_n=10, step_s_sum=1.0, data_wait_s_sum=0.3, gpu_n=10,
                gpu_s_sum=0.5, syncs=20, batches=10, step_batches=10, samples=320, step_samples=320,
                step_hist={}, step_ms_max=110.0),
    ]
    pool = pool_steps(windows)
    assert (pool.windows, pool.steps, pool.timed_steps) == (3, 20, 19)
    assert pool.observed_s == 3.0 and pool.training_s == 2.0
    assert pool.steps_per_observed_s == pytest.approx(20 / 3)
    assert pool.steps_per_training_s == pytest.approx(19 / 1.9) == pytest.approx(1000 / pool.step_ms_mean)
    assert pool.data_wait_share == pytest.approx(0.39 / 1.9)
    assert pool.gpu_share == pytest.approx((0.95 / 19) / (1.9 / 19))
    assert pool.syncs_per_step == pytest.approx(2.0)            # over the window that counted syncs
    assert pool.syncs_per_timed_step == pytest.approx(20 / 19)  # what the verdict rules read
    assert pool.batches_per_step == 1.0 and pool.step_ms_max == 120.0
    assert pool_steps([]).steps_per_observed_s is None and pool_steps([]).steps_per_training_s is None

    rank = Sample(0.5, KIND_RANK, "7", {"pid": 7, "rank": 0, "state": "running"})
    probe = report_section(windows)["ranks"][0]
    row = ranks.report_section([rank, *windows])["ranks"][0]
    assert probe["steps_per_s"] == row["steps_per_s"] == round(pool.steps_per_training_s, 3)
    assert probe["data_wait_share"] == row["data_wait_share"] == round(pool.data_wait_share, 4)
    assert "steps/s while training" in "\n".join(report_lines(report_section(windows)))

    store = SampleStore()
    store.on_samples(windows)
    sig = build_signals(store, 3.0, window_s=10.0)
    assert sig.get("probe.steps_per_s") == pytest.approx(pool.steps_per_observed_s)
    assert sig.get("probe.step_ms") == pytest.approx(pool.step_ms_mean)
    assert sig.get("probe.syncs_per_step") == pytest.approx(pool.syncs_per_timed_step)


# ---------------------------------------------------------------------------------------------
# `import gputop.probe; gputop.probe.install()` in the script, found by PID; faults.
# ---------------------------------------------------------------------------------------------

def test_installed_by_the_script_with_markers_old_torch_and_a_failing_hook(tmp_path):
    """install() by the script itself (the `gputop --pid` path), marker steps, a torch without
    the optimizer hook, a probe hook that raises, and a second probe in the same process."""
    d, hold, out = tmp_path / "sock", tmp_path / "hold", tmp_path / "out.json"
    err = open(tmp_path / "err.log", "w")
    job = subprocess.Popen([sys.executable, TRAIN, "--install", "--marker", "--old-torch", "--break-hook", "dataloader",
                            "--second-probe", "--steps", "60", "--sample-ms", "0.2", "--wait-monitor", "90",
                            "--hold-file", str(hold), "--out", str(out)], env=env_with_dir(d), stderr=err)
    try:
        src, col = start_client(job.pid)
        wait_for(out.exists, 120, "the job to finish training", job=job)
        own = json.loads(out.read_text())
        wait_for(lambda: (s := col.last(KIND_PROBE_STEP)) and s.get("step_total") == own["steps"], 20, "the last window")
        assert finish(job, hold) == 0
        src.stop()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    err.close()
    stderr = (tmp_path / "err.log").read_text()
    last = col.last(KIND_PROBE_STEP).data
    assert last["step_total"] == own["steps"] == 60
    assert col.last(KIND_PROBE_CONFIG).data["step_source"] == "marker"
    hooks = col.last(KIND_PROBE_CONFIG).data["hooks"]
    assert hooks["optimizer_step"][0] == "unavailable"
    assert "register_optimizer_step_post_hook" in hooks["optimizer_step"][1]
    assert "gputop.probe.step()" in hooks["optimizer_step"][1]
    assert hooks["dataloader"][0] == "failed" and "injected fault" in hooks["dataloader"][1]
    # The failed hook was switched off at its first call: no batches counted, the job unharmed.
    assert last["batch_total"] == 0
    events = [s.get("message") for s in col.of("event", "probe")]
    assert any("hook dataloader failed" in (m or "") for m in events), events
    degraded = [h for h in col.health() if h["state"] == "degraded"]
    assert degraded and "dataloader" in degraded[-1]["message"] and "optimizer_step" in degraded[-1]["message"]
    # A second copy of the probe module in the same process refused itself with one line.
    assert '{"second_probe": false}' in stderr
    assert "another gputop probe is already installed in this process" in stderr
    assert "Traceback" not in stderr


# ---------------------------------------------------------------------------------------------
# Spawned DataLoader workers (a fresh interpreter each: sitecustomize runs in them too).
# ---------------------------------------------------------------------------------------------

def test_spawned_dataloader_workers_stay_dormant(tmp_path):
    d, hold, out = tmp_path / "sock", tmp_path / "hold", tmp_path / "out.json"
    job = launch_with_probe([sys.executable, TRAIN, "--steps", "30", "--workers", "1", "--mp-context", "spawn",
                             "--persistent", "--sample-ms", "0.5", "--hold-file", str(hold), "--out", str(out)],
                            env=env_with_dir(d), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen_sockets: set[str] = set()
    spawned: set[int] = set()
    try:
        src, col = start_client(job.pid)
        deadline = time.monotonic() + 150
        while not out.exists() and time.monotonic() < deadline and job.poll() is None:
            seen_sockets.update(sockets_in(d))
            try:
                for c in psutil.Process(job.pid).children(recursive=True):
                    if "--multiprocessing-fork" in c.cmdline():
                        spawned.add(c.pid)  # the DataLoader worker (not the resource tracker)
            except psutil.Error:
                pass
            time.sleep(0.1)
        assert out.exists(), "the job did not finish"
        own = json.loads(out.read_text())
        seen_sockets.update(sockets_in(d))
        wait_for(lambda: (s := col.last(KIND_PROBE_STEP)) and s.get("step_total") == own["steps"], 20, "the last window")
        assert finish(job, hold) == 0
        src.stop()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert spawned, "the spawned worker should have been seen"
    assert seen_sockets == {f"{job.pid}.sock"}
    assert src.describe()["probes"].keys() == {str(job.pid)}
    assert "Traceback" not in job.stderr.read()


# ---------------------------------------------------------------------------------------------
# torchrun: one probe per rank.
# ---------------------------------------------------------------------------------------------

def test_torchrun_gives_every_rank_a_probe(tmp_path):
    d, hold, out = tmp_path / "sock", tmp_path / "hold", tmp_path / "out.json"
    log = open(tmp_path / "job.log", "w")
    job = launch_with_probe([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             TRAIN, "--ddp", "--steps", "40", "--sample-ms", "0.2", "--hold-file", str(hold),
                             "--out", str(out)],
                            env=env_with_dir(d, OMP_NUM_THREADS="1"), stdout=log, stderr=subprocess.STDOUT)
    try:
        src, col = start_client(job.pid)
        wait_for(lambda: all(Path(f"{out}.{r}").exists() for r in (0, 1)), 170, "both ranks to finish training", job=job)
        own = {r: json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)}

        def ranks_done():
            done = {}
            for s in col.of(KIND_PROBE_STEP):
                if s.get("rank") is not None:
                    done[s.get("rank")] = s.get("step_total")
            return done == {0: own[0]["steps"], 1: own[1]["steps"]}
        wait_for(ranks_done, 30, "both ranks' last windows")
        socks = sockets_in(d)
        assert finish(job, hold) == 0, (tmp_path / "job.log").read_text()
        src.stop()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        log.close()
    rank_pids = {own[r]["pid"] for r in (0, 1)}
    assert {f"{p}.sock" for p in rank_pids} <= set(socks)
    # torchrun itself is the command's first Python process: it has a probe too, with no steps.
    assert f"{job.pid}.sock" in socks and len(socks) == 3
    cfgs = {s.key: s.data for s in col.of(KIND_PROBE_CONFIG)}
    for r in (0, 1):
        c = cfgs[str(own[r]["pid"])]
        assert c["rank"] == r and c["world_size"] == 2 and c["dist_backend"] == "gloo"
    ok = [h for h in col.health() if h["state"] == "ok" and sorted(h["ranks"]) == [0, 1]]
    assert ok and "(rank 0)" in ok[-1]["message"] and "(rank 1)" in ok[-1]["message"]


# ---------------------------------------------------------------------------------------------
# No torch, no probe, stale sockets, a bad socket directory.
# ---------------------------------------------------------------------------------------------

def test_script_that_never_imports_torch(tmp_path):
    d, hold, out = tmp_path / "sock", tmp_path / "hold", tmp_path / "out.txt"
    # A stale socket of a dead process, left in the directory: the probe removes it.
    d.mkdir(mode=0o700)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = d / f"{dead.pid}.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    assert stale.exists()
    job = launch_with_probe([sys.executable, NO_TORCH, str(out), str(hold)], env=env_with_dir(d),
                            stderr=subprocess.PIPE, text=True)
    try:
        src, col = start_client(job.pid)
        wait_for(lambda: any(h["state"] == "degraded" for h in col.health()), 30, "the probe to report")
        wait_for(lambda: not stale.exists(), 10, "the stale socket to be removed")
        assert finish(job, hold) == 0
        src.stop()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert out.read_text().strip() == str(sum(i * i for i in range(200_000)))
    h = [h for h in col.health() if h["state"] == "degraded"][-1]
    assert "torch is not imported" in h["message"] and h["probes"] == [job.pid]
    cfg = col.last(KIND_PROBE_CONFIG).data
    assert cfg["torch"] is None and "not imported" in cfg["torch_info"]
    assert "torch" not in sys.modules or True  # (the monitor itself may import anything)
    assert job.stderr.read() == ""


def test_no_probe_says_what_it_would_add_and_how(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env_with_dir(tmp_path / "sock"))
    try:
        # A stale socket named after the live target: connect is refused, so it is ignored.
        d = tmp_path / "sock"
        d.mkdir(mode=0o700)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(d / f"{proc.pid}.sock"))
        s.close()
        src, col = start_client(proc.pid)
        h = wait_for(lambda: [x for x in col.health() if x["state"] == "off" and "no probe" in x["message"]], 10,
                     "the no-probe health line")[-1]
        src.stop()
    finally:
        proc.kill()
        proc.wait()
    assert h["found"] is False and h["probes"] == []
    assert "gputop run -- python train.py" in h["message"]
    assert "import gputop.probe; gputop.probe.install()" in h["message"]
    assert "data wait" in h["message"] and "syncs" in h["message"]
    assert "stale" in h["message"]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to hand the directory to another user")
def test_socket_directory_owned_by_another_user(tmp_path):
    """Another user made the directory first: the probe listens in its private fallback
    ($HOME/.cache/gputop-probe) and says so in one line; gputop finds it there."""
    d, hold, out = tmp_path / "sock", tmp_path / "hold", tmp_path / "out.txt"
    # a short home: a socket path must fit in 107 bytes, and pytest-xdist's tmp_path made
    # home/.cache/gputop-probe/PID.sock 108 (test_a_fallback_too_long_for_a_socket_is_said)
    home = Path(tempfile.mkdtemp(prefix="gh", dir="/tmp"))
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    job = launch_with_probe([sys.executable, NO_TORCH, str(out), str(hold)], env=env_with_dir(d, HOME=str(home)),
                            stderr=subprocess.PIPE, text=True)
    try:
        src, col = start_client(job.pid)
        h = wait_for(lambda: [x for x in col.health() if x.get("found")], 10, "the probe found in the fallback")[-1]
        assert finish(job, hold) == 0
        src.stop()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert out.exists()
    err = job.stderr.read()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    fallback = home / ".cache" / "gputop-probe"
    assert len(lines) == 1 and "owned by uid 65534" in lines[0] and f"listening in {fallback} instead" in lines[0], err
    assert h["probes"] == [job.pid]
    assert sockets_in(d) == []
    shutil.rmtree(home, ignore_errors=True)


def test_a_fallback_too_long_for_a_socket_is_said(tmp_path):
    """The fallback's socket path would be over 107 bytes (a deep $HOME): the probe said
    "listening in <fallback> instead" and then could not bind there, and that one line was all
    the user saw. Now the one line says why it does not listen, and what to do."""
    d, hold, out = tmp_path / "sock", tmp_path / "hold", tmp_path / "out.txt"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    home = tmp_path / ("h" * 120)
    home.mkdir()
    job = launch_with_probe([sys.executable, NO_TORCH, str(out), str(hold)], env=env_with_dir(d, HOME=str(home)),
                            stderr=subprocess.PIPE, text=True)
    try:
        assert finish(job, hold) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    lines = [ln for ln in job.stderr.read().splitlines() if ln.strip()]
    assert len(lines) == 1 and "not listening" in lines[0] and "listening in" not in lines[0], lines
    assert "is longer than 107 bytes: set GPUTOP_PROBE_DIR to a shorter directory" in lines[0], lines


def test_socket_directory_rules(tmp_path):
    uid = os.getuid()
    good = tmp_path / "good"
    assert wire.ensure_dir(str(good)) is None
    assert (good.stat().st_mode & 0o777) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    assert "mode 0777" in wire.ensure_dir(str(loose))
    link = tmp_path / "link"
    link.symlink_to(good)
    assert "symbolic link" in wire.check_dir(str(link), uid)
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "not a directory" in wire.check_dir(str(afile), uid)
    assert "does not exist" in wire.check_dir(str(tmp_path / "nope"), uid)
    # A symlink where a socket should be is never followed.
    (good / "123.sock").symlink_to(afile)
    assert "not a socket" in wire.check_socket_file(str(good / "123.sock"))


# ---------------------------------------------------------------------------------------------
# Launch errors, environment, wire format, and a peer that is not a probe.
# ---------------------------------------------------------------------------------------------

def test_launch_errors_are_one_line():
    with pytest.raises(LaunchError, match="no command given"):
        launch_with_probe([])
    with pytest.raises(LaunchError, match="command not found: no-such-command-gputop"):
        launch_with_probe(["no-such-command-gputop", "x"])
    with pytest.raises(FileNotFoundError):  # what callers of subprocess.Popen already catch
        launch_with_probe(["/no/such/program"])


def test_probe_env_chains_pythonpath_and_an_existing_sitecustomize(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = probe_env({**os.environ, "PYTHONPATH": str(other), wire.ENV_DIR: str(tmp_path / "sock"),
                     "GPUTOP_PROBE_ROOT": "1"})
    assert env["PYTHONPATH"].split(os.pathsep)[1] == str(other)
    assert "GPUTOP_PROBE_ROOT" not in env
    code = ("import os, sys, gputop.probe as p; st = p.status(); "
            "print(os.environ.get('USER_SITECUSTOMIZE_RAN'), st['installed'], st['listening'], "
            "os.environ['GPUTOP_PROBE_ROOT'] == str(os.getpid()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True", "True", "True"]
    assert out.stderr == ""


def test_wire_lines_are_bounded_and_typed():
    r = wire.LineReader(max_line=64)
    assert r.feed(wire.encode({"type": "x", "v": float("nan")})) == [{"type": "x", "v": None}]
    assert r.feed(b'{"type": "a"}\n{"ty') == [{"type": "a"}]
    assert r.feed(b'pe": "b"}\n') == [{"type": "b"}]
    with pytest.raises(wire.WireError, match="longer than 64"):
        wire.LineReader(max_line=64).feed(b"x" * 100)
    with pytest.raises(wire.WireError, match="not JSON"):
        wire.LineReader().feed(b"\x80garbage\n")
    with pytest.raises(wire.WireError, match="without a type"):
        wire.LineReader().feed(b"[1, 2]\n")
    for secs in (0.0001, 0.005, 0.2, 3.0):
        assert wire.hist_value(wire.hist_bucket(secs)) == pytest.approx(secs, rel=0.05)


@pytest.mark.parametrize("first, expect", [
    (b"GET / HTTP/1.1\n", "not JSON"),
    (b'{"type": "hello", "v": 99, "mono": 1}\n', "wire version 99"),
    (b'{"type": "window", "mono": 1}\n', "first message is not a hello"),
])
def test_a_peer_that_is_not_a_probe_is_dropped_with_one_line(tmp_path, first, expect):
    """A fake probe socket (real listener in this test) for a real child process."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    d = tmp_path / "sock"
    d.mkdir(mode=0o700)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(d / f"{proc.pid}.sock"))
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        c.sendall(first)
        time.sleep(2)
        c.close()
    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        col = Collector()
        src = ProbeClientSource(SessionClock(), Target(proc.pid), probe_dirs=[str(d)], scan_interval_s=0.2)
        src.start(col)
        h = wait_for(lambda: [x for x in col.health() if x["state"] == "failed"], 10, "the failed health line")[-1]
        src.stop()
    finally:
        proc.kill()
        proc.wait()
        srv.close()
    assert expect in h["message"]
    assert src.connected_pids() == []


# ---------------------------------------------------------------------------------------------
# The UI: the recording of the basic run, replayed in the app.
# ---------------------------------------------------------------------------------------------

def _screen(app) -> str:
    import io

    from rich.console import Console
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def _run_app(session, size, keys=()):
    import asyncio

    from gputop.ui.app import GputopApp

    async def go():
        async with GputopApp(session).run_test(size=size) as pilot:
            await pilot.pause()
            for k in keys:
                await pilot.press(k)
                await pilot.pause()
            return _screen(pilot.app), pilot.app
    return asyncio.run(go())


def _steps_view_key() -> str:
    from gputop.ui import panels
    panels.load_panel_modules()
    return str([v.id for v in panels.views()].index("steps") + 1)


def test_probe_panels_in_the_replayed_recording(basic_run):
    from gputop.session.replay import ReplaySession
    own = basic_run["own"]
    session = ReplaySession(str(basic_run["recording"]), start_playing=False)
    # A moment in the middle of training.
    steps = [s for s in RecordingReader(str(basic_run["recording"])).all_samples()
             if s.kind == KIND_PROBE_STEP and s.get("step_ms_mean")]
    mid = steps[len(steps) // 2]
    session.seek(mid.t + 0.01)
    text, _ = _run_app(session, (100, 30))
    if os.environ.get("GPUTOP_SHOW_SCREENS"):
        print(text)
    lines = text.splitlines()
    line = next(ln for ln in lines if ln.strip().startswith(f"PID {own['pid']}") or "steps/s" in ln)
    assert "steps/s" in line and "data wait" in line and "other" in line, text
    assert f"{mid.get('steps_per_s'):.1f}" in line or f"{mid.get('steps_per_s'):.0f}" in line
    assert "GPU" not in line  # no CUDA here: the split has two parts, not a GPU share of zero
    text, app = _run_app(ReplaySession(str(basic_run["recording"]), start_playing=False), (110, 40),
                         keys=["end", _steps_view_key()])
    flat = " ".join(text.split())
    assert f"PID {own['pid']}" in flat and f"{own['steps']} steps (optimizer.step)" in flat
    assert "GPU n/a (this torch has no CUDA" in flat
    assert "syncs n/a (this torch has no CUDA" in flat
    assert "num_workers 2" in flat and "pin_memory False" in flat and "prefetch_factor 2" in flat
    assert "cpu:bfloat16 autocast" in flat and "torch.compile 1 call(s) (reduce-overhead)" in flat
    assert f"torch {own['torch']}" in flat and "optimizer SGD" in flat
    if os.environ.get("GPUTOP_SHOW_SCREENS"):
        print(text)


def test_steps_view_without_a_probe_says_so():
    from gputop.session.replay import ReplaySession
    fixture = ROOT / "tests" / "data" / "host_cpu_demo.gtrec"
    text, _ = _run_app(ReplaySession(str(fixture), start_playing=False), (100, 30), keys=[_steps_view_key()])
    assert "no probe data: this session has no probe source" in " ".join(text.split())


def test_a_job_that_asks_for_kernel_samples_gets_cupti_finalized_after_each():
    """GPUTOP_KERNEL_SAMPLE=1: the probe, loaded before the job's code, sets TEARDOWN_CUPTI=1 for
    kineto (without it a traced job stayed 17-51% slower once the trace stopped, on an H100), and
    leaves a value the job chose; without the opt-in it sets nothing."""
    from gputop.probe.kernel_sample import union_ns

    show = [sys.executable, "-c", "import os; print(os.environ.get('TEARDOWN_CUPTI'))"]
    for extra, want in (({"GPUTOP_KERNEL_SAMPLE": "1"}, "1"), ({"GPUTOP_KERNEL_SAMPLE": "1", "TEARDOWN_CUPTI": "0"}, "0"),
                        ({"GPUTOP_KERNEL_SAMPLE": "true"}, "1"), ({"GPUTOP_KERNEL_SAMPLE": "0"}, "None"), ({}, "None")):
        env = {k: v for k, v in os.environ.items() if k not in ("GPUTOP_KERNEL_SAMPLE", "TEARDOWN_CUPTI")}
        job = launch_with_probe(show, env={**env, **extra}, stdout=subprocess.PIPE, text=True)
        out, _ = job.communicate(timeout=60)
        assert out.strip().splitlines()[-1] == want, (extra, out)
    # the kernels' time is the union of their intervals: overlapping kernels (two streams) once
    assert union_ns([(0, 10), (5, 20), (30, 40), (32, 35)]) == 30 and union_ns([]) == 0
    # back to back: a gap under GPU_GAP_MERGE_NS is the GPU's own (busy); a longer one, which the
    # host left, counts as the GPU's own gap (GPU_GAP_NS), as a CUDA graph of the kernels would leave
    from gputop.probe.kernel_sample import GPU_GAP_MERGE_NS, GPU_GAP_NS, floor_ns
    graph = [(i * 1400, i * 1400 + 1000) for i in range(100)]            # 0.4 us apart: a graph's replay
    assert floor_ns(graph) == 99 * 1400 + 1000 == union_ns([(0, 99 * 1400 + 1000)])
    eager = [(i * 10_000, i * 10_000 + 1000) for i in range(100)]        # 9 us apart: launched from Python
    assert union_ns(eager) == 100_000 and floor_ns(eager) == 100_000 + 99 * GPU_GAP_NS
    assert floor_ns([(0, 10), (5, 20), (20 + GPU_GAP_MERGE_NS, 30 + GPU_GAP_MERGE_NS)]) == 20 + GPU_GAP_NS + 10
    assert floor_ns([]) == 0


def test_the_kernel_sampler_sees_a_profiler_another_thread_started_and_never_leaves_one_on():
    """Two profilers at once crashed a process: the sampler (on the probe thread) must see one the
    job's thread started (torch's per-thread flag does not), and after a trace that failed it must
    switch its own off."""
    import threading

    import torch

    from gputop.probe.kernel_sample import _disable_if_on, _profiler_on, _span

    started, release = threading.Event(), threading.Event()

    def job():
        with torch.autograd.profiler.profile():
            started.set()
            release.wait(30)

    t = threading.Thread(target=job)
    t.start()
    try:
        assert started.wait(30)
        assert _profiler_on(torch)
    finally:
        release.set()
        t.join(30)
    assert not _profiler_on(torch)
    # a trace this thread started and never stopped (its stop raised) is switched off
    prof = torch.autograd.profiler.profile()
    prof.__enter__()
    assert torch._C._autograd._profiler_enabled()
    _disable_if_on(torch)
    assert not torch._C._autograd._profiler_enabled() and not _profiler_on(torch)

    class OldEvent:   # a torch whose kineto events count in microseconds
        def start_us(self):
            return 7

        def duration_us(self):
            return 3
    assert _span(OldEvent()) == (7000, 10000)


def test_a_kernel_trace_window_ends_on_a_step_boundary_for_short_and_long_steps():
    """The trace runs from a step boundary to another: 10 steps and 0.3 s at least, 2 s and then
    the next boundary at most. A loop of 0.29 s steps (a GPT-2 under Accelerate) must still end
    on a boundary (it never did while the wait stopped at 2 s), a fast loop stops soon after its
    10 steps, and a loop that stops stepping is not counted."""
    from gputop.probe import kernel_sample as ks

    class Steps:
        step_total = 0

    def run(step_s: float, steps: int | None) -> tuple[bool, int, float]:
        p, stop, done = Steps(), threading.Event(), threading.Event()

        def loop():
            n = 0
            while not done.is_set() and (steps is None or n < steps):
                time.sleep(step_s)
                p.step_total += 1
                n += 1

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        # as the sampler does: start just after a boundary
        while p.step_total == 0:
            time.sleep(0.001)
        t_on, n0 = time.monotonic(), p.step_total
        ended = ks.wait_window(p, stop, t_on)
        took, n = time.monotonic() - t_on, p.step_total - n0
        done.set()
        t.join(5)
        return ended, n, took

    ended, n, took = run(0.29, None)
    assert ended and 7 <= n <= 11 and took <= ks.MAX_WINDOW_S + ks.END_WAIT_S, (n, took)
    ended, n, took = run(0.005, None)
    assert ended and n >= ks.MIN_STEPS and ks.WINDOW_S <= took < 1.0, (n, took)
    ended, n, took = run(0.1, 3)          # three steps (the first one the start's boundary), then none
    assert not ended and n == 2 and took >= ks.MAX_WINDOW_S + ks.END_WAIT_S - 0.05, (n, took)


def test_the_kernel_trace_keeps_clear_of_cuda_graph_captures():
    """Stopping a trace synchronizes the device from the probe's thread, which a CUDA graph capture
    in torch's default mode does not survive: where the job asked for kernel traces, the probe
    notes the captures the job makes itself (torch.cuda.graph, make_graphed_callables) and takes
    no trace during one or within a minute of one. No GPU here: the hook is installed on the real
    torch.cuda.graphs.CUDAGraph, a capture that fails (no CUDA) leaves nothing open, and the
    install is undone; without the opt-in nothing is patched."""
    import types
    import weakref

    import torch

    from gputop.probe import kernel_sample as ks
    from gputop.probe.torch_hooks import TorchHooks

    cls = torch.cuda.graphs.CUDAGraph
    orig = cls.capture_begin, cls.capture_end
    hooks_said = {}
    probe = types.SimpleNamespace(kernel_sampler=types.SimpleNamespace(on=False),
                                  set_hook=lambda name, state, msg="": hooks_said.__setitem__(name, state))
    hooks = TorchHooks.__new__(TorchHooks)
    hooks.probe, hooks.torch, hooks._undo, hooks.last_capture_t = probe, torch, [], None
    hooks.open_graphs = weakref.WeakSet()
    hooks._install_graph_capture()
    assert (cls.capture_begin, cls.capture_end) == orig and "graph_capture" not in hooks_said   # not asked for
    probe.kernel_sampler.on = True
    hooks._install_graph_capture()
    try:
        assert cls.capture_begin is not orig[0] and hooks_said["graph_capture"] == "on"
        assert not ks._captured_lately(hooks)
        with pytest.raises(Exception):
            cls.capture_begin(object())        # (no CUDA: the capture itself fails)
        assert hooks.captures_open == 0 and hooks.last_capture_t is not None
        assert ks._captured_lately(hooks)      # ... and a trace waits CAPTURE_QUIET_S after it
        hooks.last_capture_t -= ks.CAPTURE_QUIET_S + 1
        assert not ks._captured_lately(hooks)
        class Graph:
            pass
        g = Graph()
        hooks.open_graphs.add(g)               # one under way: never
        assert hooks.captures_open == 1 and ks._captured_lately(hooks)
        hooks.last_capture_t -= ks.CAPTURE_QUIET_S + 1
        del g                                  # a capture begun and dropped, never ended: counts no more
        assert hooks.captures_open == 0 and not ks._captured_lately(hooks)
    finally:
        for undo in reversed(hooks._undo):
            undo()
    assert (cls.capture_begin, cls.capture_end) == orig


def test_the_kernel_samplers_schedule_a_capture_during_a_trace_and_pauses():
    """The sampler's decisions around a trace, on a real stepping thread. The profiler is a
    stand-in (CUPTI needs a GPU, which CI has not; the real one ran on H100s, docs/benchmarks.md
    "Sixth session of 2026-12-06"): a trace over whole steps gives the kernels' union per step; a
    CUDA graph capture the job begins during a trace leaves it uncounted, drops the sample and
    tries again in a minute; a pause in stepping is tried again 30 s later, three times, then in
    10 minutes."""
    import types

    from gputop.probe import kernel_sample as ks

    entered = threading.Event()

    class Event:
        def __init__(self, name, start, dur):
            self._n, self._s, self._d = name, start, dur

        def device_type(self):
            return "CUDA"

        def name(self):
            return self._n

        def start_ns(self):
            return self._s

        def duration_ns(self):
            return self._d

        def device_index(self):
            return 0

    class Profile:
        def __init__(self, **kw):
            pass

        def __enter__(self):
            entered.set()
            return self

        def __exit__(self, *a):
            # 10 ms of kernels (two overlapping, once), a copy that is not a kernel
            self.kineto_results = types.SimpleNamespace(events=lambda: [
                Event("gemm", 0, 8_000_000), Event("relu", 6_000_000, 4_000_000), Event("Memcpy HtoD", 0, 5)])

    torch = types.SimpleNamespace(
        version=types.SimpleNamespace(cuda="12.8"),
        autograd=types.SimpleNamespace(profiler=types.SimpleNamespace(profile=Profile, _is_profiler_enabled=False),
                                       DeviceType=types.SimpleNamespace(CUDA="CUDA")),
        _C=types.SimpleNamespace(_autograd=types.SimpleNamespace(_profiler_enabled=lambda: False)))
    hooks = types.SimpleNamespace(compile_count=0, captures_open=0, last_capture_t=None)
    p = types.SimpleNamespace(step_total=0, monitoring=True, cuda_events_on=True, cuda_device=0, torch=torch,
                              torch_hooks=hooks, _stop=threading.Event(), hook_failed=lambda n, e: None)
    stepping, done = threading.Event(), threading.Event()
    stepping.set()

    def train():
        while not done.is_set():
            time.sleep(0.01)
            if stepping.is_set():
                p.step_total += 1

    threading.Thread(target=train, daemon=True).start()
    s = ks.KernelSampler(p)
    s.on = True
    try:
        now = time.monotonic()
        s._sample(now)
        r = s.message(time.monotonic())
        assert r["off"] is None and r["steps"] >= ks.MIN_STEPS and abs(r["ms_per_step"] - 10.0 / r["steps"]) < 1e-3, r
        assert s.last_at == now
        # a capture begun during the trace
        entered.clear()

        def capture():
            entered.wait(5)
            time.sleep(0.05)
            hooks.last_capture_t = time.monotonic()

        threading.Thread(target=capture, daemon=True).start()
        now = time.monotonic()
        s._sample(now)
        assert s.result is None and "captured a CUDA graph during the trace" in s.off
        assert s.next_at == now + ks.CAPTURE_QUIET_S
        # ... and within CAPTURE_QUIET_S of it, no trace
        entered.clear()
        s._sample(time.monotonic())
        assert not entered.is_set() and "captured a CUDA graph in the last" in s.off
        hooks.last_capture_t = None
        # a pause in stepping: 30 s, three times, then EVERY_S
        stepping.clear()
        for i in range(ks.PAUSE_RETRIES + 1):
            now = time.monotonic()
            s.next_at = now + ks.EVERY_S     # (as tick sets it before each try)
            s._sample(now)
            assert "no step boundary" in s.off
            want = ks.PAUSE_RETRY_S if i < ks.PAUSE_RETRIES else ks.EVERY_S
            assert s.next_at == now + want, (i, s.next_at - now)
    finally:
        done.set()
