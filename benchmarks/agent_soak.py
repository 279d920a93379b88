"""The node agent under churn: jobs come and go for a while; its memory, descriptors, sockets
and py-spy children must stay flat, and go back to nothing once the jobs are gone.

    python benchmarks/agent_soak.py OUTDIR [--minutes 5] [--concurrent 3] [--life 8:30]

Starts ``gputop agent --match soak_<token> --only-match --scan 1 --state-dir`` (a small
--keep-mb, so pruning runs), then keeps up to --concurrent real Python jobs alive, each living a
random time in --life seconds (a light loop: a busy 10 ms, then a sleep, so py-spy, the kernel
sampler and the verdicts all have work). Every 10 s: the agent's RSS, open descriptors, sockets,
py-spy children, jobs watched. At the end: no job left, and after the agent's linger, no py-spy
child and no job. Writes OUTDIR/agent_soak.json; prints the first and last samples and the RSS
slope of the second half (MiB per hour).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_common import free_port, jobs_served, start_agent, wait_until, write_json  # noqa: E402

LIGHT = ("import sys, time\nend = time.monotonic() + float(sys.argv[1])\n"
         "while time.monotonic() < end:\n    t = time.monotonic()\n    while time.monotonic() - t < 0.01: pass\n"
         "    time.sleep(0.09)\n")


def agent_state(agent: psutil.Process) -> dict:
    kids = []
    for k in agent.children(recursive=True):
        try:
            kids.append(k.name())
        except psutil.Error:   # a py-spy window that just ended
            pass
    try:
        socks = len(agent.net_connections(kind="all"))
    except (psutil.Error, AttributeError):
        socks = len(agent.connections(kind="all"))
    return {"rss_mib": round(agent.memory_info().rss / 2**20, 1), "fds": agent.num_fds(), "sockets": socks,
            "threads": agent.num_threads(), "pyspy": sum(1 for k in kids if "py-spy" in k)}


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points) or 1.0
    return sum((t - mx) * (v - my) for t, v in points) / den * 3600


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--concurrent", type=int, default=3)
    ap.add_argument("--life", default="8:30")
    a = ap.parse_args()
    lo, hi = (float(x) for x in a.life.split(":"))
    tok = uuid.uuid4().hex[:8]
    tmp = tempfile.mkdtemp(prefix="agent-soak-")
    script = os.path.join(tmp, f"soak_{tok}.py")
    with open(script, "w") as f:
        f.write(LIGHT)
    port = free_port()
    agent_p = start_agent(port, f"soak_{tok}", os.path.join(tmp, "agent.err"),
                          ["--scan", "1", "--state-dir", os.path.join(tmp, "state"), "--keep-mb", "8"])
    agent = psutil.Process(agent_p.pid)
    rng = random.Random(1)
    jobs: list[subprocess.Popen] = []
    samples, started = [], 0
    t0 = time.monotonic()
    next_sample = t0 + 5
    try:
        wait_until(lambda: jobs_served(port) is not None and os.path.exists(os.path.join(tmp, "state")), 30)
        while time.monotonic() - t0 < a.minutes * 60:
            jobs = [j for j in jobs if j.poll() is None]
            while len(jobs) < a.concurrent:
                jobs.append(subprocess.Popen([sys.executable, script, f"{rng.uniform(lo, hi):.1f}"]))
                started += 1
            if time.monotonic() >= next_sample:
                next_sample += 10
                s = {"t": round(time.monotonic() - t0, 1), **agent_state(agent), "watched": len(jobs_served(port))}
                samples.append(s)
                print(s, flush=True)
            time.sleep(0.5)
        for j in jobs:
            j.wait()
        gone = wait_until(lambda: not jobs_served(port) and agent_state(agent)["pyspy"] == 0, 60)
        end = {"t": round(time.monotonic() - t0, 1), **agent_state(agent), "watched": len(jobs_served(port))}
        state_files = os.listdir(os.path.join(tmp, "state"))
        state_bytes = sum(os.path.getsize(os.path.join(tmp, "state", n)) for n in state_files)
    finally:
        agent_p.terminate()
        agent_p.wait(timeout=30)
        for j in jobs:
            if j.poll() is None:
                j.kill()
    half = [s for s in samples if s["t"] >= samples[-1]["t"] / 2] if samples else []
    res = {"minutes": a.minutes, "jobs_started": started, "samples": samples, "after_jobs_ended": end,
           "all_released": gone, "rss_slope_mib_per_hour_second_half": round(
               slope_per_hour([(s["t"], s["rss_mib"]) for s in half]), 1),
           "fds_first_last": [samples[0]["fds"], samples[-1]["fds"]] if samples else None,
           "state_dir_files": len(state_files), "state_dir_mib": round(state_bytes / 2**20, 2),
           "agent_log_tail": open(os.path.join(tmp, "agent.err")).read()[-2000:]}
    print(f"jobs started {started}; RSS {samples[0]['rss_mib']} -> {samples[-1]['rss_mib']} MiB "
          f"(second-half slope {res['rss_slope_mib_per_hour_second_half']} MiB/h); fds {res['fds_first_last']}; "
          f"after the jobs: {end}; released: {gone}; state dir {res['state_dir_mib']} MiB in {len(state_files)} files")
    print("wrote", write_json(a.outdir, "agent_soak.json", res))
    return 0 if gone and end["pyspy"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
