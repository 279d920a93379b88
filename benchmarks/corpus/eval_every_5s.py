"""nanoGPT-style train.py on a GPT-2 small (124M, bf16, batch 16 x 1024): GPU-bound, ~45 ms a step.
Healthy; the trap: every 5 s of training it runs estimate_loss() (~1 s of GPU-bound forward passes
on the train and val splits; the meter pauses for it, so steps/s is training throughput).
Fix (--fixed): no evaluation.
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
eval_interval_s, eval_iters = (float("inf") if args.fixed else 5.0), pick(20, 3)  # the fix: no evaluation
splits = {s: np.random.randint(0, model_args["vocab"], size=2_000_000, dtype=np.uint16) for s in ("train", "val")}


def get_batch(split):
    return nanogpt.get_batch(splits[split], block_size, batch_size, device)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in splits:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


torch.backends.cuda.matmul.allow_tf32 = True
with torch.device(device):  # random init, straight on the GPU
    model = GPT(**model_args)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                              fused=device.type == "cuda")
ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
meter = Meter(args.seconds, args.report_every)
X, Y = get_batch("train")
next_eval, iter_num = time.monotonic() + eval_interval_s, 0
while True:
    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch("train")  # prefetch the next batch while the GPU runs this one
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if not meter.step():
        break
    if time.monotonic() >= next_eval:
        meter.pause()  # evaluation is not training: the job's rate is its training throughput
        t = time.monotonic()
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
              f"eval {time.monotonic() - t:.2f}s", flush=True)
        meter.resume()
        next_eval = time.monotonic() + eval_interval_s
meter.done()
