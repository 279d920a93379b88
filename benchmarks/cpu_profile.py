"""Where gputop's own CPU goes, by component, attached headless to a real busy Python process.

    python benchmarks/cpu_profile.py OUTDIR [--seconds 30] [--scenario cpu_work] [--warmup 6]
                                     [--gputop-args "..."] [--label NAME] [--no-profile]
                                     [--compare OTHER_CHECKOUT ...]

Starts ``python -m gputop.demo.workload --scenario cpu_work`` (CPU torch work on its main thread;
``--scenario python`` needs no torch), attaches ``python -m gputop --pid W --headless`` and, after
``--warmup`` seconds of start-up, measures over ``--seconds``:

- **per thread** of gputop: utime+stime from /proc/G/task/*/stat, by the kernel name gputop gives
  each of its threads (``gputop-stacks``: py-spy's windows, their parsing and the ~50 Hz kernel
  wait sampler; ``gputop-host``: /proc walking; ``gputop-nvml-*``: NVML/GPM; ``gputop-derive``:
  derivations and verdicts; ``gputop-recorder``; the main thread: the headless loop);
- **py-spy's processes**: the CPU of gputop's reaped children (cutime+cstime of /proc/G/stat)
  plus the live ones (psutil), counted from the start of the window;
- **inside the threads**: a ``py-spy record --nonblocking`` of gputop itself (on-CPU samples
  only), each sample charged to the innermost frame in gputop's own code, then scaled so each
  thread's components add up to the thread's measured CPU.

``--compare DIR`` attaches the gputop of another checkout (``git worktree add DIR HEAD~2``, or
``git archive REV | tar -x -C DIR``) to the same target at the same time, so a before/after is
measured under the same load (a shared box's load moves more than the change does).
Prints % of one core per component and writes OUTDIR/cpu_profile-<label>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROFILE_HZ = 47   # not a divisor of gputop's own periods, so it cannot lock onto them

# Innermost gputop module (and function) of a sample -> the component it is charged to.
COMPONENTS = [
    (r"sources/speedscope\.py", "py-spy output parsing"),
    (r"sources/stacks\.py:_finish_window", "py-spy output parsing"),
    (r"sources/stacks\.py:_spawn|sources/pyspy\.py", "py-spy spawn/reap"),
    (r"sources/stacks\.py:_refresh_tree|sources/stacks\.py:_samples_every_window", "kernel-wait tree refresh"),
    (r"sources/kernel_wait\.py:harvest|sources/stacks\.py:_emit_kernel", "kernel-wait harvest"),
    (r"sources/kernel_wait\.py", "kernel-wait sampler (ticks)"),
    (r"sources/stacks\.py", "stacks loop"),
    # a thread asleep between ticks: py-spy's idle test misses part of it, so this is an upper
    # bound of the wake-ups' cost
    (r"sources/base\.py:_nap", "sleeping between ticks (wake-ups)"),
    (r"sources/(host|host_procs|procfs|system|cgroups|ranks|target)\.py", "/proc walking (host)"),
    (r"sources/(nvml|nvml_gpu|nvml_slow|gpm|nvml_errors|nvml_fields)\.py", "NVML/GPM"),
    (r"sources/probe", "probe client"),
    (r"derive/budget|derive/moments|derive/stalls|derive/phases", "derive: time budget"),
    (r"derive/threads|derive/frame_rules", "derive: thread states"),
    (r"derive/", "derive: other"),
    (r"verdicts/", "verdicts"),
    (r"session/(recorder|recording)", "recorder"),
    (r"session/store\.py", "bus/store"),
    (r"session/", "session loop"),
    (r"export/", "exporter"),
    (r"ui/", "ui"),
]
_COMPILED = [(re.compile(p), name) for p, name in COMPONENTS]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")


class RateReader(threading.Thread):
    """The workload's own 'rate <steps/s> <total>' lines."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(daemon=True)
        self.proc, self.rates = proc, []

    def run(self):
        for line in self.proc.stdout:
            bits = line.split()
            if len(bits) == 3 and bits[0] == "rate":
                self.rates.append((time.monotonic(), float(bits[1])))


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{tid: (kernel name, CPU seconds)} of every thread of pid."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        f = raw[raw.rindex(")") + 2:].split()
        out[int(tid)] = (name, (int(f[11]) + int(f[12])) / CLK_TCK)
    return out


def python_thread_names(pyspy: str, pid: int) -> dict[int, str]:
    """{tid: Python thread name} from one ``py-spy dump``: names for a gputop that does not give
    its threads kernel names (an older version)."""
    try:
        out = subprocess.run([pyspy, "dump", "--json", "--nonblocking", "-p", str(pid)], capture_output=True,
                             text=True, timeout=30).stdout
        return {int(t["os_thread_id"]): _os_name(str(t.get("thread_name") or "?"))
                for t in json.loads(out) if t.get("os_thread_id")}
    except (OSError, subprocess.SubprocessError, ValueError, TypeError, KeyError):
        return {}


