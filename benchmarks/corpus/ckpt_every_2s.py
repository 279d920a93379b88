"""nanoGPT-style train.py on a GPT-2 small (124M) that saves model and AdamW state (~1.5 GB) with
torch.save every 2 s. Cause (io_stall): each save copies the state to the host and writes it on the
training thread (~1 s), while the GPU idles. Fix (--fixed): save every 10 minutes (never in this run).
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import tempfile
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
# on the CPU the tiny model's state is padded with a 256 MB buffer (an EMA copy, say) so the save still shows
pad = None if device.type == "cuda" else torch.zeros(64 << 20)
ckpt_interval_s = 600.0 if args.fixed else 2.0  # the fix: checkpoint every 10 minutes
out_dir = tempfile.mkdtemp(prefix="corpus-ckpt-")
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
last_ckpt, iter_num = time.monotonic(), 0
while True:
    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch()  # prefetch the next batch while the GPU runs this one
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if time.monotonic() - last_ckpt >= ckpt_interval_s:
        checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_args": model_args,
                      "iter_num": iter_num, "ema": pad}
        torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))  # on the loop's thread: the GPU waits
        last_ckpt = time.monotonic()
    if not meter.step():
        break
meter.done()
shutil.rmtree(out_dir, ignore_errors=True)
