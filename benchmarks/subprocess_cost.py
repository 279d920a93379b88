"""What a subprocess call in a training loop costs the steps around it (issue 29: the unseen corpus's
nvidia_smi_in_loop job, where gputop's budget saw the call's wait as 4% of training while its fix
gained 17%).

Runs the corpus's nanoGPT step (GPT-2 small, bf16 autocast, fused AdamW, batch 16 x 512) on the GPU,
each mode for ``--seconds``, modes alternated ``--rounds`` times:

    none     the loop alone (loss.item() every 5 steps, as the job's fixed variant)
    smi      + subprocess.run(nvidia-smi --query-gpu=...) after each loss.item(), as the job does
    sleep    + time.sleep(the smi call's median wall time) instead: the same wait, no child process

Per mode it prints steps/s, the call's median wall time, the median wall time of the 5 steps after
the call (from the call's end to the next loss.item() returning) and the minor page faults per
call and per 5 steps. If the 5 steps after smi take longer than after an equal sleep, the child
process leaves a cost the call's own time does not show (page-table copies, faults, driver locks).

    python -m benchmarks subprocess_cost --seconds 8 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import numpy as np
    import torch

    import nanogpt
    if not torch.cuda.is_available():
        print("subprocess_cost: no GPU here; run it on the GPU machine", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    smi = ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
    if not shutil.which("nvidia-smi"):
        print("subprocess_cost: nvidia-smi not found", file=sys.stderr)
        return 2
    print(f"vfork {getattr(subprocess, '_USE_VFORK', '?')} posix_spawn {getattr(subprocess, '_USE_POSIX_SPAWN', '?')}"
          f" torch {torch.__version__} python {sys.version.split()[0]}", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    with torch.device(dev):
        model = nanogpt.GPT(vocab=50304, block_size=512, n_layer=12, d=768, heads=12)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    data = np.random.randint(0, 50304, size=4_000_000, dtype=np.uint16)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16)

    def step(X, Y):
        with ctx:
            _, loss = model(X, Y)
        X, Y = nanogpt.get_batch(data, 512, 16, dev)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return X, Y, loss

    def minflt() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    smi_ms = [30.0]

    def run(mode: str, seconds: float) -> dict:
        X, Y = nanogpt.get_batch(data, 512, 16, dev)
        calls, after, call_flt, after_flt = [], [], [], []
        steps, t0 = 0, time.perf_counter()
        t_after, f_after = None, None
        while time.perf_counter() - t0 < seconds:
            X, Y, loss = step(X, Y)
            steps += 1
            if steps % 5 == 0:
                loss.item()
                now = time.perf_counter()
                if t_after is not None:
                    after.append((now - t_after) * 1e3)
                    after_flt.append(minflt() - f_after)
                f0, c0 = minflt(), time.perf_counter()
                if mode == "smi":
                    subprocess.run(smi, capture_output=True, text=True)
                elif mode == "sleep":
                    time.sleep(statistics.median(smi_ms) / 1e3)
                c1 = time.perf_counter()
                if mode != "none":
                    calls.append((c1 - c0) * 1e3)
                call_flt.append(minflt() - f0)
                t_after, f_after = c1, minflt()
        el = time.perf_counter() - t0
        if mode == "smi" and calls:
            smi_ms[:] = calls
        med = lambda v: round(statistics.median(v), 2) if v else None  # noqa: E731
        return {"mode": mode, "steps_per_s": round(steps / el, 2), "call_ms": med(calls),
                "five_steps_after_ms": med(after), "minflt_per_call": med(call_flt),
                "minflt_per_5_steps": med(after_flt), "groups": len(after)}

    run("none", 5.0)  # warm-up: cuBLAS, the allocator, the first smi
    run("smi", 2.0)
    for r in range(args.rounds):
        for mode in ("none", "smi", "sleep"):
            res = run(mode, args.seconds)
            res["round"] = r
            print(res, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
