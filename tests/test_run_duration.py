"""`gputop run --headless --duration S` and the end of the job it started (issue 31 items 1, 2,
9a and 9d): the duration ends the job and all it started (SIGTERM to its process group, SIGKILL
after the grace period) unless --keep-running, the report comes last on a clean stdout, a failed
job's exit status is gputop's, and the stop command gputop suggests leaves nothing behind.
Real processes; XDG_* and TMPDIR point into tmp_path."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
from run_helpers import alive, private_home

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A job with a "DataLoader worker" of its own (a forked child that outlives its parent's SIGTERM,
# as one does), both printing to stdout; the worker writes its PID to argv[1].
JOB = r"""
import multiprocessing as mp, os, sys, time
def worker(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    while True:
        print("job-worker-line", flush=True)
        time.sleep(0.1)
if __name__ == "__main__":
    mp.get_context("fork").Process(target=worker, args=(sys.argv[1],)).start()
    while True:
        print("job-main-line", flush=True)
        time.sleep(0.1)
"""

DEAF_TO_SIGTERM = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "while True:\n print('job-deaf-line', flush=True)\n time.sleep(0.1)")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    return private_home(tmp_path, monkeypatch)


def gone(pid: int, within_s: float = 2.0) -> bool:
    end = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def kill(*pids: int | None) -> None:
    for pid in pids:
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def pid_in(path: pathlib.Path, within_s: float = 30.0) -> int | None:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if path.exists():
            return int(path.read_text())
        time.sleep(0.05)
    return None


def job_pid_of(err: str) -> int | None:
    m = re.search(r"watching PID (\d+)", err)
    return int(m[1]) if m else None


def gputop_run(home, *args, timeout=40):
    """gputop run with stdout a pipe (as `| tail -3`: it closes only once every writer is gone)
    and stderr a file. Returns (returncode or None on timeout, stdout, stderr, seconds)."""
    err = open(home / "err.txt", "w")
    try:
        p = subprocess.Popen([sys.executable, "-m", "gputop", "run", *args], stdout=subprocess.PIPE, stderr=err,
                             stdin=subprocess.DEVNULL, text=True)
    finally:
        err.close()
    t0 = time.monotonic()
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        return None, out, (home / "err.txt").read_text(), time.monotonic() - t0
    return p.returncode, out, (home / "err.txt").read_text(), time.monotonic() - t0


@pytest.mark.parametrize("json_report", [False, True])
def test_the_duration_ends_the_job_and_all_it_started_and_the_report_comes_last(home, json_report):
    """Item 1: `gputop run --headless --duration 3 -- python job.py | tail -3` took the job's
    whole life and showed the job's lines; now the job and its worker end with the duration
    (the pipe closes at once), stdout ends with the report (with --json: holds it alone)."""
    wpid_file = home / "worker.pid"
    rc, out, err, took = gputop_run(home, "--headless", "--duration", "3", "--no-stacks",
                                    *(["--json"] if json_report else []), "--record", str(home / "r.gtrec"),
                                    "--", sys.executable, "-c", JOB, str(wpid_file))
    job, worker = job_pid_of(err), pid_in(wpid_file, 1)
    try:
        assert rc == 0, (rc, err[-2000:])
        assert took < 20, took
        assert job and worker and gone(job) and gone(worker), (job, worker, err)
        assert f"the run command (PID {job}) was stopped by gputop (SIGTERM to its process group)" in err, err
        assert "goes on running" not in err
        if json_report:
            assert json.loads(out)["session"]["clean_end"]  # stdout is the report alone
            assert "job-main-line" in err and "job-worker-line" in err
        else:
            lines = out.splitlines()
            start = next(i for i, ln in enumerate(lines) if ln.startswith("gputop report"))
            assert start > 0 and not any(ln.startswith("job-") for ln in lines[start:]), out[-3000:]
            assert "job-main-line" in lines[:start] and "job-worker-line" in lines[:start]
        # the report's line about the job comes before "recorded to" and the report
        assert err.index("was stopped by gputop") < err.index("gputop: recorded to")
    finally:
        kill(job, worker)


def test_a_job_deaf_to_sigterm_gets_sigkill_after_the_grace_period_and_that_is_no_failure(home):
    """Item 1's grace period (5 s, run --help) and item 2's rule: gputop's own stop is no failure."""
    rc, out, err, took = gputop_run(home, "--headless", "--duration", "2", "--no-stacks", "--json",
                                    "--record", str(home / "r.gtrec"), "--", sys.executable, "-c", DEAF_TO_SIGTERM)
    job = job_pid_of(err)
    try:
        assert rc == 0, (rc, err[-2000:])
        assert job and gone(job)
        assert f"(PID {job}) was stopped by gputop (SIGKILL: it was still running 5 s after SIGTERM)" in err, err
        assert 6.5 < took < 25, took
        assert json.loads(out)["session"]["clean_end"]
    finally:
        kill(job)


def test_keep_running_leaves_the_job_running_and_the_suggested_kill_leaves_nothing(home):
    """Item 1's --keep-running; item 9d: `kill PID` left a DataLoader worker orphaned for 5-9 s;
    gputop now suggests the job's process group (it leads one: its own session), and that
    command stops the job and its worker at once."""
    wpid_file = home / "worker.pid"
    with open(home / "out.txt", "w") as out, open(home / "err.txt", "w") as err:  # (pipes would stay open)
        rc = subprocess.run([sys.executable, "-m", "gputop", "run", "--headless", "--duration", "3", "--no-stacks",
                             "--keep-running", "--record", str(home / "r.gtrec"), "--", sys.executable, "-c", JOB,
                             str(wpid_file)], stdout=out, stderr=err, stdin=subprocess.DEVNULL, timeout=60).returncode
    err = (home / "err.txt").read_text()
    job, worker = job_pid_of(err), pid_in(wpid_file, 1)
    try:
        assert rc == 0, err[-2000:]
        assert job and worker and alive(job) and alive(worker), err
        assert os.getpgid(job) == job and os.getpgid(worker) == job and os.getsid(job) == job
        m = re.search(rf"the run command \(PID {job}\) goes on running; stop it with: (kill -TERM -(\d+))", err)
        assert m and int(m[2]) == job, err
        assert err.index("goes on running") < err.index("gputop: recorded to")
        subprocess.run(["sh", "-c", m[1]], check=True, timeout=10)  # what the user would type
        assert gone(job, 2.0) and gone(worker, 2.0), "the worker was left behind"
    finally:
        kill(job, worker)


@pytest.mark.parametrize("code, expected", [
    ("import time; time.sleep(1); import torch_nonexistent", 1),   # the issue's: ModuleNotFoundError
    ("import sys, time; time.sleep(1); sys.exit(3)", 3),
    ("import os, signal, time; time.sleep(1); os.kill(os.getpid(), signal.SIGUSR1)", 128 + signal.SIGUSR1),
    ("import sys; sys.exit(4)", 4),                                 # at once: before gputop watches it
])
def test_a_failed_job_gives_gputop_its_exit_status(home, code, expected):
    """Item 2: `gputop run --headless --duration 10 -- python -c "import torch"` printed the job's
    error and exited 0, so CI could not tell. Now its exit status is the job's (128+N for signal N)."""
    rc, out, err, took = gputop_run(home, "--headless", "--duration", "10", "--no-stacks",
                                    "--record", str(home / "r.gtrec"), "--", sys.executable, "-c", code)
    assert rc == expected, (rc, err[-2000:])
    assert took < 20, took
    if expected == 128 + signal.SIGUSR1:
        assert "the run command ended (killed by SIGUSR1)" in err, err


def test_a_job_that_ends_well_before_the_duration_is_a_success(home):
    rc, out, err, took = gputop_run(home, "--headless", "--duration", "10", "--no-stacks", "--record",
                                    str(home / "r.gtrec"), "--", sys.executable, "-c", "import time; time.sleep(1.5)")
    assert rc == 0 and "the run command ended (exit code 0)" in err, (rc, err[-2000:])


def test_a_stopped_demo_says_gputop_stopped_it_not_an_exit_code(home):
    """Item 9a: "the demo command ended (exit code -15)" read like a failure."""
    r = subprocess.run([sys.executable, "-m", "gputop", "demo", "--scenario", "python", "--headless", "--duration",
                        "3", "--no-stacks", "--json", "--record", str(home / "d.gtrec")],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=home)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"the demo command \(PID \d+\) was stopped by gputop \(SIGTERM to its process group\)",
                     r.stderr), r.stderr
    assert "exit code -15" not in r.stderr and "--keep-running" not in r.stderr
    assert json.loads(r.stdout)["session"]["clean_end"]


