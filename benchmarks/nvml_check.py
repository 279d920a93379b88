"""Check the NVML source on a real GPU: what it publishes, what it costs, which calls it makes.

    python3 benchmarks/nvml_check.py OUTDIR

Phase "gemm" starts a workload subprocess (a bf16 8192x8192 matmul loop with torch on cuda),
runs ``NvmlSource`` with a real ``Target`` on the workload's PID for ~10 s, then reports: the
mean of every ``gpu`` field, how often each GPM field was None, the gaps between GPM samples,
the CPU time of this whole process while sampling (nothing subtracted), the median time of every
NVML call the source made, and whether ``gpu_procs`` found the workload's PID. Phase
"pcie_call_cost" times ``nvmlDeviceGetPcieThroughput`` directly (the source calls it only on
GPUs without GPM), to tell whether its ~20 ms are spent sleeping or spinning.

Writes OUTDIR/samples_<phase>.json (every sample), OUTDIR/results.json (all numbers) and prints
a short table. Exits 0 even when a feature is missing: missing things are reported, not fatal.
The whole run stays under ~40 s. Add a phase: write ``def phase_x(ctx) -> dict`` and append it to
PHASES; ``ctx`` carries the output directory and helpers, ``render_x`` (optional) prints it.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKLOAD = r"""
import sys, time
import torch
seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
c = a @ b
torch.cuda.synchronize()
print("ready", flush=True)
end = time.monotonic() + seconds
steps = 0
while time.monotonic() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    steps += 1
print(f"done {steps}", flush=True)
"""

SAMPLE_S = 10.0          # the measured sampling window
READY_TIMEOUT_S = 20.0   # torch import + CUDA context + first matmul
WORKLOAD_S = SAMPLE_S + 4.0


@dataclass
class Context:
    out_dir: str
    notes: list[str] = field(default_factory=list)   # anything missing, said plainly

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", flush=True)


class Collector:
    """The source's emit callback: keeps every sample (thread-safe)."""

    def __init__(self) -> None:
        self.samples: list = []
        self.lock = threading.Lock()

    def __call__(self, sample) -> None:
        with self.lock:
            self.samples.append(sample)

    def snapshot(self) -> list:
        with self.lock:
            return list(self.samples)


def _sample_json(s) -> dict:
    return {"t": s.t, "kind": s.kind, "key": s.key, "data": s.data}


