"""DDPM-style diffusion training: a UNet (ch 128, mults 1-2-2-2, 2 res blocks a level, attention at 16x16, ~36 M
params) predicts the noise on 32x32 images, batch 256, bf16 autocast, Adam + clipping, with an EMA of the weights
updated every step by torch._foreach_lerp_. Healthy: the EMA is one foreach pass over ~150 MB, ~0.1 ms of an
~80 ms step. Trap removed (--fixed): the EMA every 10 steps (decay**10).
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import math

import torch.nn as nn
import torch.nn.functional as F

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
CH, BATCH, T_STEPS, DECAY = pick(128, 32), pick(256, 8), 1000, 0.9999


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x))) + self.t(F.silu(temb))[:, :, None, None]
        return self.skip(x) + self.c2(self.drop(F.silu(self.n2(h))))


class Attn(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm, self.qkv, self.proj = nn.GroupNorm(32, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, 3, 1, C, H * W).transpose(-1, -2).unbind(1)
        h = F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(B, C, H, W)
        return x + self.proj(h)


class UNet(nn.Module):
    def __init__(self, ch=CH, mults=(1, 2, 2, 2), attn_res=(16,), res=32):
        super().__init__()
        self.temb = nn.Sequential(nn.Linear(ch, 4 * ch), nn.SiLU(), nn.Linear(4 * ch, 4 * ch))
        self.inc = nn.Conv2d(3, ch, 3, padding=1)
        self.down, chans, c = nn.ModuleList(), [ch], ch
        for i, m in enumerate(mults):
            for _ in range(2):
                self.down.append(nn.ModuleList([ResBlock(c, ch * m, 4 * ch),
                                                Attn(ch * m) if res in attn_res else None]))
                c = ch * m
                chans.append(c)
            if i < len(mults) - 1:
                self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                chans.append(c)
                res //= 2
        self.mid = nn.ModuleList([ResBlock(c, c, 4 * ch), Attn(c), ResBlock(c, c, 4 * ch)])
        self.up = nn.ModuleList()
        for i, m in reversed(list(enumerate(mults))):
            for _ in range(3):
                self.up.append(nn.ModuleList([ResBlock(c + chans.pop(), ch * m, 4 * ch),
                                              Attn(ch * m) if res in attn_res else None]))
                c = ch * m
            if i > 0:
                self.up.append(nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(c, c, 3, padding=1)))
                res *= 2
        self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def forward(self, x, t):
        half = self.inc.out_channels // 2
        freqs = torch.exp(-math.log(10_000) * torch.arange(half, device=x.device) / half)
        temb = self.temb(torch.cat([(t[:, None] * freqs).sin(), (t[:, None] * freqs).cos()], 1))
        hs = [self.inc(x)]
        for layer in self.down:
            if isinstance(layer, nn.ModuleList):
                h = layer[0](hs[-1], temb)
                hs.append(layer[1](h) if layer[1] is not None else h)
            else:
                hs.append(layer(hs[-1]))
        h = self.mid[2](self.mid[1](self.mid[0](hs[-1], temb)), temb)
        for layer in self.up:
            if isinstance(layer, nn.ModuleList):
                h = layer[0](torch.cat([h, hs.pop()], 1), temb)
                h = layer[1](h) if layer[1] is not None else h
            else:
                h = layer(h)
        return self.out(h)


model = UNet().to(device)
params = [p for p in model.parameters()]
ema = [p.detach().clone() for p in params]           # the EMA weights that get sampled from
optimizer = torch.optim.Adam(params, lr=2e-4, fused=device.type == "cuda")
alphas_bar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, T_STEPS, device=device), 0)
data = torch.randint(0, 256, (pick(8192, 64), 3, 32, 32), dtype=torch.uint8, device=device)   # "CIFAR-10" on the GPU
EVERY = 10 if args.fixed else 1                      # THE TRAP: EMA every step

step = 0
while True:
    x0 = data[torch.randint(0, len(data), (BATCH,), device=device)].float().div(127.5).sub(1)
    x0 = torch.where(torch.rand(BATCH, 1, 1, 1, device=device) < 0.5, x0.flip(-1), x0)          # random flip
    t = torch.randint(0, T_STEPS, (BATCH,), device=device)
    noise = torch.randn_like(x0)
    ab = alphas_bar[t][:, None, None, None]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t.float()).float(), noise)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    step += 1
    if step % EVERY == 0:
        with torch.no_grad():
            torch._foreach_lerp_(ema, params, 1 - DECAY ** EVERY)
    if not meter.step():
        break
meter.done()
