"""A training loop whose compiled loss recompiles in training (issue 30, item 5).

Variable-length batches (a new sequence length every 20 steps) under ``torch.compile(...,
dynamic=False)``: each new length fails the compiled code's shape guard and dynamo compiles the
function again. The recompile limit is raised, as a user does who first meets its warning; the
compiles then never stop. ``--fixed`` pads every batch to one length, the fix the verdict
advises. The ``eager`` backend keeps each compile short on a CPU (inductor's would take seconds
and need a C compiler); dynamo's guards and recompiles are the same.

``--compile-s S``: each compile takes S seconds more (the backend waits, then runs eager), as
inductor's did on the H200 (10.2 s a recompile, and 5.5 s for its backward): a verdict window of
10 s then never holds two recompiles, and the loop takes no step for longer than the stall
detector's 10 s while it compiles.

Usage: recompile_train.py [--fixed] [--duration S] [--compile-s S]
"""

import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--duration", type=float, default=60.0)
p.add_argument("--compile-s", type=float, default=0.0)
args = p.parse_args()

torch.set_num_threads(1)
torch._dynamo.config.recompile_limit = 100_000
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def forward_loss(x):
    return model(x).pow(2).mean()


def slow_backend(gm, example_inputs):
    """A compile that takes --compile-s seconds (the eager backend after a wait)."""
    time.sleep(args.compile_s)
    return gm.forward


step_fn = torch.compile(forward_loss, backend=slow_backend if args.compile_s else "eager", dynamic=False)
print("ready", flush=True)
t0 = time.time()
step = 0
while time.time() - t0 < args.duration:
    length = 32 + step // 20                   # the batch's sequence length
    x = torch.randn(16, length, 64)
    if args.fixed:
        x = torch.nn.functional.pad(x, (0, 0, 0, 512 - length))[:, :512]   # padded to one length
    loss = step_fn(x)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
