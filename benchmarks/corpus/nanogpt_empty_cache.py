"""nanoGPT-style train.py on a GPT-2 small (124M, bf16, batch 16 x 1024), as forks of it often are:
torch.cuda.empty_cache() after every step "to keep memory down" (added after an out-of-memory error).
Cause (allocator_thrash): each call waits for the GPU, gives every cached segment back (a cudaFree
each) and the next step cudaMallocs them all again while the GPU waits for its first kernels.
Fix (--fixed): no empty_cache() in the loop.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contextlib import nullcontext

import numpy as np

import nanogpt
from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()

batch_size, block_size = int(os.environ.get("EC_BATCH", pick(16, 4))), pick(1024, 64)
model_args = dict(vocab=pick(50304, 512), block_size=block_size, n_layer=pick(12, 2), d=pick(768, 64),
                  heads=pick(12, 4))
data = np.random.randint(0, model_args["vocab"], size=4_000_000, dtype=np.uint16)  # stands in for train.bin


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
while True:
    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch()  # prefetch the next batch while the GPU runs this one
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del logits, loss
    if not args.fixed and device.type == "cuda":
        torch.cuda.empty_cache()  # the cause: the allocator's cache given back every step
    if not meter.step():
        break
meter.done()
