"""nanoGPT-style train.py on a GPT-2 small (124M parameters, bf16 autocast, fused AdamW, batch 16 x 512, ~30-45 ms a
step on an H100) that, every 5 steps, logs the loss and the GPU's memory and utilisation the way scripts do:
subprocess.run(["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", ...]) and parses its output.
Cause (loop_blocked): each call starts a process that loads NVML, initialises it and queries the driver (tens to
hundreds of ms) while the training thread waits on it, right after loss.item() has drained the GPU: the GPU idles
for the whole call, ~100 ms for every ~200 ms of training. Expect the fix to gain roughly +30% to +100% steps/s.
Fix (--fixed): read torch.cuda.memory_allocated() / torch.cuda.max_memory_reserved() instead, no subprocess.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import subprocess
from contextlib import nullcontext

import numpy as np

import nanogpt
from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()

batch_size, block_size, log_interval = pick(16, 4), pick(512, 64), 5
model_args = dict(vocab=pick(50304, 512), block_size=block_size, n_layer=pick(12, 2), d=pick(768, 64),
                  heads=pick(12, 4))
data = np.random.randint(0, model_args["vocab"], size=4_000_000, dtype=np.uint16)  # stands in for train.bin
# nvidia-smi where there is one; on a machine without it, a command that takes about as long
SMI = (["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
       if shutil.which("nvidia-smi") else [sys.executable, "-c", "import time; time.sleep(0.1); print('0, 0')"])


def gpu_stats_smi():
    out = subprocess.run(SMI, capture_output=True, text=True).stdout  # the training thread waits for it
    used, util = (int(v) for v in out.strip().splitlines()[0].split(","))
    return f"mem {used} MiB util {util}%"


def gpu_stats_torch():
    return f"mem {torch.cuda.memory_allocated() >> 20} MiB peak {torch.cuda.max_memory_reserved() >> 20} MiB"


gpu_stats = gpu_stats_torch if args.fixed else gpu_stats_smi  # the fix: torch's allocator counters, no subprocess


def get_batch():
    return nanogpt.get_batch(data, block_size, batch_size, device)


torch.backends.cuda.matmul.allow_tf32 = True
with torch.device(device):  # random init, straight on the GPU
    model = nanogpt.GPT(**model_args)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                              fused=device.type == "cuda")
ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
meter = Meter(args.seconds, args.report_every)
X, Y = get_batch()
iter_num = 0
while True:
    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch()  # prefetch the next batch while the GPU runs this one
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % log_interval == 0:
        lossf = loss.item()  # waits for the step, as nanoGPT's logging does
        print(f"iter {iter_num}: loss {lossf:.4f}, {gpu_stats()}", flush=True)
    iter_num += 1
    if not meter.step():
        break
meter.done()