def children_cpu(pid: int) -> tuple[float, dict[int, float]]:
    """(CPU seconds of pid's reaped children, {live child pid: its CPU seconds})."""
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    f = raw[raw.rindex(")") + 2:].split()
    reaped = (int(f[13]) + int(f[14])) / CLK_TCK
    live = {}
    try:
        for c in psutil.Process(pid).children(recursive=True):
            try:
                t = c.cpu_times()
                live[c.pid] = t.user + t.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return reaped, live


def component_of(stack: list[str]) -> tuple[str, str]:
    """(component, innermost gputop frame) of one sample, root first."""
    for frame in reversed(stack):
        m = _FRAME.match(frame)
        if not m:
            continue
        path = m["file"].replace("\\", "/")
        i = path.rfind("/gputop/")
        if i < 0:
            continue
        where = f"{path[i + 8:]}:{m['func'].split('.')[-1]}"
        for rx, name in _COMPILED:
            if rx.search(where):
                return name, where
        return "other gputop code", where
    return "outside gputop code (interpreter, stdlib)", ""


def parse_raw(path: str) -> dict[str, dict]:
    """py-spy's raw output (``thread (TID): name;frame;...;frame COUNT``) -> {thread name:
    {"n": samples, "components": {name: n}, "frames": {innermost gputop frame: n}}}."""
    threads: dict[str, dict] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return threads
    for line in lines:
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        parts = head.split(";")
        first, _, tname = parts[0].partition("): ")
        if not first.startswith("thread ("):
            tname = "?"
        comp, where = component_of(parts[1:])
        t = threads.setdefault(tname, {"n": 0, "components": {}, "frames": {}})
        n = int(count)
        t["n"] += n
        t["components"][comp] = t["components"].get(comp, 0) + n
        if where:
            t["frames"][where] = t["frames"].get(where, 0) + n
    return threads


def _os_name(py_name: str) -> str:
    return "MainThread" if py_name == "MainThread" else py_name[:15]


def _split(g_pid: int, dt: float, t0: dict, t1: dict, names: dict[int, str]) -> dict:
    """One gputop's CPU over the window: per thread, py-spy children, total (% of one core)."""
    th0, (reaped0, live0), own0 = t0["threads"], t0["children"], t0["own"]
    th1, (reaped1, live1), own1 = t1["threads"], t1["children"], t1["own"]
    # py-spy: children reaped in the window (their whole life, less what they had used before
    # it) plus the part of the live ones' CPU used in it.
    pyspy_s = (reaped1 - reaped0) - sum(c for pid, c in live0.items() if pid not in live1)
    pyspy_s += sum(c - live0.get(pid, 0.0) for pid, c in live1.items())
    per_thread: dict[str, float] = {}
    for tid, (name, c1) in th1.items():
        c0 = th0.get(tid, (name, 0.0))[1]
        key = "MainThread" if tid == g_pid else name if name.startswith("gputop-") else names.get(tid, name)
        per_thread[key] = per_thread.get(key, 0.0) + c1 - c0
    return {"own_s": own1 - own0, "pyspy_s": pyspy_s,
            "threads_pct": {k: round(100 * v / dt, 2) for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1])}}


def _env_for(tree: str) -> dict:
    """This environment with ``tree``'s gputop first on the path (installed wheels stay)."""
    rest = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": tree + (os.pathsep + rest if rest else "")}


