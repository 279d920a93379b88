"""What the stack source costs: the target's slowdown, side by side in one run, and the CPU of
gputop's stack sampling plus its py-spy children.

    python benchmarks/stacks_overhead.py OUT_DIR [--modes launch,gpu] [--pairs 6] [--phase 6] [--twin --pin 2,3]
                                         [--rate 20] [--window 2] [--subprocess-every 5] [--cost-matrix]
                                         [--recording S]

Slowdown: one long-running target (tests/workloads/stacks_rate.py) prints its own step count
every 0.5 s; the stack source (py-spy windows + kernel sampler + the ThreadStateProcessor processor,
run every second as gputop would) is attached and detached in alternation, D A D A ... D,
``--pairs`` times, ``--phase`` seconds each; the first second of each phase is skipped. Each
attached phase is compared with the mean of the detached phases on either side of it (so slow
drifts of the machine cancel). Modes: ``launch`` (tiny torch CPU ops: launch-bound, runs
anywhere), ``python`` (pure Python), ``gpu`` (bf16 matmuls, needs CUDA), ``cuda-launch`` (tiny CUDA
kernels, needs CUDA). Modes that need CUDA are skipped without it.

CPU: during attached phases, the py-spy children (their rusage, from wait4), the sampler thread
(thread_time) and the processor (thread_time), as % of one core.

``--twin`` (a second, drift-free design): two identical targets run side by side, each pinned
to its own CPU (``--pin A,B``; the monitor is not pinned, so its threads and py-spy may land on a
target's CPU, as they could in real use), and the stack source is attached to one, then the
other, ``--pairs`` times. Whatever the machine does (clock changes, neighbours, the GPU shared by
both) hits both targets at once, so it cancels in the ratio of their rates: with r1 = A/B while A is
watched and r2 = A/B while B is watched, the slowdown s satisfies r1/r2 = (1-s)^2. Each
consecutive (r1, r2) pair gives one estimate; the table shows their mean, sd and a 95% interval.

``--recording S`` records S seconds of a real session (stack source + thread-state processor,
nothing else) of a DataLoader target and of a 3-spinner target and reports the file's bytes per
minute (the budget for a whole session is 1 MB/min).

``--cost-matrix`` also measures the CPU of several settings (rate, window, how often a window
also samples children with py-spy's --subprocesses: every Nth, 0 = never) on a
DataLoader workload (main process + 2 workers), 15 s each.

Prints tables; writes OUT_DIR/stacks_overhead.json and OUT_DIR/stacks_overhead.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gputop.derive.threads import ThreadStateProcessor  # noqa: E402
from gputop.session.store import SampleStore  # noqa: E402
from gputop.sources.stacks import StackSource  # noqa: E402
from gputop.sources.target import Target  # noqa: E402

WORKLOADS = ROOT / "tests" / "workloads"


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


class Workload:
    def __init__(self, script: str, args: list[str], cpu: int | None = None):
        pre = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
        self.proc = subprocess.Popen([sys.executable, str(WORKLOADS / script), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=pre)
        self.lines: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def wait_first(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while len(self.lines) < 2:
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"workload gave no output: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.05)

    def rate(self, a: float, b: float) -> float | None:
        pts = [d for d in self.lines if a <= d["mono"] <= b]
        if len(pts) < 2:
            return None
        return (pts[-1]["steps"] - pts[0]["steps"]) / (pts[-1]["mono"] - pts[0]["mono"])

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Attached:
    """The stack source and its processor, as gputop runs them, with their CPU accounted."""

    def __init__(self, pid: int, rate: int, window: int, subprocess_every: int):
        self.clock = Clock()
        self.store = SampleStore()
        self.src = StackSource(self.clock, Target(pid), rate_hz=rate, window_s=window,
                               subprocess_every=subprocess_every)
        self.proc = ThreadStateProcessor()
        self.proc_cpu = 0.0
        self.n_samples = 0
        self.bytes_json = 0

    def _emit(self, s) -> None:
        self.store.on_samples([s])
        self.n_samples += 1
        self.bytes_json += len(json.dumps(s.data))

    def run_for(self, seconds: float) -> dict:
        t0 = time.monotonic()
        self.src.start(self._emit)
        end = t0 + seconds
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            c = time.thread_time()
            out = self.proc.process(self.store, self.clock.now())
            self.store.on_samples(out)
            self.proc_cpu += time.thread_time() - c
        self.src.stop()
        wall = time.monotonic() - t0
        return {"wall": wall, "pyspy_pct": 100 * self.src.pyspy_cpu_s / wall,
                "sampler_pct": 100 * self.src.sampler_cpu_s / wall, "processor_pct": 100 * self.proc_cpu / wall,
                "rate_eff": self.src.rate_eff, "windows": self.src.windows, "restarts": self.src.restarts,
                "state": self.src.pyspy_state, "message": self.src.pyspy_message,
                "raw_json_bytes_per_min": self.bytes_json / wall * 60}


def slowdown(mode: str, pairs: int, phase: float, rate: int, window: int, subprocess_every: int) -> dict:
    wl = Workload("stacks_rate.py", ["--mode", mode])
    try:
        wl.wait_first()
        time.sleep(2.0)  # warm-up
        phases = []
        for i in range(2 * pairs + 1):
            attached = i % 2 == 1
            a = time.monotonic()
            info = None
            if attached:
                info = Attached(wl.proc.pid, rate, window, subprocess_every).run_for(phase)
            else:
                time.sleep(phase)
            b = time.monotonic()
            time.sleep(0.6)  # the line that closes this phase
            phases.append({"attached": attached, "rate": wl.rate(a + 1.0, b), "cost": info})
    finally:
        wl.stop()
    rel = []
    for i in range(1, len(phases) - 1, 2):
        d0, att, d1 = phases[i - 1]["rate"], phases[i]["rate"], phases[i + 1]["rate"]
        if d0 and d1 and att:
            rel.append(100.0 * (1.0 - att / ((d0 + d1) / 2)))
    det = [p["rate"] for p in phases if not p["attached"] and p["rate"]]
    att = [p["rate"] for p in phases if p["attached"] and p["rate"]]
    costs = [p["cost"] for p in phases if p["cost"]]
    return {"mode": mode, "phases": phases, "slowdown_pct": rel,
            "detached_rate": det, "attached_rate": att,
            "pyspy_pct": [c["pyspy_pct"] for c in costs], "sampler_pct": [c["sampler_pct"] for c in costs],
            "processor_pct": [c["processor_pct"] for c in costs],
            "raw_json_bytes_per_min": [c["raw_json_bytes_per_min"] for c in costs]}


def twin_slowdown(mode: str, pairs: int, phase: float, rate: int, window: int, subprocess_every: int,
                  cpus: tuple[int, int]) -> dict:
    a_wl = Workload("stacks_rate.py", ["--mode", mode], cpu=cpus[0])
    b_wl = Workload("stacks_rate.py", ["--mode", mode], cpu=cpus[1])
    phases = []
    try:
        a_wl.wait_first()
        b_wl.wait_first()
        time.sleep(2.0)  # warm-up
        for i in range(2 * pairs):
            watched = a_wl if i % 2 == 0 else b_wl
            t0 = time.monotonic()
            info = Attached(watched.proc.pid, rate, window, subprocess_every).run_for(phase)
            t1 = time.monotonic()
            time.sleep(0.6)  # the lines that close this phase
            ra, rb = a_wl.rate(t0 + 1.0, t1), b_wl.rate(t0 + 1.0, t1)
            phases.append({"watched": "A" if i % 2 == 0 else "B", "rate_a": ra, "rate_b": rb, "cost": info})
    finally:
        a_wl.stop()
        b_wl.stop()
    est = []
    for i in range(0, len(phases) - 1, 2):
        pa, pb = phases[i], phases[i + 1]
        if pa["rate_a"] and pa["rate_b"] and pb["rate_a"] and pb["rate_b"]:
            r1, r2 = pa["rate_a"] / pa["rate_b"], pb["rate_a"] / pb["rate_b"]
            est.append(100.0 * (1.0 - (r1 / r2) ** 0.5))
    watched_rates = [p["rate_a"] if p["watched"] == "A" else p["rate_b"] for p in phases]
    other_rates = [p["rate_b"] if p["watched"] == "A" else p["rate_a"] for p in phases]
    costs = [p["cost"] for p in phases]
    return {"mode": mode, "design": "twin", "cpus": list(cpus), "phases": phases, "slowdown_pct": est,
            "lines_a": a_wl.lines, "lines_b": b_wl.lines,
            "ci95_pct": ci95(est), "watched_rate": [r for r in watched_rates if r],
            "unwatched_rate": [r for r in other_rates if r],
            "pyspy_pct": [c["pyspy_pct"] for c in costs], "sampler_pct": [c["sampler_pct"] for c in costs],
            "processor_pct": [c["processor_pct"] for c in costs]}


def ci95(xs: list[float]) -> list[float] | None:
    """The 95% interval of the mean (Student's t), or None for fewer than 2 values."""
    if len(xs) < 2:
        return None
    t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
         12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09}.get(len(xs) - 1, 2.05)
    m, half = statistics.fmean(xs), t * statistics.stdev(xs) / len(xs) ** 0.5
    return [round(m - half, 3), round(m + half, 3)]


