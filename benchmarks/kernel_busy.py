"""How busy the GPU's kernels keep it per step, from a CUDA kernel timeline, against util.gpu.

    python3 benchmarks/kernel_busy.py [--after 8] [--window 1.0] [--windows 3] -- JOB.py [JOB ARGS]

An experiment for issue 29 (the gain a launch-bound fix would bring): it runs a corpus job in this
process, and from a side thread, once the job has stepped ``--after`` seconds, times steady steps
without a profiler, then records ``--windows`` kernel timelines of ``--window`` seconds each
(``torch.profiler`` with CUDA activity only: CUPTI's kernel and copy records), then times steps
again (does the job stay slower once CUPTI has been on?). Per window: kernels, the union of their
intervals (the time the GPU ran any kernel), the steps the job made; so the GPU's kernel time per
step, against the step time of unprofiled steps. Prints one JSON line, ``kernel_busy {...}``.

Steps are counted by the corpus's ``Meter.step`` (patched here to count into this module).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import threading
import time

from gputop.probe.kernel_sample import floor_ns, union_ns   # (one home: the probe's own trace uses them)

steps = 0


def _rate(seconds: float) -> tuple[float, int]:
    s0, t0 = steps, time.perf_counter()
    time.sleep(seconds)
    n, dt = steps - s0, time.perf_counter() - t0
    return (dt / n * 1e3 if n else float("nan")), n


def _gaps_us(spans: list[tuple[int, int]]) -> list[float]:
    """Idle gaps (µs) on the kernels' union timeline: each start after the running end."""
    out, end = [], None
    for s, e in sorted(spans):
        if end is not None and s > end:
            out.append((s - end) / 1e3)
        end = e if end is None else max(end, e)
    return out


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q / 100 * len(xs)))], 2)


def _sampler(a, out: dict) -> None:
    while steps == 0:
        time.sleep(0.05)
    import torch   # (only once the job has imported it: two threads importing torch at once fail)
    from torch.profiler import ProfilerActivity, profile

    time.sleep(a.after)
    out["step_ms_before"], out["steps_before"] = _rate(2.0)
    out["windows"] = []
    for _ in range(a.windows):
        s0 = steps
        t_in = time.perf_counter()
        prof = profile(activities=[ProfilerActivity.CUDA])
        prof.__enter__()
        t_on = time.perf_counter()
        time.sleep(a.window)
        s1 = steps
        t_off = time.perf_counter()
        prof.__exit__(None, None, None)
        t_out = time.perf_counter()
        evs = prof.profiler.kineto_results.events() if prof.profiler is not None else []
        kern, copies = [], []
        for e in evs:
            if e.device_type() != torch.autograd.DeviceType.CUDA:
                continue
            span = (e.start_ns(), e.start_ns() + e.duration_ns())
            (copies if e.name().startswith(("Memcpy", "Memset")) else kern).append(span)
        t_parsed = time.perf_counter()
        gaps = _gaps_us(kern)
        n = s1 - s0
        wall_ns = (t_off - t_on) * 1e9
        u = union_ns(kern)
        first = min((s for s, _ in kern), default=0)
        last = max((e for _, e in kern), default=0)
        out["windows"].append({
            "enter_ms": (t_on - t_in) * 1e3, "exit_ms": (t_out - t_off) * 1e3, "parse_ms": (t_parsed - t_out) * 1e3,
            "steps": n, "kernels": len(kern), "copies": len(copies),
            "kernel_union_ms": u / 1e6, "kernel_sum_ms": sum(e - s for s, e in kern) / 1e6,
            "copy_union_ms": union_ns(copies) / 1e6, "kernel_span_ms": (last - first) / 1e6,
            "wall_ms": wall_ns / 1e6, "step_ms_profiled": wall_ns / 1e6 / n if n else None,
            "kernel_ms_per_step": u / 1e6 / n if n else None,
            # what the probe reports: the kernels back to back, the GPU's own gap between two counted
            "kernel_floor_ms_per_step": floor_ns(kern) / 1e6 / n if n else None,
            # the idle gaps between one kernel's end and the next one's start (µs): a graph's kernels
            # follow each other at the GPU's own pace, a Python loop's at the host's launch rate
            "gap_us_pcts": {q: _pct(gaps, q) for q in (10, 25, 50, 75, 90)}, "gaps": len(gaps),
            "gap_share_under_us": {g: (sum(1 for x in gaps if x <= g) / len(gaps) if gaps else None)
                                   for g in (1, 2, 3, 5)},
            "kernel_ms_per_step_gaps_merged_us": {g: (u + sum(x for x in gaps if x <= g) * 1e3) / 1e6 / n if n else None
                                                  for g in (1, 2, 3, 5)}})
        time.sleep(0.5)
    time.sleep(1.0)
    out["step_ms_after"], out["steps_after"] = _rate(2.0)
    per = [w["kernel_ms_per_step"] for w in out["windows"] if w["kernel_ms_per_step"]]
    if per and out["step_ms_before"] == out["step_ms_before"]:
        k = sorted(per)[len(per) // 2]
        out["kernel_busy_share"] = k / out["step_ms_before"]
        out["launch_gain_pct"] = (out["step_ms_before"] / k - 1) * 100
    print("kernel_busy " + json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--after", type=float, default=8.0)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("job", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    job = a.job[1:] if a.job[:1] == ["--"] else a.job   # (only the separator: the job's own "--" stay)
    if not job or not os.path.isfile(job[0]):
        print("kernel_busy: give a job script after '--' (e.g. -- benchmarks/corpus/small_mlp_launch.py)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(job[0])))
    import common

    count = common.Meter.step

    def step(self):
        global steps
        steps += 1
        return count(self)

    common.Meter.step = step
    out = {"job": os.path.basename(job[0]), "args": job[1:]}
    threading.Thread(target=_sampler, args=(a, out), daemon=True, name="kernel-busy").start()
    sys.argv = job
    runpy.run_path(job[0], run_name="__main__")
    time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
