"""The node agent's CPU per watched job, at its default rates.

    python benchmarks/agent_cost.py OUTDIR [--jobs 2] [--window 30] [--warmup 15] [--no-stacks]

Starts N real training jobs (benchmarks/agent_common.py: bf16 matmuls on a GPU, a small
input-bound DataLoader loop on the CPU) with the probe, then ``gputop agent --match`` watching
exactly them; after the warm-up, the CPU time of the agent's whole process tree (the agent and
its py-spy children) over the window, divided by the number of jobs. Writes
OUTDIR/agent_cost.json. Goal: <= ~1% of a core per job.

The parts (printed and in the JSON as ``parts_pct_per_job``): each agent thread's CPU from
/proc/AGENT/task/*/stat, summed by its kernel name (gputop names its threads: gputop-stacks,
gputop-derive, ...; one of each per job) and divided by the jobs; "exited threads": the
process's CPU that no live thread holds (the exporter's thread per scrape); py-spy: its
children, reaped and live.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_common import free_port, jobs_served, start_agent, start_job, tree_cpu, wait_until, write_json  # noqa: E402
from cpu_profile import thread_cpu as threads_cpu  # noqa: E402  (the /proc/PID/task reader, one copy)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` now, summed by the thread's kernel name (the
    agent's per-job threads carry a "-N" suffix)."""
    out: dict[str, float] = {}
    for tid, (name, cpu) in threads_cpu(pid).items():
        name = "main" if tid == pid else re.sub(r"-\d+$", "", name)
        out[name] = out.get(name, 0.0) + cpu
    return out


def own_and_children_cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of the process itself, of its children: reaped and live)."""
    import psutil

    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        kids = t.children_user + t.children_system
        for c in p.children(recursive=True):
            try:
                ct = c.cpu_times()
                kids += ct.user + ct.system
            except psutil.Error:
                pass
        return t.user + t.system, kids
    except psutil.Error:
        return float("nan"), float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--no-stacks", action="store_true")
    ap.add_argument("--agent-args", default="", help="more arguments for gputop agent (e.g. --stack-window 4)")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    tok = uuid.uuid4().hex[:8]
    tmp = tempfile.mkdtemp(prefix="agent-cost-")
    total_s = a.warmup + a.window + 30
    jobs = [start_job(tmp, f"costjob{i}_{tok}", total_s, probe=True) for i in range(a.jobs)]
    port = free_port()
    agent = start_agent(port, f"costjob\\d+_{tok}", os.path.join(tmp, "agent.err"),
                        (["--no-stacks"] if a.no_stacks else []) + a.agent_args.split())
    try:
        if not wait_until(lambda: len(jobs_served(port)) == a.jobs, 60):
            print(f"the agent did not find the {a.jobs} jobs; its log: {tmp}/agent.err", file=sys.stderr)
            return 1
        time.sleep(a.warmup)
        c0, th0, oc0, t0 = tree_cpu(agent.pid), thread_cpu(agent.pid), own_and_children_cpu(agent.pid), time.monotonic()
        scrapes = 0
        while time.monotonic() - t0 < a.window:   # a scrape every 5 s, like a Prometheus would
            jobs_served(port)
            scrapes += 1
            time.sleep(5)
        c1, th1, oc1, t1 = tree_cpu(agent.pid), thread_cpu(agent.pid), own_and_children_cpu(agent.pid), time.monotonic()
        served = jobs_served(port)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        for j in jobs:
            j.kill()
            j.wait()
    pct = 100 * (c1 - c0) / (t1 - t0)
    per_job = pct / a.jobs
    parts = {k: 100 * (v - th0.get(k, 0.0)) / (t1 - t0) / a.jobs for k, v in th1.items()}
    per = 100 / (t1 - t0) / a.jobs
    parts["exited threads"] = (oc1[0] - oc0[0]) * per - sum(parts.values())
    parts["py-spy"] = (oc1[1] - oc0[1]) * per
    parts = {k: round(v, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.005}
    res = {"jobs": a.jobs, "window_s": round(t1 - t0, 1), "agent_cpu_pct_of_core": round(pct, 2),
           "per_job_pct_of_core": round(per_job, 2), "parts_pct_per_job": parts, "scrapes": scrapes,
           "stacks": not a.no_stacks, "agent_args": a.agent_args,
           "served": served, "goal_pct_per_job": 1.0, "cpu_count": os.cpu_count(),
           "load1_at_end": os.getloadavg()[0]}
    print(f"{'jobs':>5} {'window s':>9} {'agent CPU % core':>17} {'per job':>8}  stacks")
    print(f"{a.jobs:>5} {res['window_s']:>9} {res['agent_cpu_pct_of_core']:>17} {res['per_job_pct_of_core']:>8}  "
          f"{'on' if res['stacks'] else 'off'}")
    print("per job, by part (% of a core):", ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
    print("wrote", write_json(a.outdir, f"agent_cost{'-' + a.label if a.label else ''}.json", res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
