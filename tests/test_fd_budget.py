"""Too many open files (issue 32): gputop keeps /proc descriptors from one budget of the whole
process (procfs.FdBudget), so a target of many threads under a small `ulimit -n`, or an agent
watching several such jobs, degrades (fewer threads sampled, said in the stack source's health)
and never raises: a report, an end frame, every live job still watched."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

THREADS = ("import sys, threading, time\n"
           "ev = threading.Event()\n"
           "for _ in range(int(sys.argv[1])):\n"
           "    threading.Thread(target=ev.wait, daemon=True).start()\n"
           "t0 = time.time()\n"
           "while time.time() - t0 < float(sys.argv[2]):\n"
           "    sum(range(1000))\n"
           "    time.sleep(0.01)\n")   # (the threads are the point: four spinning jobs took the suite's two cores)


def _limit(n: int):
    def set_it():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return set_it


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_150_thread_target_under_ulimit_256(tmp_path):
    job = subprocess.Popen([sys.executable, "-c", THREADS, "150", "60"])
    rec = tmp_path / "run.gtrec"
    try:
        time.sleep(1.0)
        out = subprocess.run([sys.executable, "-m", "gputop", "--pid", str(job.pid), "--headless", "--duration", "8",
                              "--prometheus", str(_port()), "--record", str(rec), "--json"],
                             capture_output=True, text=True, timeout=120, preexec_fn=_limit(256))
    finally:
        job.kill()
        job.wait()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Too many open files" not in out.stderr
    rep = json.loads(out.stdout)
    assert rep["session"]["clean_end"] is True          # the end frame was written
    stacks = rep["sources"]["stacks"]
    assert stacks["state"] == "degraded" and "of 151 threads" in stacks["message"], stacks


def test_the_agent_keeps_every_job_under_ulimit_1024():
    tok = f"fdjob_{uuid.uuid4().hex[:8]}"
    jobs = [subprocess.Popen([sys.executable, "-c", THREADS, "100", "60", tok]) for _ in range(4)]
    port = _port()
    agent = subprocess.Popen([sys.executable, "-m", "gputop", "agent", "--prometheus", str(port), "--match", tok,
                              "--only-match", "--scan", "1", "--duration", "25"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_limit(1024))
    watched = []
    try:
        deadline = time.monotonic() + 22
        while time.monotonic() < deadline:
            time.sleep(1.0)
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue
            for line in body.splitlines():
                if line.startswith("gputop_agent_jobs_watched"):
                    watched.append(float(line.split()[-1]))
        _out, err = agent.communicate(timeout=60)
    finally:
        agent.kill()
        for j in jobs:
            j.kill()
            j.wait()
    assert "Traceback" not in err and "Too many open files" not in err, err[-3000:]
    # once all four are found, all four stay watched while they all run
    first = next((i for i, w in enumerate(watched) if w == 4), None)
    assert first is not None, watched
    assert all(w == 4 for w in watched[first:]), watched
