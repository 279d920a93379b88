"""The probe on a real GPU: the right device, no stray CUDA context, and a job's warnings untouched.

    python benchmarks/probe_device.py OUT_DIR [--seconds 14] [--cuda N]

Checks what tests/ cannot on a machine without a GPU (tests/test_probe_core.py and
tests/test_probe_syncs.py check the same bookkeeping with stand-ins):

- **device**: the job works on ``cuda:N`` (default: the last visible GPU, so ``1`` on a 2-GPU
  machine). The probe thread's own current device would be 0; the probe must report memory for
  ``cuda:N`` and must not create a CUDA context on any other GPU. NVML's compute-process list of
  every GPU says where the job's PID has a context (polled each second). Three variants:
  ``set_device`` (the job calls ``torch.cuda.set_device(N)``; probe on), ``to_only`` (tensors
  moved with ``.to("cuda:N")``, no ``set_device``: current device 0; probe on) and ``to_only_noprobe``
  (the same without the probe: which GPUs torch itself touches).
- **warnings** (probe variants, while a monitor is attached and syncs are counted): per step one
  implicit sync (``loss.item()``). Phase ``error``: 40 steps inside ``with catch_warnings():
  simplefilter("error")`` — no sync may raise. Phase ``record``: 40 steps inside
  ``catch_warnings(record=True)`` — no sync may land in the job's list. The job's stderr must not
  show torch's "Synchronization debug mode is a prototype feature" notice or any sync warning.

Also the dormant wake path: the job installs the probe dormant, so its first step wakes it.

Writes OUT_DIR/probe_device.json and prints a table. Expected: ``contexts_on`` = ``[N]`` for
the probe variants (or the same set as ``to_only_noprobe`` for ``to_only``), ``memory_devices`` =
``[N]`` for ``set_device`` (none for ``to_only``, whose current device 0 has no context: the
``cuda_events`` hook says so), ``gpu_steps`` > 0 for ``set_device``, ``sync_raised`` = 0,
``syncs_recorded`` = 0, ``prototype_notice`` and ``sync_in_stderr`` false, ``syncs_counted`` > 0.
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
    import warnings

    import torch

    probe_on = args.variant != "to_only_noprobe"
    if probe_on:
        import gputop.probe
        gputop.probe.install(dormant=True)   # wakes at the first step, on its own thread
    n = args.cuda
    if args.variant == "set_device":
        torch.cuda.set_device(n)
    dev = torch.device("cuda", n)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(512, 1024, device=dev), torch.randn(512, 1, device=dev)

    def step(sync: bool) -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if sync:
            loss.item()   # one implicit sync per step

    def syncs_on() -> bool:
        if not probe_on:
            return False
        st = gputop.probe.status()
        return st.get("monitoring") and st.get("hooks", {}).get("syncs", [""])[0] == "on"

    def run_until(cond, limit_s: float) -> bool:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            step(sync=True)
            if cond():
                return True
        return cond()

    res: dict = {"variant": args.variant, "pid": os.getpid()}
    t_end = time.monotonic() + args.seconds
    res["syncs_on_before"] = run_until(syncs_on, 20.0) if probe_on else None
    run_until(lambda: False, 2.0)
    raised = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(40):
            try:
                step(sync=True)
            except UserWarning:
                raised += 1
    res["sync_raised"] = raised
    res["syncs_on_again"] = run_until(syncs_on, 5.0) if probe_on else None
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(40):
            step(sync=True)
        warnings.warn("the job's own warning, recorded")
    res["syncs_recorded"] = sum(1 for w in rec if "synchroniz" in str(w.message))
    res["own_recorded"] = sum(1 for w in rec if "the job's own warning" in str(w.message))
    while time.monotonic() < t_end:
        step(sync=True)
    torch.cuda.synchronize(dev)
    if probe_on:
        res["status"] = gputop.probe.status()
    with open(args.out + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(args.out + ".tmp", args.out)
    deadline = time.monotonic() + 60
    while not os.path.exists(args.hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


# -------------------------------------------------------------------------------- the monitor
def contexts_of(pid: int, handles) -> list[int]:
    import pynvml
    on = []
    for i, h in enumerate(handles):
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        except pynvml.NVMLError:
            continue
        if any(p.pid == pid for p in procs):
            on.append(i)
    return on


def run_variant(variant: str, cuda: int, seconds: float, tmp: str) -> dict:
    import pynvml

    from gputop.probe import wire
    from gputop.session.session import SessionClock
    from gputop.sources.probe_client import ProbeClientSource
    from gputop.sources.target import Target

    out, hold = os.path.join(tmp, f"{variant}.json"), os.path.join(tmp, f"{variant}.hold")
    env = dict(os.environ)
    env[wire.ENV_DIR] = os.path.join(tmp, "sock")
    log_path = os.path.join(tmp, f"{variant}.log")
    log = open(log_path, "w")
    p = subprocess.Popen([sys.executable, HERE, "--job", "--variant", variant, "--cuda", str(cuda), "--seconds",
                          str(seconds), "--out", out, "--hold", hold], env=env, stdout=log, stderr=subprocess.STDOUT)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    samples: list = []
    src = ProbeClientSource(SessionClock(), Target(p.pid), scan_interval_s=0.25)
    src.start(samples.append)
    seen_on: set[int] = set()
    try:
        deadline = time.monotonic() + seconds + 120
        while not os.path.exists(out) and time.monotonic() < deadline and p.poll() is None:
            seen_on.update(contexts_of(p.pid, handles))
            time.sleep(0.5)
        seen_on.update(contexts_of(p.pid, handles))
        if not os.path.exists(out):
            raise SystemExit(f"{variant}: the job did not finish; see {log_path}")
        own = json.load(open(out))
    finally:
        open(hold, "w").close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        src.stop()
    log.close()
    stderr = open(log_path).read()
    steps = [s for s in samples if s.kind == "probe_step"]
    cfgs = [s for s in samples if s.kind == "probe_config"]
    hooks = (cfgs[-1].get("hooks") or {}) if cfgs else {}
    return {
        "variant": variant, "cuda": cuda,
        "contexts_on": sorted(seen_on),
        "memory_devices": sorted({s.get("device") for s in samples if s.kind == "probe_memory"}),
        "config_device": cfgs[-1].get("device") if cfgs else None,
        "gpu_steps": sum(s.get("gpu_n") or 0 for s in steps),
        "syncs_counted": sum(s.get("syncs") or 0 for s in steps),
        "syncs_on_before": own.get("syncs_on_before"), "syncs_on_again": own.get("syncs_on_again"),
        "sync_raised": own.get("sync_raised"), "syncs_recorded": own.get("syncs_recorded"),
        "own_recorded": own.get("own_recorded"),
        "prototype_notice": "prototype feature" in stderr,
        "sync_in_stderr": "synchronizing CUDA operation" in stderr,
        "cuda_events_hook": hooks.get("cuda_events"), "syncs_hook": hooks.get("syncs"),
        "stderr_tail": stderr[-600:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--seconds", type=float, default=14.0)
    ap.add_argument("--cuda", type=int, default=None)
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--hold", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        return job(args)
    if not args.out_dir:
        ap.error("OUT_DIR is required")
    import torch
    if not torch.cuda.is_available():
        print("probe_device: no CUDA GPU here; run it on the GPU machine", file=sys.stderr)
        return 2
    cuda = args.cuda if args.cuda is not None else torch.cuda.device_count() - 1
    os.makedirs(args.out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="gpd-")
    rows = []
    for variant in ("set_device", "to_only", "to_only_noprobe"):
        print(f"running {variant} on cuda:{cuda} for {args.seconds:.0f} s ...", flush=True)
        rows.append(run_variant(variant, cuda, args.seconds, tmp))
    res = {"machine": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "gpus": torch.cuda.device_count(), "cuda": cuda, "rows": rows}
    with open(os.path.join(args.out_dir, "probe_device.json"), "w") as f:
        json.dump(res, f, indent=1)
    print()
    print(f"probe device/warnings check, job on cuda:{cuda} of {res['gpus']} GPU(s)")
    cols = ("variant", "contexts_on", "memory_devices", "config_device", "gpu_steps", "syncs_counted", "sync_raised",
            "syncs_recorded", "own_recorded", "prototype_notice", "sync_in_stderr")
    print("  ".join(f"{c:>16}" for c in cols))
    for r in rows:
        print("  ".join(f"{str(r.get(c)):>16}" for c in cols))
    for r in rows:
        print(f"{r['variant']}: cuda_events hook {r['cuda_events_hook']}; syncs hook {r['syncs_hook']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
