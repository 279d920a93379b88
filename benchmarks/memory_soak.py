"""Does gputop's memory stay flat over a long session? (goal: < 50 MB growth over one hour)

    python benchmarks/memory_soak.py OUTDIR [--seconds 3600] [--scenario python] [--every 30]

Starts a bundled workload with the probe loaded, attaches ``gputop --headless`` for
``--seconds`` with every source at its defaults (recording included), and samples the RSS of
gputop itself and of its py-spy children every ``--every`` seconds. Growth is measured from the
first sample after a 2-minute warm-up (the store's 300 s window fills during the first 5
minutes, so the table also shows the growth after 6 minutes). Writes OUTDIR/memory_soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import psutil


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--seconds", type=float, default=3600.0)
    ap.add_argument("--scenario", default="python")
    ap.add_argument("--every", type=float, default=30.0)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    from gputop.session.launch import probe_env

    w = subprocess.Popen([sys.executable, "-m", "gputop.demo.workload", "--scenario", a.scenario],
                         env=probe_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(5)
    rec = os.path.join(a.outdir, "soak.gtrec")
    if os.path.exists(rec):
        os.remove(rec)
    g = subprocess.Popen([sys.executable, "-m", "gputop", "--pid", str(w.pid), "--headless", "--duration",
                          str(a.seconds), "--record", rec], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    gp = psutil.Process(g.pid)
    t0 = time.monotonic()
    rows = []
    try:
        while g.poll() is None:
            try:
                own = gp.memory_info().rss
                kids = sum(c.memory_info().rss for c in gp.children(recursive=True))
            except psutil.Error:
                break
            rows.append({"t": round(time.monotonic() - t0, 1), "gputop_rss": own, "children_rss": kids})
            print(f"t={rows[-1]['t']:7.0f}s gputop {own / 2**20:7.1f} MiB  py-spy {kids / 2**20:6.1f} MiB", flush=True)
            time.sleep(a.every)
        g.wait()
    finally:
        w.terminate()
        w.wait(timeout=10)

    # Growth while sampling; the report gputop builds once the duration is over (it reads the
    # whole recording back) is a separate, one-off peak.
    sampling = [r for r in rows if r["t"] <= a.seconds - 5]
    final = [r for r in rows if r["t"] > a.seconds - 5]

    def growth(after):
        base = next((r for r in sampling if r["t"] >= after), None)
        if base is None:
            return None
        return round((max(r["gputop_rss"] for r in sampling if r["t"] >= after) - base["gputop_rss"]) / 2**20, 1)

    out = {"seconds": a.seconds, "scenario": a.scenario, "samples": rows,
           "growth_after_2min_mib": growth(120), "growth_after_6min_mib": growth(360),
           "rss_end_of_sampling_mib": round(sampling[-1]["gputop_rss"] / 2**20, 1) if sampling else None,
           "rss_peak_while_reporting_mib": round(max(r["gputop_rss"] for r in final) / 2**20, 1) if final else None,
           "recording_bytes": os.path.getsize(rec) if os.path.exists(rec) else None, "cpu_count": os.cpu_count()}
    with open(os.path.join(a.outdir, "memory_soak.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(f"growth of gputop's RSS while sampling: {out['growth_after_2min_mib']} MiB after 2 min, "
          f"{out['growth_after_6min_mib']} MiB after 6 min; {out['rss_peak_while_reporting_mib']} MiB while "
          f"building the final report; recording {out['recording_bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