def cost_matrix(settings: list[tuple[int, int, int]], seconds: float) -> list[dict]:
    wl = Workload("stacks_dataloader.py", ["--workers", "2", "--batch", "8", "--sample-ms", "2", "--step-ms", "8"])
    out = []
    try:
        wl.wait_first()
        time.sleep(2.0)
        for rate, window, subs in settings:
            info = Attached(wl.proc.pid, rate, window, subs).run_for(seconds)
            info.update(rate=rate, window=window, subprocess_every=subs)
            out.append(info)
            print(f"  rate {rate} Hz window {window} s subprocess_every {subs}: py-spy {info['pyspy_pct']:.2f}% "
                  f"sampler {info['sampler_pct']:.2f}% processor {info['processor_pct']:.2f}% "
                  f"(effective {info['rate_eff']} Hz)", flush=True)
    finally:
        wl.stop()
    return out


def recording_size(script: str, args: list[str], seconds: float, out_dir: pathlib.Path) -> dict:
    from gputop.session.recording import Recorder, RecordingReader, RecordingWriter
    from gputop.session.session import LiveSession, SessionClock

    wl = Workload(script, args)
    path = out_dir / f"size-{script}.gtrec"
    try:
        wl.wait_first()
        time.sleep(2.0)
        clock = SessionClock()
        src = StackSource(clock, Target(wl.proc.pid))
        sess = LiveSession([src], clock, {"target": {"pid": wl.proc.pid}},
                           recorder=Recorder(RecordingWriter(str(path), {})), processors=[ThreadStateProcessor()])
        sess.start()
        time.sleep(seconds)
        sess.stop()
    finally:
        wl.stop()
    size = path.stat().st_size
    by_kind: dict[str, int] = {}
    with RecordingReader(str(path)) as rd:
        for smp in rd.all_samples():
            by_kind[smp.kind] = by_kind.get(smp.kind, 0) + len(json.dumps(smp.data))
    path.unlink()
    return {"workload": script, "seconds": seconds, "bytes": size, "bytes_per_min": size / seconds * 60,
            "raw_json_bytes_by_kind": by_kind}


