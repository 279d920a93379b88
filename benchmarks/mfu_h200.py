"""MFU and energy per step on the H200: gputop's numbers against analytic FLOPs and an independent
power x time.

    python benchmarks/mfu_h200.py OUT_DIR [--models gpt,resnet] [--train-s 20] [--cpu-smoke]

For each model, a training job is started with gputop's in-process probe (as ``gputop run``
would) and ``python -m gputop --pid JOB --headless --record OUT_DIR/<model>.gtrec --json``
watches it. The job (this file with ``--worker``) waits for the monitor, runs warm-up steps (the
probe counts the 3rd step's FLOPs with FlopCounterMode), then trains ``--train-s`` seconds,
noting the wall times and step count of that span. Meanwhile this process samples
``nvmlDeviceGetPowerUsage`` of GPU 0 at 10 Hz on its own.

Models (bf16 autocast on CUDA):
- ``gpt``: a nanoGPT-style decoder written here (d 1024, 12 layers, 16 heads, 256 tokens x 32,
  vocab 32768, SDPA attention, fused AdamW). Analytic FLOPs/step: 6 x matmul params x tokens,
  and with attention 6NT + 12 x layers x batch x T^2 x d (PaLM's count; FlopCounterMode's
  backward recomputes the scores, 14 instead of 12).
- ``resnet``: torchvision's ResNet-50 (random weights; a ResNet-50 written here if torchvision
  is missing), batch 128 at 224x224, channels_last, SGD. Analytic: 4.089 GMAC per image forward
  (torchvision's figure, multiply-adds) = 8.18 GFLOP, x3 for forward + backward (the first
  convolution computes no input gradient: ~1% less).

Printed per model: FLOPs/step from the probe vs analytic, achieved TFLOP/s, MFU, GPM tensor
active, the counted step's cost, and J/step from gputop (energy counter, else power x time)
vs this script's own 10 Hz power x time over the same span. Writes OUT_DIR/mfu_h200.json,
OUT_DIR/<model>.gtrec, <model>_report.json, <model>_job.log, <model>_gputop.err.

``--cpu-smoke`` runs the same path on CPU with tiny sizes (no NVML: power n/a; MFU n/a: no GPU
model), to check the script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RESNET50_GMAC = 4.089      # torchvision's resnet50 "_ops" (GFLOPS there = multiply-adds) at 224x224


# ---------------------------------------------------------------------------------------------
# The worker: one training job


def _gpt(torch, nn, d: int, layers: int, heads: int, vocab: int):
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(4096, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.head(self.ln(self.blocks(self.emb(idx) + self.pos(pos))))

    return GPT()


def _resnet50(nn):
    """A ResNet-50 (v1.5, torchvision's layout) for machines without torchvision."""
    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.down(x))

    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                   nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def worker(a) -> int:
    import torch
    from torch import nn

    import gputop.probe
    dev = "cpu" if a.cpu_smoke else "cuda"
    if dev == "cuda":
        torch.cuda.set_device(0)
    else:
        torch.set_num_threads(1)     # the smoke run shares a small machine
    # bf16 autocast on CUDA; the CPU smoke run stays fp32 (bf16 convolutions crawl on most CPUs)
    amp = torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda")
    torch.manual_seed(0)
    own: dict = {"model": a.worker, "device": dev}
    if a.worker == "gpt":
        d, L, H, V, T, B = (64, 2, 2, 256, 16, 4) if a.cpu_smoke else (1024, 12, 16, 32768, 256, 32)
        model = _gpt(torch, nn, d, L, H, V).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
        n_mm = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
        tokens = B * T
        own.update(d=d, layers=L, heads=H, vocab=V, seq=T, batch=B, matmul_params=n_mm, tokens=tokens,
                   params=sum(p.numel() for p in model.parameters()),
                   analytic_6nt=6 * n_mm * tokens, analytic=6 * n_mm * tokens + 12 * L * B * T * T * d,
                   samples_per_step=B)
        data = torch.randint(0, V, (B, T + 1), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            with amp:
                logits = model(data[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, V), data[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
    else:
        res, B = (64, 2) if a.cpu_smoke else (224, 128)
        try:
            import torchvision
            model = torchvision.models.resnet50(weights=None)
            own["resnet_from"] = f"torchvision {torchvision.__version__}"
        except Exception as e:
            model = _resnet50(nn)
            own["resnet_from"] = f"written here ({type(e).__name__}: torchvision not usable)"
        model = model.to(dev, memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scale = ((res // 32) / 7) ** 2     # conv FLOPs scale with the feature maps (7x7 at 224)
        own.update(batch=B, resolution=res, samples_per_step=B,
                   analytic=3 * 2 * RESNET50_GMAC * 1e9 * scale * B)
        x = torch.randn(B, 3, res, res, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (B,), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            with amp:
                out = model(x)
            nn.functional.cross_entropy(out.float(), y).backward()
            opt.step()

    deadline = time.monotonic() + a.wait_monitor
    while time.monotonic() < deadline and not gputop.probe.status().get("monitoring"):
        time.sleep(0.05)
    own["monitored"] = bool(gputop.probe.status().get("monitoring"))

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    t = time.perf_counter()
    for _ in range(a.warmup):            # includes the counted 3rd step
        step()
    sync()
    own["warmup_s"] = time.perf_counter() - t
    own["t0_wall"] = time.time()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < a.train_s:
        step()
        n += 1
        if n % 20 == 0:
            sync()
    sync()
    own["t1_wall"] = time.time()
    own["steps"] = n
    own["step_ms"] = (time.perf_counter() - t0) / n * 1000
    time.sleep(2.5)                      # one more probe window and energy reading after the span
    with open(a.own + ".tmp", "w") as f:
        json.dump(own, f)
    os.replace(a.own + ".tmp", a.own)
    return 0


# ---------------------------------------------------------------------------------------------
# The driver


class PowerSampler(threading.Thread):
    """nvmlDeviceGetPowerUsage of GPU 0 at 10 Hz, with wall times: the independent power x time."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.points: list[tuple[float, float]] = []
        self.why: str | None = None
        self.stop = threading.Event()
        try:
            import pynvml as nv
            nv.nvmlInit()
            self.nv, self.h = nv, nv.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:
            self.nv = None
            self.why = f"no NVML ({type(e).__name__}: {e})"

    def run(self) -> None:
        while self.nv is not None and not self.stop.wait(0.1):
            try:
                self.points.append((time.time(), self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0))
            except Exception as e:
                self.why = f"{type(e).__name__}: {e}"

    def joules(self, t0: float, t1: float) -> float | None:
        pts = [(t, w) for t, w in self.points if t0 <= t <= t1]
        if len(pts) < 2:
            return None
        inside = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(pts, pts[1:]))
        # the two edges, at the nearest reading's power
        return inside + (pts[0][0] - t0) * pts[0][1] + (t1 - pts[-1][0]) * pts[-1][1]


def analyse(rec: str, own: dict) -> dict:
    """gputop's numbers over the job's timed span, from the recording."""
    from gputop.derive import efficiency as ef
    from gputop.session.recording import RecordingReader
    with RecordingReader(rec) as r:
        start = r.meta.get("start_wall")
        samples = sorted(r.all_samples(), key=lambda s: s.t)
    lo, hi = own["t0_wall"] - start, own["t1_wall"] - start
    # Probe windows that lie inside the span (a window is stamped at its end); GPU samples in it.
    span = [s for s in samples if (s.kind == "probe_step" and lo + 1.0 <= s.t <= hi)
            or (s.kind == "gpu" and lo <= s.t <= hi) or s.kind in ("probe_config", "gpu_info")]
    res = ef.efficiency(ef.group(span))
    windows = [s for s in samples if s.kind == "probe_step"]
    counted = next((w.data for w in reversed(windows) if w.data.get("flops_per_step")), {})
    return {"efficiency": res, "flops_per_step": counted.get("flops_per_step"),
            "flops_dtype": counted.get("flops_dtype"), "flops_by_dtype": counted.get("flops_by_dtype"),
            "flops_count_ms": counted.get("flops_count_ms"), "flops_step": counted.get("flops_step"),
            "flops_off": windows[-1].data.get("flops_off") if windows else "no probe window",
            "span_s": hi - lo}


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def run_model(a, model: str, env: dict) -> dict:
    from gputop.session.launch import launch_with_probe
    out = a.out
    own_path, rec = os.path.join(out, f"{model}_own.json"), os.path.join(out, f"{model}.gtrec")
    for p in (own_path, rec):
        if os.path.exists(p):
            os.unlink(p)
    cmd = [sys.executable, os.path.abspath(__file__), out, "--worker", model, "--own", own_path,
           "--train-s", str(a.train_s), "--warmup", str(4 if a.cpu_smoke else a.warmup)]
    cmd += ["--cpu-smoke"] if a.cpu_smoke else []
    log = open(os.path.join(out, f"{model}_job.log"), "w")
    power = PowerSampler()
    power.start()
    job = launch_with_probe(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    result: dict = {"model": model}
    try:
        gcmd = [sys.executable, "-m", "gputop", "--pid", str(job.pid), "--headless", "--duration",
                str(a.train_s + 150), "--record", rec, "--json", "--no-stacks"]
        with open(os.path.join(out, f"{model}_gputop.err"), "w") as err:
            g = subprocess.run(gcmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                               timeout=a.train_s + 200)
        result["gputop_rc"] = g.returncode
        if g.stdout.strip():
            with open(os.path.join(out, f"{model}_report.json"), "w") as f:
                f.write(g.stdout)
        job.wait(timeout=30)
        result["job_rc"] = job.returncode
    except subprocess.TimeoutExpired as e:
        result["error"] = f"timeout: {e}"
    finally:
        kill_group(job)
        log.close()
        power.stop.set()
        power.join(2)
    if not os.path.exists(own_path) or not os.path.exists(rec):
        result["error"] = result.get("error") or f"no result: see {model}_job.log and {model}_gputop.err"
        return result
    own = json.load(open(own_path))
    result["own"] = own
    got = analyse(rec, own)
    res = got.pop("efficiency")
    result.update(got)
    r = (res.get("ranks") or [{}])[0]
    f = got["flops_per_step"]
    result["flops_vs_analytic"] = f / own["analytic"] if f else None
    if "analytic_6nt" in own and f:
        result["flops_vs_6nt"] = f / own["analytic_6nt"]
    result["achieved_tflops_gputop"] = r.get("achieved_tflops")
    result["achieved_tflops_own"] = (f * own["steps"] / (own["t1_wall"] - own["t0_wall"]) / 1e12) if f else None
    result["mfu"], result["mfu_off"] = res.get("mfu"), res.get("mfu_off")
    result["peak_tflops"] = r.get("peak_tflops")
    result["tensor_active_pct"] = res.get("tensor_active_pct")
    result["energy_method"] = res.get("energy_method")
    result["j_per_step_gputop"] = res.get("joules_per_step")
    result["j_per_sample_gputop"] = res.get("joules_per_sample")
    indep = power.joules(own["t0_wall"], own["t1_wall"])
    result["j_per_step_independent"] = indep / own["steps"] if indep is not None else None
    result["power_why"] = power.why
    result["step_ms_own"] = own["step_ms"]
    return result


def _f(v, nd=3, unit=""):
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}g}{unit}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--models", default="gpt,resnet")
    ap.add_argument("--train-s", type=float, default=20.0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU, to try the script without a GPU")
    ap.add_argument("--worker", choices=("gpt", "resnet"), help=argparse.SUPPRESS)
    ap.add_argument("--wait-monitor", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--own", help=argparse.SUPPRESS)      # the worker's result file
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONUNBUFFERED="1")
    results = []
    for model in [m.strip() for m in a.models.split(",") if m.strip()]:
        t = time.monotonic()
        r = run_model(a, model, env)
        r["wall_s"] = round(time.monotonic() - t, 1)
        results.append(r)
    with open(os.path.join(a.out, "mfu_h200.json"), "w") as f:
        json.dump({"cpu_smoke": a.cpu_smoke, "train_s": a.train_s, "results": results}, f, indent=2, default=str)
    print(f"{'model':<7} {'FLOPs/step probe':>16} {'analytic':>10} {'ratio':>6} {'dtype':>5} {'TFLOP/s':>8} "
          f"{'MFU':>6} {'tensor':>7} {'count ms':>9} {'step ms':>8} {'J/step gputop':>14} {'J/step 10Hz':>11}")
    ok = True
    for r in results:
        if r.get("error"):
            print(f"{r['model']:<7} error: {r['error']}")
            ok = False
            continue
        own = r["own"]
        mfu = f"{r['mfu'] * 100:.1f}%" if r.get("mfu") is not None else "n/a"
        ta = f"{r['tensor_active_pct']:.1f}%" if r.get("tensor_active_pct") is not None else "n/a"
        print(f"{r['model']:<7} {_f(r['flops_per_step'], 4):>16} {_f(own['analytic'], 4):>10} "
              f"{_f(r['flops_vs_analytic'], 3):>6} {str(r.get('flops_dtype')):>5} "
              f"{_f(r['achieved_tflops_gputop'], 4):>8} {mfu:>6} {ta:>7} {_f(r['flops_count_ms'], 4):>9} "
              f"{_f(r['step_ms_own'], 4):>8} {_f(r['j_per_step_gputop'], 4):>14} "
              f"{_f(r['j_per_step_independent'], 4):>11}")
        extra = [f"energy: {r.get('energy_method')}"]
        if r.get("flops_vs_6nt") is not None:
            extra.append(f"probe/6NT {r['flops_vs_6nt']:.3f}")
        if r.get("mfu") is None:
            extra.append(f"MFU n/a: {r.get('mfu_off')}")
        if r.get("power_why"):
            extra.append(f"power sampler: {r['power_why']}")
        if r.get("flops_off"):
            extra.append(f"FLOPs: {r['flops_off']}")
        print("        " + "; ".join(extra))
        ok = ok and r["flops_per_step"] is not None
    print(f"results: {os.path.join(a.out, 'mfu_h200.json')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