def _wait_for_line(proc: subprocess.Popen, word: str, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        r, _, _ = select.select([proc.stdout], [], [], 0.2)
        if r:
            line = proc.stdout.readline()
            if line.startswith(word):
                return True
    return False


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {"n": len(xs), "min": round(xs[0], 4), "median": round(statistics.median(xs), 4),
            "mean": round(statistics.fmean(xs), 4), "max": round(xs[-1], 4)}


# ---------------------------------------------------------------------------------------------
# Phase: GEMM workload, NvmlSource on its PID

def phase_gemm(ctx: Context) -> dict:
    from gputop.sources.nvml import GPM_FIELDS, GPU_FIELDS, NvmlSource
    from gputop.sources.target import Target

    class Clock:  # what SessionClock does, without importing the session layer
        def __init__(self) -> None:
            self.t0 = time.monotonic()

        def now(self) -> float:
            return time.monotonic() - self.t0

    res: dict = {}
    proc = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(WORKLOAD_S)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    res["workload_pid"] = proc.pid
    clock = Clock()
    target = Target(proc.pid)
    got = Collector()
    src = NvmlSource(clock, target=target, time_calls=True)
    try:
        src.start(got)  # before the workload has a CUDA context: the GPU choice starts with "all"
        ready = _wait_for_line(proc, "ready", READY_TIMEOUT_S)
        if not ready:
            ctx.note("the workload did not start (no CUDA torch?): sampling an idle GPU instead")
        res["workload_ready"] = ready
        t_begin = clock.now()
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(SAMPLE_S)
        cpu1, wall1 = time.process_time(), time.monotonic()
        t_end = clock.now()
    finally:
        t0 = time.monotonic()
        src.stop()
        res["stop_s"] = round(time.monotonic() - t0, 3)
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if err and not res.get("workload_ready"):
            res["workload_stderr_tail"] = err[-2000:]

    samples = got.snapshot()
    with open(os.path.join(ctx.out_dir, "samples_gemm.json"), "w") as f:
        json.dump([_sample_json(s) for s in samples], f)

    cpu_s = cpu1 - cpu0
    res["window_s"] = round(wall1 - wall0, 3)
    res["cpu_s"] = round(cpu_s, 4)
    res["cpu_pct_of_one_core"] = round(100 * cpu_s / (wall1 - wall0), 3)
    res["describe"] = src.describe()
    res["call_timings"] = src.call_timings()

    health = [s for s in samples if s.kind == "health"]
    res["health"] = [{"t": round(s.t, 2), **s.data} for s in health]
    res["gpu_info_last"] = {s.key: s.data for s in samples if s.kind == "gpu_info"}
    res["gpu_info_changes"] = [{"t": round(s.t, 2), "key": s.key, "watched": s.data.get("watched"),
                                "chosen_by": s.data.get("chosen_by")} for s in samples if s.kind == "gpu_info"]

    per_gpu = {}
    for key in sorted({s.key for s in samples if s.kind == "gpu"}):
        rows = [s for s in samples if s.kind == "gpu" and s.key == key and t_begin <= s.t <= t_end]
        times = [s.t for s in rows]
        fields = {}
        for f in GPU_FIELDS:
            vals = [s.data.get(f) for s in rows]
            nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
            fields[f] = {"mean": round(statistics.fmean(nums), 3) if nums else None,
                         "n": len(nums), "none": sum(v is None for v in vals)}
        gpm_t = [s.t for s in rows if s.data.get("gpm_window_s") is not None]
        events: dict[str, int] = {}
        for s in rows:
            for ev in s.data.get("clock_events") or []:
                events[ev] = events.get(ev, 0) + 1
        per_gpu[key] = {
            "samples": len(rows),
            "rate_hz": round(len(rows) / (t_end - t_begin), 2) if t_end > t_begin else None,
            "sample_gaps_s": _stats([b - a for a, b in zip(times, times[1:])]),
            "fields": fields,
            "gpm_none": {f: fields[f]["none"] for f in GPM_FIELDS},
            "gpm_sample_gaps_s": _stats([b - a for a, b in zip(gpm_t, gpm_t[1:])]),
            "gpm_window_s": _stats([s.data["gpm_window_s"] for s in rows if s.data.get("gpm_window_s") is not None]),
            "clock_events_count": events,
        }
    res["gpus"] = per_gpu
    if not per_gpu:
        ctx.note("no gpu samples at all: see health")

    procs = [s for s in samples if s.kind == "gpu_procs"]
    pid = str(proc.pid)
    found = [s for s in procs if pid in (s.data.get("procs") or {})]
    res["gpu_procs"] = {
        "samples": len(procs),
        "found_workload_pid": bool(found),
        "first_found_t": round(found[0].t, 2) if found else None,
        "last_entry": found[-1].data["procs"][pid] if found else None,
        "last_sample": procs[-1].data if procs else None,
    }
    if not found:
        ctx.note(f"gpu_procs never listed the workload PID {pid} (PID namespace? see last_sample)")
    return res


def render_gemm(res: dict) -> list[str]:
    lines = [f"workload PID {res['workload_pid']} ready={res['workload_ready']}; window {res['window_s']} s; "
             f"CPU of this whole process {res['cpu_s']} s = {res['cpu_pct_of_one_core']}% of one core; "
             f"stop() took {res['stop_s']} s"]
    for key, g in res["gpus"].items():
        gaps = g["sample_gaps_s"]
        lines.append(f"GPU {key}: {g['samples']} gpu samples ({g['rate_hz']} Hz), gaps min/median/max "
                     f"{gaps.get('min')}/{gaps.get('median')}/{gaps.get('max')} s")
        lines.append(f"  {'field':<18}{'mean':>14}{'n':>6}{'None':>6}")
        for f, st in g["fields"].items():
            mean = "-" if st["mean"] is None else f"{st['mean']:.3f}"
            lines.append(f"  {f:<18}{mean:>14}{st['n']:>6}{st['none']:>6}")
        gg, gw = g["gpm_sample_gaps_s"], g["gpm_window_s"]
        lines.append(f"  GPM samples: gaps min {gg.get('min')} median {gg.get('median')} s; "
                     f"window min {gw.get('min')} median {gw.get('median')} s")
        lines.append(f"  clock events: {g['clock_events_count'] or 'none'}")
    gp = res["gpu_procs"]
    lines.append(f"gpu_procs: {gp['samples']} samples; workload PID found: {gp['found_workload_pid']} "
                 f"(first at t={gp['first_found_t']}, last {gp['last_entry']})")
    lines.append("health: " + " | ".join(f"{h['state']}: {h['message']}" for h in res["health"][-2:]))
    lines.append(f"  {'NVML call':<46}{'n':>6}{'median us':>11}{'cpu us':>9}{'max us':>10}")
    for name, st in sorted(res["call_timings"].items(), key=lambda kv: -kv[1]["median_us"] * kv[1]["n"]):
        lines.append(f"  {name:<46}{st['n']:>6}{st['median_us']:>11}{st['cpu_median_us']:>9}{st['max_us']:>10}")
    return lines


# ---------------------------------------------------------------------------------------------
# Phase: what nvmlDeviceGetPcieThroughput costs (wall vs CPU)

def phase_pcie_call_cost(ctx: Context) -> dict:
    import pynvml as nv

    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        ctx.note(f"no NVML for the PCIe call check: {e}")
        return {"error": str(e)}
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        out = {}
        for name, counter in (("tx", nv.NVML_PCIE_UTIL_TX_BYTES), ("rx", nv.NVML_PCIE_UTIL_RX_BYTES)):
            walls, cpus, vals = [], [], []
            for _ in range(5):
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    vals.append(nv.nvmlDeviceGetPcieThroughput(h, counter))
                except nv.NVMLError as e:
                    out[name] = {"error": str(e)}
                    break
                walls.append(time.perf_counter() - w0)
                cpus.append(time.thread_time() - c0)
            else:
                out[name] = {"wall_ms": round(statistics.median(walls) * 1e3, 2),
                             "cpu_ms": round(statistics.median(cpus) * 1e3, 2), "kb_per_s": vals}
        return out
    finally:
        nv.nvmlShutdown()


def render_pcie_call_cost(res: dict) -> list[str]:
    return [f"nvmlDeviceGetPcieThroughput {k}: " + (f"wall {v['wall_ms']} ms, thread CPU {v['cpu_ms']} ms (median of 5)"
            if "wall_ms" in v else v.get("error", "?")) for k, v in res.items() if isinstance(v, dict)]


# Phases run in order; each returns a JSON-able dict. Append new ones here.
PHASES = [
    ("gemm", phase_gemm, render_gemm),
    ("pcie_call_cost", phase_pcie_call_cost, render_pcie_call_cost),
]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 benchmarks/nvml_check.py OUTDIR", file=sys.stderr)
        return 2
    out_dir = argv[1]
    os.makedirs(out_dir, exist_ok=True)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    ctx = Context(out_dir)
    results: dict = {"python": sys.version.split()[0], "started": time.time(), "phases": {}}
    t_start = time.monotonic()
    for name, run, _ in PHASES:
        t0 = time.monotonic()
        try:
            results["phases"][name] = run(ctx)
        except Exception as e:  # report it and carry on with the next phase
            import traceback
            results["phases"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            ctx.note(f"phase {name} failed: {type(e).__name__}: {e}")
        results["phases"][name]["phase_s"] = round(time.monotonic() - t0, 2)
    results["total_s"] = round(time.monotonic() - t_start, 2)
    results["notes"] = ctx.notes
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)

    print()
    for name, _, render in PHASES:
        res = results["phases"][name]
        print(f"== {name} ({res.get('phase_s')} s)")
        if set(res) <= {"error", "traceback", "phase_s"}:
            print(f"  error: {res.get('error')}")
            continue
        try:
            for line in render(res) if render else [json.dumps(res)[:2000]]:
                print(line)
        except Exception as e:
            print(f"  (could not render: {type(e).__name__}: {e})")
    for n in ctx.notes:
        print(f"NOTE: {n}")
    print(f"total {results['total_s']} s; results in {out_dir}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