@pytest.mark.parametrize("args, words", [
    (["--keep-running", "--", "true"], "--keep-running only applies with --headless"),
    (["--headless", "--duration", "1", "--keep-running", "--stop-with-gputop", "--", "true"], "contradict"),
])
def test_keep_running_needs_headless_and_contradicts_stop_with_gputop(args, words):
    r = subprocess.run([sys.executable, "-m", "gputop", "run", *args], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_a_full_disk_says_when_the_recording_stopped_and_exits_1(tmp_path):
    """The recorder's write fails (RLIMIT_FSIZE stands in for a full disk: the same OSError):
    gputop keeps watching, writes its report, says the recording stopped early and when, and
    exits 1 (it exited 0 with "recorded to" for a file covering 5.9 of 15 s)."""
    import resource

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (6_000, 6_000))   # ~5 s of this job
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG), as on a full disk

    busy = "import time\nt = time.time()\nwhile time.time() - t < 30: sum(range(9999))"
    job = subprocess.Popen([sys.executable, "-c", busy])
    try:
        out = subprocess.run([sys.executable, "-m", "gputop", "--pid", str(job.pid), "--headless", "--duration", "10",
                              "--record", str(tmp_path / "full.gtrec")], capture_output=True, text=True, timeout=90,
                             preexec_fn=small_files)
    finally:
        job.kill()
        job.wait()
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    m = re.search(r"recording stopped early at 0:(\d\d\.\d) of the session", out.stderr)
    assert m and 0.0 < float(m.group(1)) < 10.0, out.stderr[-2000:]
    assert "Triage" in out.stdout    # the report of what was recorded
