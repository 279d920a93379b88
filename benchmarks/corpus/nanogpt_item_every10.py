"""nanoGPT-style train.py on a GPT-2 small (124M, bf16, batch 16 x 1024): GPU-bound, ~45 ms a step.
Healthy; the trap: it reads the loss with loss.item() every 10 steps (log_interval=10), a sync that
drains the queue once per ~0.45 s of GPU work and costs well under 1%. Fix (--fixed): no loss read.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import time
from contextlib import nullcontext

import numpy as np

import nanogpt
from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()


GPT = nanogpt.GPT


batch_size, block_size = pick(16, 4), pick(1024, 64)
model_args = dict(vocab=pick(50304, 512), block_size=block_size, n_layer=pick(12, 2), d=pick(768, 64),
                  heads=pick(12, 4))
log_interval = None if args.fixed else 10  # the fix: no loss read at all
data = np.random.randint(0, model_args["vocab"], size=4_000_000, dtype=np.uint16)  # stands in for train.bin


def get_batch():
    return nanogpt.get_batch(data, block_size, batch_size, device)


torch.backends.cuda.matmul.allow_tf32 = True
with torch.device(device):  # random init, straight on the GPU
    model = GPT(**model_args)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                              fused=device.type == "cuda")
ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
meter = Meter(args.seconds, args.report_every)
X, Y = get_batch()
t0, iter_num = time.time(), 0
while True:
    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch()  # prefetch the next batch while the GPU runs this one
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if log_interval and iter_num % log_interval == 0:
        lossf = loss.item()  # a CPU-GPU sync: waits for this step to finish
        t1 = time.time()
        print(f"iter {iter_num}: loss {lossf:.4f}, time {(t1 - t0) * 1000 / log_interval:.2f}ms", flush=True)
        t0 = t1
    if not meter.step():
        break
meter.done()
