#!/usr/bin/env python3
"""How soon the node agent, at its defaults, names a stopped job ``stalled``, and that it never
does while the job trains.

    python benchmarks/agent_stall.py OUTDIR

A probe-less CPU training loop (tests/workloads/stall_train.py: 45 s of training, a 60 s sleep,
30 s of training), so its steps come only from py-spy's stacks (2 samples/s in 20 s windows at
the agent's rates); ``gputop agent --match stall_train --only-match`` serves /metrics, read every
second. Prints (and writes OUTDIR/agent_stall.json): when ``gputop_verdict_active{verdict=
"stalled"}`` first and last read 1, in seconds from the start of the sleep, and how many reads
said stalled while the job was training (from its start to the sleep, and from 40 s after the
sleep ended).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_common import ROOT, free_port, scrape, start_agent, write_json  # noqa: E402


def _stalled(body: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            if line.startswith("gputop_verdict_active{") and 'verdict="stalled"' in line]


def main(out: str) -> int:
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT)
    ev = os.path.join(out, "events.jsonl")
    if os.path.exists(ev):
        os.remove(ev)
    port = free_port()
    job = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "workloads", "stall_train.py"),
                            "--scenes", "sleep", "--stall-s", "60", "--first-train-s", "45", "--train-s", "30",
                            "--step-ms", "0", "--events", ev],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = start_agent(port, "stall_train", os.path.join(out, "agent.err"), ["--scan", "1", "--duration", "170"])
    try:
        reads = []
        t0 = time.monotonic()
        while job.poll() is None and time.monotonic() - t0 < 175:
            time.sleep(1.0)
            try:
                body = scrape(port)
            except OSError:
                continue
            reads.append((time.monotonic(), _stalled(body)))
    finally:
        agent.terminate()
        agent.wait()
    job.wait()
    with open(ev) as f:
        events = [json.loads(line) for line in f]
    start = next(e["t"] for e in events if e.get("scene") == "sleep" and e.get("start"))
    end = next(e["t"] for e in events if e.get("scene") == "sleep" and not e.get("start"))
    on = [t for t, v in reads if v and max(v) == 1.0]
    res = {"sleep_s": round(end - start, 1),
           "stalled_first_s": round(on[0] - start, 1) if on else None,
           "stalled_last_s": round(on[-1] - start, 1) if on else None,
           "stalled_reads": len(on), "reads": len(reads),
           "stalled_while_training": len([t for t in on if t < start or t > end + 40]),
           # every read from the start of the sleep: 1 stalled, 0 not, - no verdict served
           "reads_from_sleep": "".join("-" if not v else str(int(max(v))) for t, v in reads if t >= start),
           "loadavg": os.getloadavg()[0]}
    write_json(out, "agent_stall.json", res)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "agent_stall_out"))
