"""nanoGPT-style train.py on a deep GPT (24 layers of 768, batch 8 x 512, ~35 ms a step) that watches for
activation growth by reading each layer's output norm with .item() in forward, every step.
Cause (sync_stall): each .item() waits for the GPU to drain, then the GPU waits while the CPU launches
the next layer: 24 round trips a step. Fix (--fixed): keep the norms on the GPU, read every 50 steps.
A second fix (--compile, added after the first was measured: +3-5%, which refuted the label): what
gputop named instead, host_bound on the model's own kernel launches, fixed as its advice says --
torch.compile(mode="reduce-overhead") (CUDA graphs), without the norm watch (the first fix showed
that watch costs ~3-5%).
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contextlib import nullcontext

import numpy as np

import nanogpt
from common import Meter, parse, pick, torch_and_device

SECOND_FIX = "the second fix: torch.compile(mode='reduce-overhead'), no norm watch"
args = parse(__doc__, lambda p: p.add_argument("--compile", action="store_true", help=SECOND_FIX))
torch, device = torch_and_device()
read_each_layer = not (args.fixed or args.compile)  # the fix: keep the norms on the GPU, read every 50 steps



class GPT(nanogpt.GPT):
    """Watches each layer's output norm, every step: to catch activations blowing up."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.act_norms = []

    def after_block(self, x):
        if args.compile:
            return
        norm = x.detach().norm()
        self.act_norms.append(norm.item() if read_each_layer else norm)  # .item(): a CPU-GPU sync


batch_size, block_size = pick(8, 4), pick(512, 64)
model_args = dict(vocab=pick(50304, 512), block_size=block_size, n_layer=pick(24, 4), d=pick(768, 64),
                  heads=pick(12, 4))
data = np.random.randint(0, model_args["vocab"], size=4_000_000, dtype=np.uint16)  # stands in for train.bin


def get_batch():
    return nanogpt.get_batch(data, block_size, batch_size, device)


torch.backends.cuda.matmul.allow_tf32 = True
with torch.device(device):  # random init, straight on the GPU
    model = GPT(**model_args)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                              fused=device.type == "cuda")
ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
forward = torch.compile(model, mode="reduce-overhead") if args.compile else model
meter = Meter(args.seconds, args.report_every)
X, Y = get_batch()
iter_num = 0
while True:
    with ctx:
        logits, loss = forward(X, Y)
    X, Y = get_batch()  # prefetch the next batch while the GPU runs this one
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num % 50 == 0:  # the activation report: one sync in 50 steps when the norms stayed on the GPU
        if model.act_norms:
            norms = torch.tensor(model.act_norms) if read_each_layer else torch.stack(model.act_norms).cpu()
            norms = norms.view(-1, model_args["n_layer"])
            print(f"iter {iter_num}: act norm first/last layer {norms[:, 0].mean():.1f}/{norms[:, -1].mean():.1f}",
                  flush=True)
            model.act_norms.clear()
    if not meter.step():
        break
meter.done()
