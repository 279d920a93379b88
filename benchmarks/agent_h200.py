"""The node agent on a GPU node: it discovers two training processes started after it, one
after the other, exports both, forgets the first when it ends; its CPU per watched job.

    python benchmarks/agent_h200.py OUTDIR [--first 150] [--overlap 100] [--no-match]

1. ``gputop agent`` starts (port chosen free, loopback); with a CUDA GPU it relies on its own
   discovery (NVML: found_by="gpu"), without one (a CPU machine: runs here too) ``--match`` names
   the jobs' scripts (found_by="match"). ``--no-match`` forces discovery alone.
2. Job A starts (bf16 matmuls on the GPU, an input-bound DataLoader loop on a CPU); the agent
   must serve it. Then job B; both must be served (each with its own training_job label, and
   on a GPU their gputop_gpu_utilization_ratio).
3. A ends after --first seconds; the agent must drop it from /metrics while B stays.
CPU: the agent's process tree (with py-spy) while both jobs are watched, per job.
Prints a table, writes OUTDIR/agent_h200.json and the last scrape with both jobs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_common import (free_port, jobs_served, scrape, start_agent, start_job, tree_cpu,  # noqa: E402
                          wait_until, write_json)


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--first", type=float, default=150.0, help="how long job A runs (s)")
    ap.add_argument("--overlap", type=float, default=100.0, help="how long both run before A ends (s)")
    ap.add_argument("--no-match", action="store_true", help="discovery only (needs a GPU or a probe)")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    cuda = has_cuda()
    tok = uuid.uuid4().hex[:8]
    tmp = tempfile.mkdtemp(prefix="agent-h200-")
    port = free_port()
    use_match = not a.no_match and not cuda
    match = f"h200job[AB]_{tok}"
    agent = start_agent(port, match if use_match else "^$ never", os.path.join(tmp, "agent.err"),
                        ["--scan", "2"], only_match=False)
    steps, ok = [], True

    def step(what: str, passed: bool, **info):
        nonlocal ok
        ok &= passed
        steps.append({"step": what, "ok": passed, **info})
        print(f"{'ok  ' if passed else 'FAIL'} {what} {info if info else ''}", flush=True)

    a_job = b_job = None
    try:
        time.sleep(3)
        step("agent serving before any job", wait_until(lambda: scrape(port) is not None, 20))
        t_a = time.monotonic()
        a_job = start_job(tmp, f"h200jobA_{tok}", a.first + 30, probe=False)
        label_a = f"h200jobA_{tok}.py-{a_job.pid}"
        found_a = wait_until(lambda: label_a in jobs_served(port), 60)
        step("discovers job A", found_a, seconds=round(time.monotonic() - t_a, 1),
             found_by=jobs_served(port).get(label_a))
        time.sleep(max(0.0, a.first - a.overlap - (time.monotonic() - t_a)))
        t_b = time.monotonic()
        b_job = start_job(tmp, f"h200jobB_{tok}", a.overlap + 120, probe=False)
        label_b = f"h200jobB_{tok}.py-{b_job.pid}"
        found_b = wait_until(lambda: {label_a, label_b} <= set(jobs_served(port)), 60)
        step("discovers job B after it, exports both", found_b, seconds=round(time.monotonic() - t_b, 1),
             found_by=jobs_served(port).get(label_b))
        time.sleep(20)   # past B's session start-up (its first py-spy windows)
        c0, w0 = tree_cpu(agent.pid), time.monotonic()
        both_text = scrape(port)
        while a_job.poll() is None and time.monotonic() - w0 < a.overlap:
            time.sleep(1)
        a_job.kill()   # A ends (if it has not yet)
        a_job.wait()
        c1, w1 = tree_cpu(agent.pid), time.monotonic()
        with open(os.path.join(a.outdir, "agent_h200_both.prom"), "w") as f:
            f.write(both_text)
        for label in (label_a, label_b):
            step(f"series of {label}", f'training_job="{label}"' in both_text)
        if cuda:
            gpu_lines = [ln for ln in both_text.splitlines() if ln.startswith("gputop_gpu_utilization_ratio{")]
            step("GPU series per job", all(any(f'training_job="{x}"' in ln for ln in gpu_lines)
                                           for x in (label_a, label_b)))
        t_end = time.monotonic()
        forgot = wait_until(lambda: label_a not in jobs_served(port) and label_b in jobs_served(port), 60)
        left = scrape(port)
        step("forgets job A when it ends, keeps B", forgot and f'training_job="{label_a}"' not in left,
             seconds=round(time.monotonic() - t_end, 1))
        per_job = 100 * (c1 - c0) / max(1e-9, w1 - w0) / 2
        step("CPU per watched job measured", per_job == per_job, per_job_pct_of_core=round(per_job, 2),
             window_s=round(w1 - w0, 1))
    finally:
        for p in (a_job, b_job):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        agent.terminate()
        try:
            agent.wait(timeout=30)
        except Exception:
            agent.kill()
        shutil.copy(os.path.join(tmp, "agent.err"), os.path.join(a.outdir, "agent_h200_agent.log"))
    res = {"cuda": cuda, "discovery": "match" if use_match else "own rules (NVML)", "ok": ok, "steps": steps,
           "cpu_count": os.cpu_count()}
    print(f"\n{'step':<48} ok")
    for s in steps:
        print(f"{s['step']:<48} {'yes' if s['ok'] else 'NO'}")
    print("wrote", write_json(a.outdir, "agent_h200.json", res))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
