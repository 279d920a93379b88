"""The stack source against real processes and the real py-spy (CI runs as root: ptrace works)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

from gputop.model import KIND_HEALTH
from gputop.sources import stacks
from gputop.sources.stacks import (KIND_STACKS, KIND_THREAD_KERNEL, KernelSampler, PythonInfo, StackSource,
                                   SyscallTable, WAIT_CLASSES, classify_syscall, find_pyspy, fold_speedscope,
                                   parse_python_name, pyspy_version)
from gputop.sources.target import Target

from stacks_helpers import Clock, Proc, wait_for, workload

pytestmark = pytest.mark.timeout(90)
DATA = pathlib.Path(__file__).resolve().parent / "data" / "pyspy"


@pytest.fixture
def procs():
    started: list[Proc] = []

    def start(args, **kw) -> Proc:
        p = Proc(args, **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def run_source(src: StackSource, seconds: float, until=None) -> list:
    got: list = []
    src.start(got.append)
    try:
        if until is not None:
            wait_for(lambda: until(got), seconds)
        else:
            time.sleep(seconds)
    finally:
        src.stop()
    return got


def health(got) -> list[dict]:
    return [s.data for s in got if s.kind == KIND_HEALTH and s.key == "stacks"]


# -- py-spy and the target -------------------------------------------------------------------

def test_pyspy_is_found_and_new_enough():
    path = find_pyspy()
    assert path and os.access(path, os.X_OK)
    v = pyspy_version(path)
    assert v is not None and v >= stacks.MIN_PYSPY


def test_python_names_and_free_threaded_builds():
    assert parse_python_name("python3.11") == ("3.11", False)
    assert parse_python_name("libpython3.12.so.1.0") == ("3.12", False)
    assert parse_python_name("libpython3.13t.so.1.0") == ("3.13", True)
    assert parse_python_name("python3.13t") == ("3.13", True)
    assert parse_python_name("python3.8m") == ("3.8", False)
    assert parse_python_name("bash") is None
    assert parse_python_name("libpthread.so.0") is None


def test_python_info_finds_the_runtime(procs):
    p = procs(["-c", "import time, json, os; print(json.dumps({'pid': os.getpid()}), flush=True); time.sleep(60)"])
    p.first()
    info = PythonInfo(p.pid)
    assert info.python and not info.free_threaded
    assert info.version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert info.runtime_ranges, "the interpreter's writable data segment must be found"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        other = PythonInfo(sleeper.pid)
        assert not other.python and other.runtime_ranges == []
    finally:
        sleeper.kill()
        sleeper.wait()


def test_syscall_lines_are_classified():
    t = SyscallTable("x86_64")
    ranges = [(0x1000, 0x2000)]
    cls = lambda raw: WAIT_CLASSES[classify_syscall(raw, ranges, t)]  # noqa: E731
    assert cls(b"running\n") == "run"
    assert cls(b"202 0x1800 0x89 0x0 0x7ffd 0x0 0xffffffff 0x7ffd 0x7f00") == "gil"
    assert cls(b"202 0x55aa00 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f00") == "lock"
    assert cls(b"230 0x1 0x0 0x7ffd 0x7ffd 0x0 0x0 0x7ffd 0x7f00") == "sleep"
    assert cls(b"7 0x7ffd 0x1 0xffffffff 0x0 0x0 0x0 0x7ffd 0x7f00") == "poll"
    assert cls(b"0 0x3 0x7ffd 0x1 0x0 0x0 0x0 0x7ffd 0x7f00") == "io"
    assert cls(b"-1 0x7ffd 0x7f00\n") == "other"
    assert WAIT_CLASSES[classify_syscall(b"202 0x1800 0x89", [], t)] == "lock"  # runtime unknown
    arm = SyscallTable("aarch64")
    assert WAIT_CLASSES[classify_syscall(b"98 0x1800 0x89", ranges, arm)] == "gil"
    assert WAIT_CLASSES[classify_syscall(b"202 0x1800 0x89", ranges, arm)] == "io"  # accept there


def test_kernel_sampler_sees_each_kind_of_wait(procs):
    """Real threads blocked in known ways: the kernel sampler must put each in its class,
    and the spinner/main pair must show GIL waits (futex on the runtime's data)."""
    p = procs(workload("stacks_scenes.py", "waits"))
    threads = p.first()["threads"]
    ks = KernelSampler()
    ks.refresh([p.pid], 0.0)
    for _ in range(150):
        ks.tick()
        time.sleep(0.004)
    rows = {row[0]: dict(zip(stacks.KERNEL_COLUMNS, row)) for row in ks.harvest(1.0)[0][1]["threads"]}

    def top(name):
        r = rows[threads[name]]
        return max(WAIT_CLASSES, key=lambda c: r[c])

    assert top("sleeper") == "sleep"
    assert top("lock_acquire") == "lock"
    assert top("queue_get") == "lock" and top("event_wait") == "lock"
    assert top("select") == "poll"
    assert top("pipe_read") == "io"
    assert top("socket_accept") in ("io", "poll")
    main, spin = rows[threads["main"]], rows[threads["spinner"]]
    for r in (main, spin):
        assert r["gil"] > 10, r        # they take turns on the GIL
        assert r["lock"] + r["sleep"] + r["poll"] + r["io"] <= 3, r
    assert rows[threads["sleeper"]]["gil"] <= 3
    assert main["cpu_s"] is not None and main["cpu_s"] > 0


# -- the source end to end ---------------------------------------------------------------------

def test_source_publishes_stacks_kernel_and_health(procs):
    p = procs(workload("stacks_gil.py", "--spinners", "1", "--sleeper"))
    p.first()
    src = StackSource(Clock(), Target(p.pid), rate_hz=20, window_s=1)
    got = run_source(src, 15, until=lambda g: sum(s.kind == KIND_STACKS for s in g) >= 2
                     and any(s.kind == KIND_HEALTH and s.data.get("rate_hz") for s in g))
    st = [s for s in got if s.kind == KIND_STACKS]
    assert len(st) >= 2 and all(s.key == str(p.pid) for s in st)
    d = st[-1].data
    assert d["main"] is True and 0.5 < d["dur_s"] < 2.5 and d["rate_hz"] in range(18, 23)
    names = {th["name"] for th in d["threads"]}
    assert {"MainThread", "spinner0", "sleeper"} <= names
    funcs = {f[0] for f in d["frames"]}
    assert {"spinner", "sleeper"} <= {f.rpartition(".")[2] for f in funcs}
    sleeper = next(th for th in d["threads"] if th["name"] == "sleeper")
    leaf = sleeper["stacks"][0][1][-1]
    assert "time.sleep(nap)" in d["code"][str(leaf)], "the leaf line's source text is recorded"
    assert sum(c for c, _ in sleeper["stacks"]) == sleeper["n"] > 5
    kern = [s for s in got if s.kind == KIND_THREAD_KERNEL]
    assert kern and kern[-1].data["gil_known"] is True and kern[-1].data["python"] is True
    h = health(got)
    assert h and h[-1]["state"] == "ok" and h[-1]["rate_hz"] > 10
    assert h[-1]["pyspy_version"] and h[-1]["restarts"] == 0
    json.dumps([s.data for s in got])  # everything is JSON-able


@pytest.mark.parametrize("worker", [True, False], ids=["dataloader-worker", "other-child"])
def test_children_are_sampled_in_subprocess_windows(procs, worker):
    """A child named like a torch DataLoader worker (torch sets the name with prctl, as here) is
    sampled in every Nth window; any other Python child (a rank) in every window."""
    name = "import ctypes; ctypes.CDLL(None).prctl(15, b'pt_data_worker', 0, 0, 0)\n    " if worker else ""
    code = ("import multiprocessing as mp, os, time, json\n"
            f"def work():\n    {name}while True: sum(range(1000))\n"
            "if __name__ == '__main__':\n"
            "    c = mp.get_context('fork').Process(target=work, daemon=True); c.start()\n"
            "    print(json.dumps({'pid': os.getpid(), 'child': c.pid}), flush=True)\n"
            "    while True: time.sleep(0.1)\n")
    p = procs(["-c", code])
    child = p.first()["child"]
    time.sleep(0.3)
    src = StackSource(Clock(), Target(p.pid), rate_hz=20, window_s=1, subprocess_every=3)
    got = run_source(src, 20, until=lambda g: sum(s.kind == KIND_STACKS and s.key == str(p.pid) for s in g) >= 4)
    main_windows = [s for s in got if s.kind == KIND_STACKS and s.key == str(p.pid)]
    child_windows = [s for s in got if s.kind == KIND_STACKS and s.key == str(child)]
    assert child_windows, "the child process's stacks come in --subprocesses windows"
    if worker:
        assert any(not s.data["subprocesses"] for s in main_windows), "workers do not cost every window"
        assert len(child_windows) < len(main_windows)
    else:
        assert all(s.data["subprocesses"] for s in main_windows[1:]), "another Python child: every window"
    c = child_windows[-1]
    assert c.data["main"] is False
    assert any(f[0] == "work" for f in c.data["frames"])
    assert any(s.kind == KIND_THREAD_KERNEL and s.key == str(child) for s in got)


def test_fold_keeps_counts_and_drops_pseudo_frames():
    doc = json.loads((DATA / "waits.speedscope.json").read_text())
    meta = json.loads((DATA / "waits.meta.json").read_text())
    procs_ = fold_speedscope(doc, meta["pid"])
    assert list(procs_) == [meta["pid"]]
    data = procs_[meta["pid"]]
    total = sum(len(p["samples"]) for p in doc["profiles"])
    assert sum(th["n"] for th in data["threads"]) == total
    for th in data["threads"]:
        assert sum(c for c, _ in th["stacks"]) == th["n"]
    assert not any(f[0].startswith(("process ", "thread (")) for f in data["frames"])
    assert {th["tid"] for th in data["threads"]} == set(meta["threads"].values())


# -- failure modes: one clear line, the rest keeps working -------------------------------------

def test_missing_pyspy_says_how_to_install(procs, tmp_path):
    p = procs(workload("stacks_gil.py", "--sleeper"))
    p.first()
    src = StackSource(Clock(), Target(p.pid), pyspy=str(tmp_path / "py-spy"))
    got = run_source(src, 10, until=lambda g: any(s.kind == KIND_THREAD_KERNEL for s in g) and health(g))
    h = health(got)[-1]
    assert h["state"] == "failed" and "pip install py-spy" in h["message"]
    assert any(s.kind == KIND_THREAD_KERNEL for s in got), "thread states from the kernel still work"
    assert not any(s.kind == KIND_STACKS for s in got)


def test_too_old_pyspy_is_refused(procs, tmp_path):
    old = tmp_path / "py-spy"
    old.write_text("#!/bin/sh\necho 'py-spy 0.3.3'\n")  # stands in for an old install's --version
    old.chmod(old.stat().st_mode | stat.S_IEXEC)
    p = procs(workload("stacks_gil.py", "--sleeper"))
    p.first()
    got = run_source(StackSource(Clock(), Target(p.pid), pyspy=str(old)), 10, until=health)
    h = health(got)[-1]
    assert h["state"] == "failed" and "0.3.3 is too old" in h["message"] and "pip install -U py-spy" in h["message"]


def test_not_python_target_says_so():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        got = run_source(StackSource(Clock(), Target(sleeper.pid)), 10,
                         until=lambda g: any(s.kind == KIND_THREAD_KERNEL for s in g) and health(g))
    finally:
        sleeper.kill()
        sleeper.wait()
    h = health(got)[-1]
    assert h["state"] == "off" and "not a Python program" in h["message"] and "sleep" in h["message"]
    k = [s for s in got if s.kind == KIND_THREAD_KERNEL]
    assert k and k[-1].data["python"] is False and k[-1].data["gil_known"] is False


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv to drop CAP_SYS_PTRACE")
def test_ptrace_not_permitted_says_what_to_do(procs):
    """A non-dumpable target and a gputop without CAP_SYS_PTRACE: the kernel refuses py-spy
    (and /proc/PID/task/*/syscall) exactly as for another user's process."""
    code = ("import ctypes, os, json, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"
            "print(json.dumps({'pid': os.getpid()}), flush=True)\nwhile True: time.sleep(0.05)\n")
    p = procs(["-c", code])
    p.first()
    runner = (
        "import json, sys, time\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from stacks_helpers import Clock\n"
        "from gputop.sources.stacks import StackSource\nfrom gputop.sources.target import Target, TargetError\n"
        "class T:\n    pid = int(sys.argv[1])\n    def tree_pids(self, max_age_s=0): return {self.pid}\n"
        "    def alive(self): return True\n"
        "got = []\nsrc = StackSource(Clock(), T(), window_s=1)\nsrc.start(got.append)\n"
        "end = time.time() + 15\n"
        "while time.time() < end and not any(s.kind == 'health' and s.data['state'] == 'failed' for s in got): time.sleep(0.1)\n"
        "time.sleep(1.5)\nsrc.stop()\n"
        "print(json.dumps([[s.kind, s.data] for s in got if s.kind in ('health', 'thread_kernel')]))\n")
    out = subprocess.run(["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace",
                          sys.executable, "-c", runner, str(p.pid), str(pathlib.Path(__file__).parent)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    failed = [d for k, d in got if k == "health" and d["state"] == "failed"]
    assert failed, got
    msg = failed[-1]["message"]
    assert "ptrace not permitted" in msg and "kernel.yama.ptrace_scope" in msg and "SYS_PTRACE" in msg
    kern = [d for k, d in got if k == "thread_kernel"]
    assert kern and kern[-1]["gil_known"] is False, "no /proc syscall access: GIL wait is unknown, not zero"


def test_pyspy_killed_midway_is_restarted(procs):
    p = procs(workload("stacks_gil.py", "--sleeper"))
    p.first()
    src = StackSource(Clock(), Target(p.pid), window_s=3)
    got: list = []
    src.start(got.append)
    try:
        run = wait_for(lambda: src._run, 10)
        assert run is not None
        os.kill(run.proc.pid, signal.SIGKILL)  # py-spy dies mid-window
        wait_for(lambda: src.restarts >= 1, 10)
        assert src.restarts == 1 and "py-spy" in (src.last_error or "")
        assert wait_for(lambda: any(s.kind == KIND_STACKS for s in got), 15), "sampling resumes after back-off"
    finally:
        src.stop()
    assert any(d["state"] == "failed" and "retry in" in d["message"] for d in health(got))


def test_target_exit_stops_sampling_quietly(procs):
    p = procs(workload("stacks_gil.py", "--sleeper", "--duration", "1.5"))
    p.first()
    got = run_source(StackSource(Clock(), Target(p.pid), window_s=1), 15,
                     until=lambda g: any(d["state"] == "off" for d in health(g)))
    h = health(got)[-1]
    assert h["state"] == "off" and "exited" in h["message"]
    assert not any(d["state"] == "failed" for d in health(got))
