"""What the in-process probe costs a training loop with short (~5 ms) steps.

    python benchmarks/probe_overhead.py OUT_DIR [--device cuda|cpu] [--kinds gpu,host,host+item]
                                                [--step-ms 5] [--reps 5] [--phase-s 2]

One process runs a real training loop (a DataLoader feeding an MLP, optimizer step each
iteration) and alternates, ``--reps`` times and in rotating order, three conditions:

- ``off``: no probe (``gputop.probe.uninstall()`` restores torch exactly);
- ``idle``: probe installed, no monitor attached (what every job started by ``gputop run``
  pays when nobody watches);
- ``monitored``: probe installed and a real monitor (a separate process running gputop's
  ProbeClientSource) attached, so windows are sent, CUDA events are recorded at every step and
  sync counting is on.

Each phase runs a fixed number of steps (calibrated to ``--phase-s``), timed with a device
synchronize at its start and end only. Overhead = step time of the condition / step time of
the ``off`` phase of the same repetition - 1; the table gives the mean and the min..max over
repetitions. Loop kinds:

- ``gpu``: GPU-bound steps (a wide MLP in bf16 autocast, batch calibrated to ``--step-ms``);
- ``host``: launch/host-bound steps (a deep, narrow MLP: many small kernels, depth
  calibrated to ``--step-ms``) -- here every microsecond the hooks cost shows.
A ``+item`` suffix (``host+item``) adds ``loss.item()`` each step (one implicit sync per step, as
logging loops do): the monitored condition then also pays for counting that sync.

Writes OUT_DIR/probe_overhead.json and prints a table. Goal (issue 4): <= 0.5% of step time.
On CPU (no CUDA) the ``gpu`` kind is replaced by a compute-bound CPU MLP.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

MONITOR = r"""
import sys, time, json
from gputop.session.session import SessionClock
from gputop.sources.target import Target
from gputop.sources.probe_client import ProbeClientSource
counts = {}
def emit(s):
    counts[s.kind] = counts.get(s.kind, 0) + 1
