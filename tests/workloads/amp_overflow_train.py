"""Mixed precision that skips every optimizer step (issue 30, item 3).

An fp16 autocast forward whose activations overflow fp16's range (65504), as inputs with
outliers or a layer whose weights grew make them: the loss is NaN, GradScaler finds inf
gradients, skips every step and halves the loss scale each time (it reaches 0); the loop runs at
full speed and learns nothing. ``--fixed``: bf16 autocast (fp32's range), no scaler. CPU
autocast: torch's CPU float16 autocast and GradScaler("cpu") behave as CUDA's do here. (With
outliers in only some batches the scale collapses as well and the good batches skip too: a
share skipped is not 1/N of the bad ones.)

Usage: amp_overflow_train.py [--fixed] [--duration S]
"""

import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--duration", type=float, default=60.0)
args = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128))
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
scaler = torch.amp.GradScaler("cpu", enabled=not args.fixed)
dtype = torch.bfloat16 if args.fixed else torch.float16
print("ready", flush=True)
t0 = time.time()
while time.time() - t0 < args.duration:
    x = torch.randn(64, 128) * 400_000     # activations past fp16's 65504
    with torch.autocast("cpu", dtype=dtype):
        loss = model(x).float().tanh().pow(2).mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
