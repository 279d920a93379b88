"""Does the probe agree with the training script's own measurements?

    python benchmarks/probe_accuracy.py OUT_DIR [--device cuda|cpu] [--seconds 12]
                                                [--scenarios input_bound,gpu_bound,syncs]

For each scenario, starts a training job with the probe loaded (``launch_with_probe``, the
``gputop run`` path), attaches gputop's real monitor (ProbeClientSource) from this process, and
compares what the probe reported with what the job measured itself:

- steps (exact), mean step time (job: perf_counter after each ``optimizer.step()``), steps/s
  and batches/s in the steady windows, the share of step time blocked in ``next()`` on the
  DataLoader (job: perf_counter around ``next(it)``);
- on CUDA, GPU time per step: the job records its own CUDA events right after ``next()`` returns
  and right after ``optimizer.step()`` (the span the probe's events cover) and reads them all at
  the end; the probe reads its events with ``query()`` while the job runs;
- ``syncs`` scenario (CUDA): each step makes exactly two implicit syncs at known lines
  (``loss.item()`` and ``torch.nonzero``); the probe's syncs per step and hottest line are
  checked against that.

Scenarios: ``input_bound`` (4 DataLoader workers, 2 ms of CPU per sample: the loop waits for
data), ``gpu_bound`` (in-memory batches, a wide MLP), ``syncs`` (gpu_bound plus two syncs/step).
Writes OUT_DIR/probe_accuracy.json, OUT_DIR/probe_<scenario>_<device>.gtrec (what the monitor
received, as a gputop recording: a real fixture for the UI) and prints a table. Goal (issue 4): step time and batches/s
within 2% of the job's own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


# -------------------------------------------------------------------------------- the job
def job(args) -> int:
    import torch
    import torch.utils.data as tud

    import gputop.probe
    dev = args.device
    cuda = dev == "cuda"
    torch.manual_seed(0)
    if not cuda:
        torch.set_num_threads(1)

    class SlowSamples(tud.Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass
            return torch.randn(256), torch.randn(1)

    if args.job == "input_bound":
        loader = tud.DataLoader(SlowSamples(), batch_size=16, num_workers=4, pin_memory=cuda, persistent_workers=True)
        width, depth = (2048, 2) if cuda else (128, 2)
    else:
        xs, ys = torch.randn(1 << 15, 256), torch.randn(1 << 15, 1)
        ds = tud.TensorDataset(xs, ys)
        batch = 1024 if cuda else 64
        sampler = tud.BatchSampler(tud.RandomSampler(ds, replacement=True, num_samples=1 << 30), batch, drop_last=True)
        loader = tud.DataLoader(ds, batch_size=None, sampler=sampler, pin_memory=cuda)
        width, depth = (8192, 3) if cuda else (256, 2)
    layers = [torch.nn.Linear(256, width), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    syncs = args.job == "syncs"

    # Wait for the monitor, then until the probe has switched its CUDA timing on (at its next
    # window once CUDA is in use).
    deadline = time.monotonic() + 60
    while not gputop.probe.status().get("monitoring") and time.monotonic() < deadline:
        time.sleep(0.02)
    if cuda:
        torch.zeros(1, device=dev)  # the model is already there; make sure CUDA is initialised
        deadline = time.monotonic() + 5
        while gputop.probe.status()["hooks"].get("cuda_events", [""])[0] != "on" and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(1.2)

    it = iter(loader)
    steps = batches = 0
    waits, step_times, events = [], [], []
    step_mono, batch_mono = [], []   # when each step ended / each batch arrived (monotonic)
    last = None
    t_end = time.monotonic() + args.seconds
    sync_lines = {}
    while time.monotonic() < t_end:
        t0 = time.perf_counter()
        x, y = next(it)
        wait = time.perf_counter() - t0
        batch_mono.append(time.monotonic())
        batches += 1
        if cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        x = x.to(dev, non_blocking=True)
        y = y.to(dev, non_blocking=True)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=cuda):
            out = model(x)
        loss = ((out.float() - y) ** 2).mean()
        loss.backward()
        if syncs:
            sync_lines.setdefault("item", _line())
            loss.item()                                   # implicit sync 1
            sync_lines.setdefault("nonzero", _line())
            torch.nonzero(out > 0)                        # implicit sync 2
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            ev1 = torch.cuda.Event(enable_timing=True)
            ev1.record()
            events.append((ev0, ev1))
        now = time.perf_counter()
        step_mono.append(time.monotonic())
        steps += 1
        if last is not None:
            step_times.append(now - last)
            waits.append(wait)
        last = now
    gpu_ms = None
    if cuda:
        torch.cuda.synchronize()
        gpu_ms = [a.elapsed_time(b) for a, b in events[1:]]
    result = {"steps": steps, "batches": batches, "step_times": step_times, "waits": waits, "gpu_ms": gpu_ms,
              "step_mono": step_mono, "batch_mono": batch_mono,
              "sync_lines": {k: f"{HERE}:{v + 1}" for k, v in sync_lines.items()}}
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(args.out + ".tmp", args.out)
    deadline = time.monotonic() + 60
    while not os.path.exists(args.hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


def _line() -> int:
    return sys._getframe(1).f_lineno


# -------------------------------------------------------------------------------- the monitor
def save_recording(path: str, samples: list, target_meta: dict) -> None:
    """What the monitor received, as a gputop recording (one chunk per second, as the Recorder
    writes): a real probe recording for UI tests and replays."""
    from gputop.session.recording import RecordingWriter
    w = RecordingWriter(path, {"gputop_version": "benchmark", "target": target_meta,
                               "benchmark": "benchmarks/probe_accuracy.py"})
    by_second: dict[int, list] = {}
    for s in samples:
        by_second.setdefault(int(s.t), []).append(s)
    for sec in sorted(by_second):
        w.write_samples(by_second[sec])
    w.close({"clean": True})


def run_scenario(name: str, device: str, seconds: float, tmp: str, out_dir: str) -> dict:
    from gputop.probe import wire
    from gputop.session.launch import launch_with_probe
    from gputop.session.session import SessionClock
    from gputop.sources.probe_client import ProbeClientSource
    from gputop.sources.target import Target

    out, hold = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}.hold")
    env = dict(os.environ)
    env[wire.ENV_DIR] = os.path.join(tmp, "sock")
    log = open(os.path.join(tmp, f"{name}.log"), "w")
    p = launch_with_probe([sys.executable, HERE, "--job", name, "--device", device, "--seconds", str(seconds),
                           "--out", out, "--hold", hold], env=env, stdout=log, stderr=subprocess.STDOUT)
    samples = []
    target = Target(p.pid)
    target_meta = target.describe()
    src = ProbeClientSource(SessionClock(), target, scan_interval_s=0.25)
    src.start(samples.append)
    try:
        deadline = time.monotonic() + seconds + 120
        while not os.path.exists(out) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        if not os.path.exists(out):
            raise SystemExit(f"{name}: the job did not finish; see {log.name}")
        own = json.load(open(out))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            w = [s for s in samples if s.kind == "probe_step"]
            if w and w[-1].get("step_total") == own["steps"]:
                break
            time.sleep(0.1)
    finally:
        open(hold, "w").close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        src.stop()
    offset = src.describe()["probes"][str(p.pid)].get("clock_offset_s")
    save_recording(os.path.join(out_dir, f"probe_{name}_{device}.gtrec"), samples, target_meta)
    return compare(name, own, samples, offset)


def compare(name: str, own: dict, samples: list, offset: float | None) -> dict:
    import statistics
    w = [s for s in samples if s.kind == "probe_step"]
    last = w[-1].data if w else {}
    timed = [s for s in w if s.get("step_n")]
    step_n = sum(s.get("step_n") for s in timed)
    step_sum = sum(s.get("step_s_sum") or 0 for s in timed)
    wait_sum = sum(s.get("data_wait_s_sum") or 0 for s in timed)
    busy = [s for s in w if s.get("steps")][1:-1]   # steady windows: not the first or last
    win_s = sum(s.get("window_s") or 0 for s in busy)
    own_mean = statistics.fmean(own["step_times"])
    # The job's own rate over exactly the span of those windows (probe time = sample t - offset).
    lo = busy[0].t - offset - busy[0].get("window_s") if busy else 0.0
    hi = busy[-1].t - offset if busy else 0.0
    own_steps_in = sum(1 for t in own["step_mono"] if lo < t <= hi)
    own_batches_in = sum(1 for t in own["batch_mono"] if lo < t <= hi)
    own_rate = own_steps_in / (hi - lo) if hi > lo else None
    own_share = sum(own["waits"]) / sum(own["step_times"])
    row = {
        "scenario": name,
        "steps_job": own["steps"], "steps_probe": last.get("step_total"),
        "step_ms_job": round(own_mean * 1000, 4),
        "step_ms_probe": round(step_sum / step_n * 1000, 4) if step_n else None,
        "steps_per_s_job": round(own_rate, 3) if own_rate else None,
        "steps_per_s_probe": round(sum(s.get("steps") for s in busy) / win_s, 3) if win_s else None,
        "batches_per_s_job": round(own_batches_in / (hi - lo), 3) if hi > lo else None,
        "window_span_s": round(hi - lo, 3), "steps_in_span_job": own_steps_in,
        "steps_in_span_probe": sum(s.get("steps") for s in busy),
        "batches_per_s_probe": round(sum(s.get("batches") for s in busy) / win_s, 3) if win_s else None,
        "data_wait_share_job": round(own_share, 4),
        "data_wait_share_probe": round(wait_sum / step_sum, 4) if step_sum else None,
    }
    for a, b in (("step_ms_job", "step_ms_probe"), ("steps_per_s_job", "steps_per_s_probe"),
                 ("batches_per_s_job", "batches_per_s_probe")):
        row[b.replace("_probe", "_err_pct")] = (round((row[b] / row[a] - 1) * 100, 3)
                                                 if row[a] and row[b] is not None else None)
    if own.get("gpu_ms"):
        gpu_n = sum(s.get("gpu_n") or 0 for s in w)
        gpu_sum = sum(s.get("gpu_s_sum") or 0 for s in w)
        row["gpu_ms_job"] = round(statistics.fmean(own["gpu_ms"]), 4)
        row["gpu_ms_probe"] = round(gpu_sum / gpu_n * 1000, 4) if gpu_n else None
        row["gpu_steps_timed_probe"] = gpu_n
        row["gpu_ms_err_pct"] = round((row["gpu_ms_probe"] / row["gpu_ms_job"] - 1) * 100, 3) if gpu_n else None
    else:
        row["gpu_info_probe"] = "no GPU time (see the probe_config hooks in the recording)"
    sync_w = [s for s in timed if s.get("syncs") is not None]
    if sync_w:
        n = sum(s.get("step_n") for s in sync_w)
        row["syncs_per_step_probe"] = round(sum(s.get("syncs") or 0 for s in sync_w) / n, 3) if n else None
        lines = [s for s in samples if s.kind == "probe_sync"]
        row["sync_lines_probe"] = lines[-1].get("lines")[:3] if lines else None
        row["sync_lines_job"] = own.get("sync_lines")
        if name == "syncs":
            row["syncs_per_step_expected"] = 2
    else:
        row["sync_info_probe"] = "syncs not counted (see the probe_config hooks in the recording)"
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--scenarios", default=None)
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--hold", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        return job(args)
    if not args.out_dir:
        ap.error("OUT_DIR is required")
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    scenarios = (args.scenarios or ("input_bound,gpu_bound,syncs" if device == "cuda" else "input_bound,gpu_bound")).split(",")
    os.makedirs(args.out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="gpa-")
    rows = []
    for name in scenarios:
        print(f"running {name} on {device} for {args.seconds:.0f} s ...", flush=True)
        rows.append(run_scenario(name, device, args.seconds, tmp, args.out_dir))
    res = {"machine": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "device": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine()),
           "seconds": args.seconds, "rows": rows}
    with open(os.path.join(args.out_dir, "probe_accuracy.json"), "w") as f:
        json.dump(res, f, indent=1)
    print()
    print(f"probe accuracy on {res['device_name']} ({device}); job's own measurement vs probe (error %)")
    print(f"{'scenario':<12} {'steps':>11} {'step ms':>22} {'steps/s':>22} {'batches/s':>22} {'data wait share':>16} {'GPU ms/step':>22}")
    for r in rows:
        gpu = (f"{r['gpu_ms_job']:.3f}/{r['gpu_ms_probe']} ({r['gpu_ms_err_pct']:+.2f})" if r.get("gpu_ms_job") is not None
               and r.get("gpu_ms_probe") is not None else "n/a")
        print(f"{r['scenario']:<12} {r['steps_job']:>5}/{r['steps_probe']!s:<5} "
              f"{r['step_ms_job']:>8.3f}/{r['step_ms_probe']!s:<7} ({r['step_ms_err_pct']!s:>5}) "
              f"{r['steps_per_s_job']:>8.2f}/{r['steps_per_s_probe']!s:<7} ({r['steps_per_s_err_pct']!s:>5}) "
              f"{r['batches_per_s_job']:>8.2f}/{r['batches_per_s_probe']!s:<7} ({r['batches_per_s_err_pct']!s:>5}) "
              f"{r['data_wait_share_job']:>7.3f}/{r['data_wait_share_probe']!s:<7} {gpu:>22}")
        if "syncs_per_step_probe" in r:
            print(f"{'':<12} syncs/step {r['syncs_per_step_probe']} (expected {r.get('syncs_per_step_expected', '?')}); "
                  f"hottest lines {r['sync_lines_probe']}; job's sync lines {r['sync_lines_job']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