def _reading(pid: int) -> dict:
    t = psutil.Process(pid).cpu_times()
    return {"threads": thread_cpu(pid), "children": children_cpu(pid), "own": t.user + t.system}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--scenario", default="cpu_work")
    ap.add_argument("--gputop-args", default="")
    ap.add_argument("--label", default="headless")
    ap.add_argument("--compare", action="append", default=[], metavar="TREE",
                    help="also attach the gputop of this checkout, at the same time (same load): before/after")
    ap.add_argument("--no-profile", action="store_true", help="only the per-thread and py-spy split")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    extra = shlex.split(a.gputop_args)
    pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(pyspy, os.X_OK):
        print("cpu_profile: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = [("this", here)] + [(f"compare{i}", os.path.abspath(t)) for i, t in enumerate(a.compare)]
    for _n, t in trees[1:]:
        if not os.path.isfile(os.path.join(t, "gputop", "__main__.py")):
            print(f"cpu_profile: {t} is not a gputop checkout", file=sys.stderr)
            return 2

    w = subprocess.Popen([sys.executable, "-m", "gputop.demo.workload", "--scenario", a.scenario,
                          "--report-every", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=_env_for(here))
    reader = RateReader(w)
    reader.start()
    raw_path = os.path.join(a.outdir, f"cpu_profile-{a.label}.raw.txt")
    recs = {n: os.path.join(a.outdir, f"cpu_profile-{a.label}-{n}.gtrec") for n, _t in trees}
    for stale in (raw_path, *recs.values()):
        if os.path.exists(stale):
            os.remove(stale)
    gs: dict[str, subprocess.Popen] = {}
    prof = None
    try:
        time.sleep(3.0)
        if w.poll() is not None:
            print(f"cpu_profile: the workload {a.scenario} exited ({w.returncode})", file=sys.stderr)
            return 1
        for n, tree in trees:
            gs[n] = subprocess.Popen([sys.executable, "-m", "gputop", "--pid", str(w.pid), "--headless", "--duration",
                                      str(a.warmup + a.seconds + 4), "--record", recs[n], "--json", *extra],
                                     cwd=tree, env=_env_for(tree),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(a.warmup)
        for n, g in gs.items():
            if g.poll() is not None:
                print(f"cpu_profile: gputop [{n}] exited ({g.returncode}): {g.stderr.read()[-400:]}", file=sys.stderr)
                return 1
        g = gs["this"]
        if not a.no_profile:
            prof = subprocess.Popen([pyspy, "record", "--nonblocking", "--threads", "-f", "raw", "--full-filenames",
                                     "-r", str(PROFILE_HZ), "-d", str(int(a.seconds)), "-o", raw_path,
                                     "-p", str(g.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        names = {n: python_thread_names(pyspy, gg.pid) for n, gg in gs.items()}
        t0 = time.monotonic()
        r0 = {n: _reading(gg.pid) for n, gg in gs.items()}
        time.sleep(a.seconds)
        t1 = time.monotonic()
        r1 = {n: _reading(gg.pid) for n, gg in gs.items()}
        if prof is not None:
            prof.wait(timeout=30)
        for gg in gs.values():
            gg.wait(timeout=120)
    finally:
        for p in (prof, *gs.values(), w):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    dt = t1 - t0
    rates = [r for t, r in reader.rates if t0 <= t <= t1]
    splits = {n: _split(gs[n].pid, dt, r0[n], r1[n], names[n]) for n in gs}
    me = splits["this"]
    pct = me["threads_pct"]

    # Inside the threads: each thread's measured CPU split by its profile's shares.
    profile = parse_raw(raw_path) if prof is not None else {}
    components: dict[str, float] = {"py-spy processes": round(100 * me["pyspy_s"] / dt, 2)}
    frames: dict[str, float] = {}
    for py_name, t in profile.items():
        cpu_pct = pct.get(_os_name(py_name))
        if cpu_pct is None or not t["n"]:
            continue
        for comp, n in t["components"].items():
            key = comp if not comp.startswith(("other", "outside", "sleeping")) else f"{comp} [{_os_name(py_name)}]"
            components[key] = components.get(key, 0.0) + cpu_pct * n / t["n"]
        for where, n in t["frames"].items():
            frames[where] = frames.get(where, 0.0) + cpu_pct * n / t["n"]

    def totals(sp):
        return {"total_pct_of_core": round(100 * (sp["own_s"] + sp["pyspy_s"]) / dt, 2),
                "gputop_process_pct": round(100 * sp["own_s"] / dt, 2),
                "pyspy_children_pct": round(100 * sp["pyspy_s"] / dt, 2), "threads_pct": sp["threads_pct"]}

    summary = {
        "label": a.label, "scenario": a.scenario, "gputop_args": extra, "seconds": round(dt, 2),
        "cpu_count": os.cpu_count(), "loadavg": os.getloadavg(),
        "target_steps_per_s": round(statistics.mean(rates), 3) if rates else None,
        **totals(me),
        "components_pct": {k: round(v, 2) for k, v in sorted(components.items(), key=lambda kv: -kv[1])},
        "top_frames_pct": {k: round(v, 3) for k, v in sorted(frames.items(), key=lambda kv: -kv[1])[:25]},
        "profile_samples": {k: v["n"] for k, v in profile.items()},
        "compared": {tree: totals(splits[n]) for n, tree in trees[1:]},
        "gputop_stderr_tail": (gs["this"].stderr.read()[-400:] if gs["this"].stderr else ""),
    }
    with open(os.path.join(a.outdir, f"cpu_profile-{a.label}.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"\ncpu_profile [{a.label}] gputop --headless {' '.join(extra)} on {a.scenario}, {dt:.0f} s, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, target {summary['target_steps_per_s']} steps/s")
    for n, tree in trees:
        tt = totals(splits[n])
        print(f"[{'this checkout' if n == 'this' else tree}] total {tt['total_pct_of_core']:.2f}% of one core = "
              f"gputop process {tt['gputop_process_pct']}% + py-spy children {tt['pyspy_children_pct']}%")
        print("  by thread: " + "  ".join(f"{k} {v:.2f}" for k, v in tt["threads_pct"].items() if v > 0))
    if profile:
        print("  by component (% of one core; threads split by a py-spy profile of gputop):")
        for k, v in summary["components_pct"].items():
            if v >= 0.05:
                print(f"    {k:<48} {v:6.2f}")
        print("  top gputop frames:")
        for k, v in list(summary["top_frames_pct"].items())[:10]:
            print(f"    {k:<60} {v:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
