"""`gputop run` and the job it starts (issue 12 item 2, issue 13 items 8 and 9): the job's output
(passed through headless, a private log with the UI), its life (independent of gputop's unless
--stop-with-gputop) and the signals of a closing SSH session. Real processes; XDG_* and TMPDIR
point into tmp_path."""

from __future__ import annotations

import json
import os
import pathlib
import pty
import re
import select
import signal
import stat
import subprocess
import sys
import time

import pytest
from run_helpers import alive, private_home

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    return private_home(tmp_path, monkeypatch)


def kill_job(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_gputop(home, *args) -> subprocess.Popen:
    """gputop in the background; its stderr in a file (home/"err.txt", read by job_pid and
    err_of): a pipe would stay open as long as the job that inherited it runs."""
    err = open(home / "err.txt", "w")
    try:
        return subprocess.Popen([sys.executable, "-m", "gputop", *args], stdout=subprocess.DEVNULL, stderr=err,
                                stdin=subprocess.DEVNULL, text=True)
    finally:
        err.close()


def err_of(home) -> str:
    return (home / "err.txt").read_text()


def job_pid(home) -> int:
    """The job's PID, from gputop's first stderr line ("gputop: watching PID N ...")."""
    for _ in range(300):
        m = re.search(r"watching PID (\d+)", err_of(home))
        if m:
            return int(m[1])
        time.sleep(0.1)
    pytest.fail(err_of(home)[-2000:])


SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]


def test_headless_passes_the_jobs_output_through_unchanged(home):
    job = [sys.executable, "-c", "import sys; print('out-marker-1'); print('err-marker-2', file=sys.stderr)"]
    r = subprocess.run([sys.executable, "-m", "gputop", "run", "--headless", "--duration", "5", "--no-stacks",
                        "--record", str(home / "r.gtrec"), "--", *job],
                       capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    # (the job may exit before gputop watches it: then one line says so; both ways its output shows)
    assert "out-marker-1\n" in r.stdout and "err-marker-2\n" in r.stderr, (r.stdout, r.stderr)
    assert "out-marker-1" not in r.stderr and not (home / "state" / "gputop" / "logs").exists()


def test_headless_json_keeps_stdout_for_the_report(home):
    job = [sys.executable, "-c", "import sys, time; print('out-marker-3', flush=True); time.sleep(3)"]
    r = subprocess.run([sys.executable, "-m", "gputop", "run", "--headless", "--duration", "10", "--json",
                        "--no-stacks", "--record", str(home / "r.gtrec"), "--", *job],
                       capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["session"]["clean_end"]
    assert "out-marker-3\n" in r.stderr
    assert "the run command ended (exit code 0)" in r.stderr


@pytest.mark.parametrize("how", ["kill -9", "duration"])
def test_the_job_outlives_gputop_by_default(home, how):
    """kill -9 of gputop leaves the job running; so does the end of --duration with --keep-running
    (issue 31 item 1: without it the duration ends the job, tests/test_run_duration.py), and gputop
    says how to stop the job with all it started: its process group (item 9d)."""
    keep = ["--keep-running"] if how == "duration" else []
    p = start_gputop(home, "run", "--headless", "--duration", "3" if how == "duration" else "60", "--no-stacks",
                     *keep, "--record", str(home / "r.gtrec"), "--", *SLEEPER)
    pid = job_pid(home)
    try:
        if how == "kill -9":
            time.sleep(1)
            p.kill()
        p.wait(timeout=60)
        err = err_of(home)
        if how == "duration":
            assert p.returncode == 0 and f"PID {pid}) goes on running" in err and f"kill -TERM -{pid}" in err, err
        time.sleep(1)
        assert alive(pid)
    finally:
        kill_job(pid)


@pytest.mark.parametrize("how", ["kill -9", "duration"])
def test_stop_with_gputop_stops_the_job(home, how):
    p = start_gputop(home, "run", "--headless", "--duration", "3" if how == "duration" else "60", "--no-stacks",
                     "--stop-with-gputop", "--record", str(home / "r.gtrec"), "--", *SLEEPER)
    pid = job_pid(home)
    try:
        if how == "kill -9":
            time.sleep(1)
            p.kill()
        p.wait(timeout=60)
        for _ in range(50):
            if not alive(pid):
                break
            time.sleep(0.1)
        assert not alive(pid)
    finally:
        kill_job(pid)


def test_headless_sighup_ends_cleanly_with_a_report(home):
    """Issue 13 item 8: the hang-up of a closed SSH session: an end frame and the report, as SIGTERM."""
    rec = home / "h.gtrec"
    p = subprocess.Popen([sys.executable, "-m", "gputop", "run", "--headless", "--duration", "60", "--no-stacks",
                          "--stop-with-gputop", "--json", "--record", str(rec), "--", *SLEEPER],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         # a suite started under nohup passes SIGHUP ignored on to gputop and so to its
                         # job, which then survives the hang-up as nohup asked: this test is about the
                         # default disposition, so it sets that for gputop (and the job it starts)
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert "watching PID" in p.stderr.readline()
    time.sleep(2)
    p.send_signal(signal.SIGHUP)
    out, err = p.communicate(timeout=60)
    # The hang-up reaches the job too (gputop passes it on: the job has a session of its own), and
    # kills it as it would have without gputop; a job killed by a signal that is not gputop's
    # own stop is a failure, whose status gputop gives (issue 31 item 2): 128 + SIGHUP.
    assert p.returncode == 128 + signal.SIGHUP, err
    assert "the run command ended (killed by SIGHUP)" in err, err
    assert json.loads(out)["session"]["clean_end"]
    rep = json.loads(subprocess.run([sys.executable, "-m", "gputop", "report", str(rec), "--json"],
                                    capture_output=True, text=True, timeout=60).stdout)
    assert rep["session"]["clean_end"] and rep["session"]["duration_s"] < 30


def _read_until(fd: int, pattern: bytes, timeout: float) -> bytes:
    buf = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end and pattern not in buf:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf


def test_the_ui_writes_the_jobs_output_to_a_private_log_and_names_it_at_exit(home):
    """Issue 12 item 2 in the UI (a real terminal: a pty): the job's output goes to a 0600 log
    in $XDG_STATE_HOME/gputop/logs, whose path gputop prints when it ends; the job goes on."""
    job = [sys.executable, "-c", "import time; print('ui-marker-4', flush=True); time.sleep(120)"]
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="100", LINES="30")
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "gputop", "run", "--no-stacks", "--", *job], env)
    job_pid = None
    try:
        _read_until(fd, b"\x1b[?1049h", 60)  # the UI took the screen
        time.sleep(3)
        os.write(fd, b"q")
        out = _read_until(fd, b"stop it with: kill", 60)
        out += _read_until(fd, b"\n", 5)
        os.waitpid(pid, 0)
        text = out.decode(errors="replace")
        m = re.search(r"PID (\d+)\) goes on running; its output is in (\S+\.log)", text)
        assert m, text[-3000:]
        job_pid, log = int(m[1]), pathlib.Path(m[2])
        assert log.parent == home / "state" / "gputop" / "logs"
        # issue 31 item 9c: named after the job's PID, not gputop's; 9d: stop its process group
        assert re.fullmatch(rf"run-{job_pid}-\d{{8}}-\d{{6}}\.log", log.name), log.name
        assert f"stop it with: kill -TERM -{job_pid} " in text and os.getpgid(job_pid) == job_pid, text[-3000:]
        assert stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(log.parent.stat().st_mode) == 0o700
        assert "ui-marker-4" in log.read_text()
        assert alive(job_pid)
    finally:
        os.close(fd)
        if job_pid:
            kill_job(job_pid)