def mr(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.2f} ± {sd:.2f} ({min(xs):.2f}..{max(xs):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--modes", default="launch,gpu")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--phase", type=float, default=6.0)
    ap.add_argument("--rate", type=int, default=20)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--subprocess-every", type=int, default=5)
    ap.add_argument("--cost-matrix", action="store_true")
    ap.add_argument("--twin", action="store_true", help="two targets side by side, watched in turn")
    ap.add_argument("--pin", default="2,3", help="the CPUs of the two twin targets")
    ap.add_argument("--recording", type=float, default=0.0, metavar="S")
    a = ap.parse_args()
    out = pathlib.Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    results = {"args": vars(a), "cpus": os.cpu_count(), "python": sys.version.split()[0], "slowdown": [], "matrix": []}
    lines = [f"Stack source at rate {a.rate} Hz, {a.window} s windows, children every {a.subprocess_every} windows' time; "
             + (f"twin targets on CPUs {a.pin}, each watched {a.pairs} times for {a.phase:.0f} s in turn"
              if a.twin else f"{a.pairs} attached phases of {a.phase:.0f} s between detached ones")
             + f"; {os.cpu_count()} CPUs.", "",
             "| target loop | detached steps/s (twin: the unwatched one) | attached steps/s | "
             "slowdown % per pair: mean ± sd (range) | "
             "py-spy CPU % | sampler CPU % | processor CPU % |", "|---|---|---|---|---|---|---|"]
    for mode in [m for m in a.modes.split(",") if m]:
        if mode in ("gpu", "cuda-launch") and not cuda:
            print(f"mode {mode} skipped: no CUDA here")
            continue
        print(f"mode {mode}: {a.pairs} pairs of {a.phase} s{' (twin)' if a.twin else ''}", flush=True)
        if a.twin:
            cpus = tuple(int(c) for c in a.pin.split(","))
            r = twin_slowdown(mode, a.pairs, a.phase, a.rate, a.window, a.subprocess_every, cpus)
            lines.append(f"| {mode} (twin, CPUs {a.pin}) | {mr(r['unwatched_rate'])} | {mr(r['watched_rate'])} | "
                         f"{mr(r['slowdown_pct'])}; 95% CI {r['ci95_pct']} | "
                         f"{mr(r['pyspy_pct'])} | {mr(r['sampler_pct'])} | {mr(r['processor_pct'])} |")
        else:
            r = slowdown(mode, a.pairs, a.phase, a.rate, a.window, a.subprocess_every)
            r["ci95_pct"] = ci95(r["slowdown_pct"])
            lines.append(f"| {mode} | {mr(r['detached_rate'])} | {mr(r['attached_rate'])} | {mr(r['slowdown_pct'])}; "
                         f"95% CI {r['ci95_pct']} | {mr(r['pyspy_pct'])} | {mr(r['sampler_pct'])} | {mr(r['processor_pct'])} |")
        results["slowdown"].append(r)
        print(lines[-1], flush=True)
    if a.cost_matrix:
        settings = [(10, 2, 5), (20, 2, 5), (20, 2, 0), (20, 2, 1), (20, 5, 5), (50, 2, 5)]
        results["matrix"] = cost_matrix(settings, 15.0)
        lines += ["", "CPU by setting (DataLoader target: main + 2 workers; 15 s each; % of one core):", "",
                  "| rate Hz | window s | children every Nth window | py-spy % | sampler % | processor % | effective Hz |",
                  "|---|---|---|---|---|---|---|"]
        for m in results["matrix"]:
            lines.append(f"| {m['rate']} | {m['window']} | {m['subprocess_every']} | {m['pyspy_pct']:.2f} | "
                         f"{m['sampler_pct']:.2f} | {m['processor_pct']:.2f} | {m['rate_eff']} |")
    if a.recording > 0:
        results["recording"] = [
            recording_size("stacks_dataloader.py", ["--workers", "2", "--batch", "8", "--sample-ms", "2",
                                                    "--step-ms", "8"], a.recording, out),
            recording_size("stacks_gil.py", ["--spinners", "3", "--sleeper"], a.recording, out)]
        lines += ["", "Recording size of the stack source alone (zlib'd chunks, thread_state included):", "",
                  "| target | KiB per minute | raw JSON by kind (bytes, before compression) |", "|---|---|---|"]
        for r in results["recording"]:
            lines.append(f"| {r['workload']} | {r['bytes_per_min'] / 1024:.0f} | {r['raw_json_bytes_by_kind']} |")
    table = "\n".join(lines)
    print(table)
    (out / "stacks_overhead.md").write_text(table + "\n")
    (out / "stacks_overhead.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
