"""How right is gputop's GIL wait (and data / sync wait)? Against ground truth measured inside
the workload, over exactly the same window.

    python benchmarks/gil_accuracy.py OUT_DIR [--repeats 3] [--duration 12] [--warmup 4]
                                      [--cases gil,data,sync] [--rate 20] [--window 2]
                                      [--kernel-rate HZ]   (default: the source's DEFAULT_KERNEL_RATE_HZ)

Cases (tests/workloads/stacks_gil.py, stacks_dataloader.py):
  spin0 / spin1 / spin3: main thread pure Python + 0, 1, 3 pure-Python spinners + a sleeper;
  hash2: main thread pure Python + 2 threads hashing 32 MiB buffers with hashlib + a sleeper;
  data:  a CPU DataLoader (2 workers) loop measuring its own time in next(iterator) (needs torch);
  sync:  the same on CUDA with loss.item() every step, measuring time in .item() (needs CUDA).

Truth per thread over the window [a, b] (all from the workload's own counters):
  GIL wait = (wall - cpu - runq) / wall for threads that never block otherwise (main, spinners,
  hashers); (sleep overshoot - runq) / wall for the sleeper. ``issue`` = (wall - thread_time) /
  wall, the check the issue names, equals GIL wait + run-queue wait: on an idle machine the two
  agree; on a loaded one compare it with gputop's gil + cpu_wait.
Prints a table; writes OUT_DIR/gil_accuracy.json and OUT_DIR/gil_accuracy.md.
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

from gputop.derive.threads import aggregate, thread_states  # noqa: E402
from gputop.sources.stacks import DEFAULT_KERNEL_RATE_HZ, KIND_STACKS, KIND_THREAD_KERNEL, StackSource  # noqa: E402
from gputop.sources.target import Target  # noqa: E402

WORKLOADS = ROOT / "tests" / "workloads"
GIL_CASES = {
    "spin0": ["--spinners", "0", "--sleeper"],
    "spin1": ["--spinners", "1", "--sleeper"],
    "spin3": ["--spinners", "3", "--sleeper"],
    "hash2": ["--hashers", "2", "--sleeper"],
}
DATA_ARGS = ["--workers", "2", "--batch", "8", "--sample-ms", "2", "--step-ms", "8"]
SYNC_ARGS = ["--workers", "2", "--batch", "8", "--sample-ms", "1", "--step-ms", "2", "--device", "cuda",
             "--sync", "--gpu-matmuls", "40"]


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


class Workload:
    """A workload process in its own session, its JSON lines collected on a thread."""

    def __init__(self, script: str, args: list[str]):
        self.proc = subprocess.Popen([sys.executable, str(WORKLOADS / script), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[dict] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def wait_first(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while not self.lines:
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"workload gave no output: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.05)

    def at(self, mono: float) -> dict:
        return min(self.lines, key=lambda d: abs(d["mono"] - mono))

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def measure(script: str, args: list[str], warmup: float, duration: float, rate: int, window: int,
            kernel_rate: float = DEFAULT_KERNEL_RATE_HZ) -> dict:
    wl = Workload(script, [*args, "--duration", str(warmup + duration + 60)])
    try:
        wl.wait_first()
        time.sleep(1.0)  # workers forked, threads started
        clock = Clock()
        got: list = []
        src = StackSource(clock, Target(wl.proc.pid), rate_hz=rate, window_s=window, kernel_rate_hz=kernel_rate)
        src.start(got.append)
        time.sleep(warmup + duration)
        src.stop()
        wl.proc.send_signal(signal.SIGSTOP)  # freeze the counters; lines up to now are in
        time.sleep(0.3)
    finally:
        wl.stop()
    kern = [s for s in got if s.kind == KIND_THREAD_KERNEL and s.data["t0"] >= warmup]
    if not kern:
        raise RuntimeError("no kernel samples")
    a, b = min(s.data["t0"] for s in kern), max(s.t for s in kern)
    stacks = [s for s in got if s.kind == KIND_STACKS and s.data["t0"] >= a - 0.5 and s.t <= b + 0.5]
    states = thread_states(aggregate(stacks, kern), native_min_cpu=0.0)
    health = [s.data for s in got if s.kind == "health"]
    la, lb = wl.at(clock.t0 + a), wl.at(clock.t0 + b)
    return {"states": states, "a": la, "b": lb, "health": health[-1] if health else None,
            "n_stacks": len(stacks), "n_kernel": len(kern)}


def gil_rows(case: str, m: dict) -> list[dict]:
    la, lb = m["a"], m["b"]
    wall = lb["mono"] - la["mono"]
    by_tid = {d["tid"]: d for d in m["states"] if d["pid"] == lb["pid"]}
    rows = []
    for name, tb in lb["threads"].items():
        ta = la["threads"].get(name)
        st = by_tid.get(tb["tid"])
        if ta is None or st is None or wall <= 0:
            continue
        dcpu, drunq = tb["cpu"] - ta["cpu"], tb["runq"] - ta["runq"]
        if name == "sleeper":
            truth = (tb["overshoot"] - ta["overshoot"] - drunq) / wall
            issue = truth + drunq / wall
        else:
            truth = (wall - dcpu - drunq) / wall
            tt = (tb["thread_time"] - ta["thread_time"]) if name == "main" else dcpu
            issue = (wall - tt) / wall
        g = st["gil_pct"]
        rows.append({"case": case, "thread": name, "truth_gil": round(100 * truth, 1), "gputop_gil": g,
                     "err": None if g is None else round(g - 100 * truth, 1),
                     "truth_issue": round(100 * issue, 1),
                     "gputop_gil_cpuwait": None if g is None else round(g + (st["cpu_wait_pct"] or 0), 1),
                     "runq": round(100 * drunq / wall, 1), "idle": st["idle_pct"], "running": st["running_pct"]})
    return rows


def wait_rows(case: str, m: dict, field: str, state: str) -> list[dict]:
    la, lb = m["a"], m["b"]
    wall = lb["mono"] - la["mono"]
    main = next((d for d in m["states"] if d["role"] == "main"), None)
    if main is None or wall <= 0:
        return []
    truth = (lb[field] - la[field]) / wall
    g = main[f"{state}_pct"]
    return [{"case": case, "thread": "main", "truth_gil": round(100 * truth, 1), "gputop_gil": g,
             "err": None if g is None else round(g - 100 * truth, 1), "truth_issue": None,
             "gputop_gil_cpuwait": None, "runq": None, "idle": main["idle_pct"], "running": main["running_pct"],
             "what": state}]


def fmt_range(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    return f"{statistics.fmean(xs):5.1f} ({min(xs):.1f}..{max(xs):.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--cases", default="gil,data,sync")
    ap.add_argument("--rate", type=int, default=20)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--kernel-rate", type=float, default=DEFAULT_KERNEL_RATE_HZ,
                    help="kernel wait sampler reads per thread per second (default %(default)s)")
    a = ap.parse_args()
    if not a.kernel_rate > 0:
        ap.error("--kernel-rate must be positive")
    out = pathlib.Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    want = set(a.cases.split(","))
    plan: list[tuple[str, str, list[str], str | None]] = []
    if "gil" in want:
        plan += [(c, "stacks_gil.py", args, None) for c, args in GIL_CASES.items()]
    try:
        import torch
        have_torch, have_cuda = True, torch.cuda.is_available()
    except ImportError:
        have_torch = have_cuda = False
    if "data" in want:
        if have_torch:
            plan.append(("data", "stacks_dataloader.py", DATA_ARGS, "data"))
        else:
            print("data case skipped: torch is not installed")
    if "sync" in want:
        if have_cuda:
            plan.append(("sync", "stacks_dataloader.py", SYNC_ARGS, "cuda"))
        else:
            print("sync case skipped: no CUDA here")
    rows: list[dict] = []
    health = []
    for rep in range(a.repeats):
        for case, script, args, state in plan:
            m = measure(script, args, a.warmup, a.duration, a.rate, a.window, a.kernel_rate)
            got = gil_rows(case, m) if state is None else wait_rows(
                case, m, "next_s" if state == "data" else "sync_s", state)
            for r in got:
                r["repeat"] = rep
            rows += got
            health.append({"case": case, "repeat": rep, **(m["health"] or {})})
            print(f"  rep {rep} {case}: " + ", ".join(
                f"{r['thread']} truth {r['truth_gil']} gputop {r['gputop_gil']}" for r in got), flush=True)
    # Table: one line per (case, thread), mean (range) over repeats.
    keys = []
    for r in rows:
        k = (r["case"], r["thread"])
        if k not in keys:
            keys.append(k)
    lines = ["| case | thread | measures | truth % | gputop % | error pp (max abs) | (wall-thread_time)/wall % | gputop gil+cpu_wait % | idle % |",
             "|---|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for k in keys:
        rs = [r for r in rows if (r["case"], r["thread"]) == k]
        errs = [r["err"] for r in rs if r["err"] is not None]
        mx = max((abs(e) for e in errs), default=None)
        if mx is not None:
            worst = max(worst, mx)
        what = rs[0].get("what", "gil")
        lines.append(f"| {k[0]} | {k[1]} | {what} | {fmt_range([r['truth_gil'] for r in rs])} | "
                     f"{fmt_range([r['gputop_gil'] for r in rs])} | {fmt_range(errs)} (max {mx}) | "
                     f"{fmt_range([r['truth_issue'] for r in rs])} | {fmt_range([r['gputop_gil_cpuwait'] for r in rs])} | "
                     f"{fmt_range([r['idle'] for r in rs])} |")
    costs = [(h.get("pyspy_cpu_pct"), h.get("sampler_cpu_pct")) for h in health]
    footer = (f"\n{a.repeats} repeats x {a.duration:.0f} s windows (after {a.warmup:.0f} s warm-up), py-spy {a.rate} Hz, "
              f"{a.window} s windows, kernel sampler {a.kernel_rate:g} Hz; machine: {os.cpu_count()} CPUs, Python "
              f"{sys.version.split()[0]}. Worst |error|: {worst:.1f} pp. gputop's own CPU (last health): py-spy "
              f"{fmt_range([c[0] for c in costs])} %, sampler {fmt_range([c[1] for c in costs])} % of one core.")
    table = "\n".join(lines) + "\n" + footer
    print(table)
    (out / "gil_accuracy.md").write_text(table + "\n")
    (out / "gil_accuracy.json").write_text(json.dumps({"rows": rows, "health": health, "args": vars(a)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
