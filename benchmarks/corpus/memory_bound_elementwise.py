"""A residual stack of LayerNorm -> GELU -> per-channel scale blocks on 65536 x 2048 bf16
activations (a bf16 model): every kernel streams ~0.3-1 GB through HBM, so the GPU is busy but
limited by DRAM bandwidth, not by the tensor cores.

Healthy, with a trap: a torch.cuda.synchronize() after every step to time it; the next step's
kernels queue within microseconds of it, next to a ~25 ms step. "Fix" (--fixed): no synchronize.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import time

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
F = torch.nn.functional

tokens, d, depth = pick((32 * 2048, 2048, 12), (1024, 128, 4))
dtype = torch.bfloat16 if gpu else torch.float32


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.scale = torch.nn.Parameter(torch.full((d,), 0.1))

    def forward(self, x):
        return x + self.scale * F.gelu(self.norm(x))  # 4 elementwise-class kernels, no matmul


model = torch.nn.Sequential(*[Block() for _ in range(depth)]).to(device, dtype)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=gpu)
x = torch.randn(tokens, d, device=device, dtype=dtype)
target = torch.randn(tokens, d, device=device, dtype=dtype)

meter = Meter(args.seconds, args.report_every)
step_ms = []
while True:
    t0 = time.perf_counter()
    loss = F.mse_loss(model(x), target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if gpu and not args.fixed:
        torch.cuda.synchronize()  # the trap: wait for the step, for an exact step time
    step_ms.append((time.perf_counter() - t0) * 1e3)
    if not meter.step():
        break
print(f"median step {sorted(step_ms)[len(step_ms) // 2]:.2f} ms (host side)", flush=True)
meter.done()