def test_logs_are_pruned_to_the_last_few(home):
    from gputop.cli import LOGS_KEPT

    logs = home / "state" / "gputop" / "logs"
    logs.mkdir(parents=True)
    for d in (logs, logs.parent):
        d.chmod(0o700)
    for i in range(LOGS_KEPT + 5):
        p = logs / f"run-1-2020-{i:02d}.log"
        p.write_text("old")
        os.utime(p, (1000 + i, 1000 + i))
    env = dict(os.environ, TERM="xterm-256color")
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "gputop", "run", "--stop-with-gputop", "--no-stacks", "--",
                                   *SLEEPER], env)
    try:
        _read_until(fd, b"\x1b[?1049h", 60)
        time.sleep(1)
        os.write(fd, b"q")
        _read_until(fd, b"was stopped by gputop", 60)  # (issue 31 item 9a: no "exit code -15")
        os.waitpid(pid, 0)
    finally:
        os.close(fd)
    names = sorted(os.listdir(logs))
    assert len(names) == LOGS_KEPT
    assert sum(1 for n in names if n.startswith("run-1-")) == LOGS_KEPT - 1


def test_headless_ctrl_c_reaches_gputop_and_the_job_alike(home):
    """Ctrl-C at a terminal signals its foreground process group: gputop writes its report and
    the job gets SIGINT, as it would have without gputop (here: a KeyboardInterrupt ends it)."""
    job = [sys.executable, "-c", "import time\ntry:\n while True: time.sleep(0.05)\n"
           "except KeyboardInterrupt:\n print('job-saw-sigint', flush=True)"]
    err = open(home / "err.txt", "w")
    try:
        p = subprocess.Popen([sys.executable, "-m", "gputop", "run", "--headless", "--duration", "60", "--no-stacks",
                              "--record", str(home / "c.gtrec"), "--", *job], stdout=subprocess.PIPE, stderr=err,
                             stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    finally:
        err.close()
    pid = job_pid(home)
    try:
        time.sleep(2)
        os.killpg(p.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 130, err_of(home)   # interrupted (README's exit status), the report written
        assert "job-saw-sigint" in out, out
        assert "gputop: recorded to" in err_of(home) and len(out.splitlines()) > 3, out  # the report followed
        for _ in range(50):
            if not alive(pid):
                break
            time.sleep(0.1)
        assert not alive(pid)
    finally:
        kill_job(pid)