src = ProbeClientSource(SessionClock(), Target(int(sys.argv[1])), probe_dirs=[sys.argv[2]])
src.start(emit)
sys.stdin.read()
src.stop()
print(json.dumps(counts))
"""


def build(kind: str, device: str, step_ms: float, use_item: bool):
    import torch
    import torch.utils.data as tud

    torch.manual_seed(0)
    cuda = device == "cuda"
    in_dim = 256
    n_rows = 1 << 15

    def make(width: int, depth: int, batch: int):
        layers = [torch.nn.Linear(in_dim, width), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers += [torch.nn.Linear(width, 1)]
        model = torch.nn.Sequential(*layers).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
        xs = torch.randn(n_rows, in_dim)
        ys = torch.randn(n_rows, 1)
        ds = tud.TensorDataset(xs, ys)
        sampler = tud.BatchSampler(tud.RandomSampler(ds, replacement=True, num_samples=1 << 30), batch, drop_last=True)
        loader = tud.DataLoader(ds, batch_size=None, sampler=sampler, pin_memory=cuda)
        amp = torch.autocast(device, dtype=torch.bfloat16) if (kind == "gpu" and cuda) else None
        return model, opt, loader, amp

    def runner(model, opt, loader, amp):
        it = iter(loader)

        def step():
            x, y = next(it)
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            if amp is not None:
                with torch.autocast(device, dtype=torch.bfloat16):
                    out = model(x)
            else:
                out = model(x)
            loss = ((out.float() - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if use_item:
                loss.item()
        return step

    def timed(step, n: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    # Calibrate the size so one step takes about step_ms.
    if kind == "gpu":
        width, depth, batch = (8192, 4, 256) if cuda else (512, 3, 64)
        for _ in range(6):
            parts = make(width, depth, batch)
            step = runner(*parts)
            timed(step, 5)
            ms = timed(step, 20) * 1000
            if abs(ms - step_ms) / step_ms < 0.1:
                break
            batch = max(8, int(batch * step_ms / ms))
        desc = f"MLP width {width} depth {depth} batch {batch}" + (" bf16 autocast" if cuda else "")
    else:
        width, depth, batch = 64, 8, 64
        for _ in range(6):
            parts = make(width, depth, batch)
            step = runner(*parts)
            timed(step, 5)
            ms = timed(step, 20) * 1000
            if abs(ms - step_ms) / step_ms < 0.1:
                break
            depth = max(2, int(depth * step_ms / ms))
        desc = f"MLP width {width} depth {depth} batch {batch} (many small kernels)"
    return step, timed, ms, desc


def micro(device: str, conds: list[str], monitored_dir: str, idle_dir: str) -> dict:
    """Per-call cost of the two hot-path hooks, without a training loop's noise: the minimum
    over 5 rotations x 3 repeats of 2000 calls of next() on a trivial DataLoader and of
    optimizer.step() on an optimizer with one tiny parameter; cost = condition minus off."""
    import timeit

    import torch
    import torch.utils.data as tud

    class Same(tud.IterableDataset):
        def __iter__(self):
            x = torch.zeros(8, 4)
            while True:
                yield x

    w = torch.zeros(4, device=device, requires_grad=True)
    w.grad = torch.zeros(4, device=device)
    opt = torch.optim.SGD([w], lr=0.0)
    best = {c: {"next_us": float("inf"), "step_us": float("inf")} for c in conds}
    it = iter(tud.DataLoader(Same(), batch_size=None))
    for _ in range(3000):  # warm-up: first calls take slower paths
        next(it)
        opt.step()
    for rep in range(5):  # rotate the order so drift hits every condition alike
        for cond in conds[rep % 3:] + conds[:rep % 3]:
            set_condition(cond, monitored_dir, idle_dir)
            if cond == "monitored":
                opt.step()
                wait_for_cuda_timing()
            it = iter(tud.DataLoader(Same(), batch_size=None))
            nxt = min(timeit.repeat(lambda: next(it), number=2000, repeat=3)) / 2000
            stp = min(timeit.repeat(opt.step, number=2000, repeat=3)) / 2000
            if device == "cuda":
                torch.cuda.synchronize()
            best[cond]["next_us"] = min(best[cond]["next_us"], nxt * 1e6)
            best[cond]["step_us"] = min(best[cond]["step_us"], stp * 1e6)
    out = best
    set_condition("off", monitored_dir, idle_dir)
    for cond in conds:
        out[cond]["next_cost_us"] = round(out[cond]["next_us"] - out["off"]["next_us"], 2)
        out[cond]["step_cost_us"] = round(out[cond]["step_us"] - out["off"]["step_us"], 2)
        out[cond]["next_us"] = round(out[cond]["next_us"], 2)
        out[cond]["step_us"] = round(out[cond]["step_us"], 2)
    return out


def hot_path_us() -> dict:
    """The probe's own Python per step and per batch, timed alone (min of 7 x 20000 calls):
    robust to a noisy machine, and what the training thread pays without CUDA events."""
    import timeit

    import torch

    from gputop.probe import core
    from gputop.probe.torch_hooks import TorchHooks
    p = core.Probe(dormant=False, origin="bench")   # never started: no socket, no thread
    p.torch, p.torch_hooks = torch, TorchHooks(p, torch)

    class It:
        _index_sampler, _auto_collation = None, True
    it, batch, n = It(), [torch.zeros(8, 4), torch.zeros(8)], 20000
    base = min(timeit.repeat(lambda: None, number=n, repeat=7)) / n
    step = min(timeit.repeat(p.on_marker_step, number=n, repeat=7)) / n
    bat = min(timeit.repeat(lambda: p.on_batch(it, 1.0, 1.001, batch), number=n, repeat=7)) / n
    return {"per_step_us": round((step - base) * 1e6, 3), "per_batch_us": round((bat - base) * 1e6, 3)}


def set_condition(cond: str, monitored_dir: str, idle_dir: str) -> dict:
    import gputop.probe
    from gputop.probe import wire
    gputop.probe.uninstall()
    if cond == "off":
        return {}
    os.environ[wire.ENV_DIR] = monitored_dir if cond == "monitored" else idle_dir
    gputop.probe.install()
    if cond == "monitored":
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not gputop.probe.status().get("monitoring"):
            time.sleep(0.02)
        if not gputop.probe.status().get("monitoring"):
            raise SystemExit("the monitor did not attach within 15 s")
    return {}


def wait_for_cuda_timing(timeout: float = 4.0) -> None:
    """With CUDA, the probe switches events and sync counting on at its next window once the
    job has used CUDA: wait for that, so the whole monitored phase pays for them."""
    import torch

    import gputop.probe
    if not torch.cuda.is_initialized():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hooks = gputop.probe.status().get("hooks", {})
        ev, sy = hooks.get("cuda_events", ["", ""]), hooks.get("syncs", ["", ""])
        settled = sy[0] in ("on", "failed", "unavailable") or sy[1].startswith("the job")
        if ev[0] == "on" and settled:
            return
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--kinds", default="gpu,host,host+item")
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--phase-s", type=float, default=2.0)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    import torch

    import gputop.probe
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tmp = tempfile.mkdtemp(prefix="gpo-")
    monitored_dir, idle_dir = os.path.join(tmp, "m"), os.path.join(tmp, "i")
    mon = subprocess.Popen([sys.executable, "-c", MONITOR, str(os.getpid()), monitored_dir],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    results = {"machine": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
               "device": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine()),
               "step_ms_target": args.step_ms, "reps": args.reps, "phase_s": args.phase_s,
               "kinds": {}}
    conds = ["off", "idle", "monitored"]
    if device == "cpu":
        torch.set_num_threads(1)  # steadier timing on a shared machine
    try:
        results["hot_path"] = hot_path_us()
        print("probe's own Python on the training thread (us):", json.dumps(results["hot_path"]), flush=True)
        results["micro"] = micro(device, conds, monitored_dir, idle_dir)
        print("per-call cost (us):", json.dumps(results["micro"]), flush=True)
        for kind in args.kinds.split(","):
            base, _, extra = kind.partition("+")
            step, timed, ms, desc = build(base, device, args.step_ms, extra == "item")
            if extra == "item":
                desc += ", loss.item() each step"
            n = max(50, int(args.phase_s * 1000 / ms))
            print(f"{kind}: {desc}: {ms:.2f} ms/step, {n} steps per phase", flush=True)
            per = {c: [] for c in conds}
            probe_cpu = {c: [] for c in conds}
            hooks_seen = None
            set_condition("off", monitored_dir, idle_dir)
            timed(step, max(20, n // 5))  # warm-up
            for rep in range(args.reps):
                order = conds[rep % 3:] + conds[:rep % 3]
                for cond in order:
                    set_condition(cond, monitored_dir, idle_dir)
                    if cond == "monitored":
                        timed(step, 20)
                        wait_for_cuda_timing()
                    probe = gputop.probe._PROBE
                    cpu0, w0 = (probe.thread_cpu_s if probe else 0.0), time.perf_counter()
                    per[cond].append(timed(step, n))
                    if probe is not None:
                        time.sleep(0.6)  # let the probe thread note its CPU time once more
                        probe_cpu[cond].append((probe.thread_cpu_s - cpu0) / (time.perf_counter() - w0) * 100)
                    if cond == "monitored":
                        hooks_seen = {k: v[0] for k, v in gputop.probe.status()["hooks"].items()}
                print(f"  rep {rep + 1}: " + "  ".join(f"{c} {per[c][-1] * 1000:.3f} ms" for c in conds), flush=True)
            set_condition("off", monitored_dir, idle_dir)
            row = {"desc": desc, "steps_per_phase": n, "ms": {c: [round(x * 1000, 4) for x in per[c]] for c in conds},
                   "hooks_when_monitored": hooks_seen}
            for c in ("idle", "monitored"):
                ov = [(per[c][i] / per["off"][i] - 1) * 100 for i in range(args.reps)]
                us = [(per[c][i] - per["off"][i]) * 1e6 for i in range(args.reps)]
                row[f"{c}_overhead_pct"] = {"mean": round(statistics.fmean(ov), 3), "min": round(min(ov), 3),
                                            "max": round(max(ov), 3), "all": [round(x, 3) for x in ov]}
                row[f"{c}_us_per_step"] = round(statistics.fmean(us), 2)
                row[f"{c}_probe_thread_cpu_pct"] = round(statistics.fmean(probe_cpu[c]), 3) if probe_cpu[c] else None
            results["kinds"][kind] = row
    finally:
        gputop.probe.uninstall()
        try:
            out, _ = mon.communicate(input="", timeout=10)
            results["monitor_samples"] = json.loads(out or "{}")
        except Exception as e:
            mon.kill()
            results["monitor_samples"] = f"monitor failed: {e}"
    with open(os.path.join(args.out_dir, "probe_overhead.json"), "w") as f:
        json.dump(results, f, indent=1)
    print()
    print(f"probe overhead on {results['device_name']} ({device}), {args.reps} alternations of "
          f"{args.phase_s:.0f} s phases, target {args.step_ms} ms/step")
    print(f"{'loop':<9} {'step ms (off)':>13} {'idle %':>20} {'monitored %':>20} {'monitored us/step':>18} {'probe thread CPU %':>19}")
    for kind, row in results["kinds"].items():
        off = statistics.fmean(row["ms"]["off"])
        i, m = row["idle_overhead_pct"], row["monitored_overhead_pct"]
        print(f"{kind:<9} {off:>13.3f} {i['mean']:>+7.2f} ({i['min']:+.2f}..{i['max']:+.2f}) "
              f"{m['mean']:>+7.2f} ({m['min']:+.2f}..{m['max']:+.2f}) {row['monitored_us_per_step']:>18.1f} "
              f"{row['monitored_probe_thread_cpu_pct']!s:>19}")
    hp = results.get("hot_path") or {}
    print(f"probe's own Python per step {hp.get('per_step_us')} us, per batch {hp.get('per_batch_us')} us "
          "(without CUDA events)")
    mi = results.get("micro", {})
    for c in ("idle", "monitored"):
        if c in mi:
            print(f"per-call hook cost, {c}: next(DataLoader) +{mi[c]['next_cost_us']:.2f} us, "
                  f"optimizer.step() +{mi[c]['step_cost_us']:.2f} us")
    print(f"monitor received: {results['monitor_samples']}")
    print("hooks while monitored:", {k: r["hooks_when_monitored"] for k, r in results["kinds"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
