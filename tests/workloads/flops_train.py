"""A real CPU training job for the probe's FLOP count (tests/test_flops.py).

Phase 1: an MLP fed by a DataLoader (batch 16), fp32: the exact matmul FLOPs are computed here.
Phase 2: a small GPT-style transformer under CPU autocast bf16 (another batch shape, so the
probe counts again): 6 x params x tokens, plus the attention matmuls.
Phase 3: torch.compile is called (the compiled model is never run) and the shape changes again:
the probe must then say n/a with the reason.

Writes the analytic counts to --out and waits for --hold-file before exiting.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--out", required=True)
ap.add_argument("--hold-file", required=True)
ap.add_argument("--wait-monitor", type=float, default=60.0)
args = ap.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)

import gputop.probe  # noqa: E402  (loaded by `gputop run`'s boot code already)

deadline = time.monotonic() + args.wait_monitor
while time.monotonic() < deadline and not gputop.probe.status().get("monitoring"):
    time.sleep(0.05)

out: dict = {}


def mark(name: str) -> None:
    out[name] = {"steps": gputop.probe.status().get("steps"), "t": time.time()}


# -- phase 1: MLP, one step per epoch: every step forks a DataLoader worker (the counted one too) --


class Flagged(torch.utils.data.Dataset):
    """Each item says whether a TorchDispatchMode was active in the worker that made it."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        return self.x[i], self.y[i], torch.tensor(_get_current_dispatch_mode() is not None)


B, dims = 16, [64, 256, 256, 10]
mlp = nn.Sequential(nn.Linear(dims[0], dims[1]), nn.ReLU(), nn.Linear(dims[1], dims[2]), nn.ReLU(),
                    nn.Linear(dims[2], dims[3]))
# One optimizer for all phases: the probe's steps come from a *lead* optimizer, replaced only
# after it has been quiet for LEAD_OPTIMIZER_QUIET_S (2 s); a second optimizer taking over at a
# phase change would leave that phase's first seconds (on a fast run: all of it) without steps.
opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
layers = list(zip(dims[:-1], dims[1:]))
fwd = sum(2 * B * i * o for i, o in layers)
bwd_w = sum(2 * B * i * o for i, o in layers)               # weight gradients, every layer
bwd_x = sum(2 * B * i * o for i, o in layers[1:])           # input gradients, not for the data
out["mlp_flops"] = fwd + bwd_w + bwd_x
ds = Flagged(torch.randn(B, dims[0]), torch.randint(0, 10, (B,)))
loader = DataLoader(ds, batch_size=B, num_workers=1, multiprocessing_context="fork")
# Each step of the first two phases also waits STEP_PAD_S, so that each phase lasts ~2 s: the
# probe sends a window a second (WINDOW_S), and a phase shorter than that (0.3 s for the
# transformer on an idle 2-core box) can end before any window carries its count.
STEP_PAD_S = 0.1
t0 = time.perf_counter()
out["worker_saw_a_mode"] = False
for _ in range(args.steps):
    for x, y, flag in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(mlp(x), y).backward()
        opt.step()
        out["worker_saw_a_mode"] = out["worker_saw_a_mode"] or bool(flag.any())
        time.sleep(STEP_PAD_S)
out["mlp_step_ms"] = (time.perf_counter() - t0) / args.steps * 1000
mark("mlp_done")


# -- phase 2: GPT-style transformer, bf16 autocast ----------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


V, D, L, H, T, BT = 512, 128, 2, 4, 16, 8
emb = nn.Embedding(V, D)
blocks = nn.Sequential(*[Block(D, H) for _ in range(L)])
head = nn.Linear(D, V, bias=False)
gpt = nn.ModuleList([emb, blocks, head])
opt.add_param_group({"params": list(gpt.parameters())})
opt2 = opt
matmul_params = sum(m.weight.numel() for m in gpt.modules() if isinstance(m, nn.Linear))
tokens = BT * T
out["gpt_matmul_params"] = matmul_params
out["gpt_tokens"] = tokens
# 6 N T for the weights' matmuls; attention: QK^T and AV, 2*2*T*T*D per sequence per layer
# forward, x3 with the backward (causal masking is not skipped by the math kernel).
out["gpt_6nt"] = 6 * matmul_params * tokens
out["gpt_flops"] = 6 * matmul_params * tokens + 3 * L * BT * 4 * T * T * D
toks = torch.randint(0, V, (BT * args.steps, T + 1))
for (seq,) in DataLoader(TensorDataset(toks), batch_size=BT):
    opt2.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head(blocks(emb(seq[:, :-1])))
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, V), seq[:, 1:].reshape(-1))
    loss.backward()
    opt2.step()
    time.sleep(STEP_PAD_S)
mark("gpt_done")

# -- phase 3: torch.compile in use, new shape: n/a -------------------------------------------------
compiled = torch.compile(mlp)   # never run: the probe only has to know compile is in use
# Before any further step or batch: the earlier (eager) count is withdrawn at once.
out["off_right_after_compile"] = gputop.probe._PROBE.flops.message()["off"]
ds3 = TensorDataset(torch.randn(8 * args.steps, dims[0]), torch.randint(0, 10, (8 * args.steps,)))
for x, y in DataLoader(ds3, batch_size=8):
    opt.zero_grad()
    nn.functional.cross_entropy(mlp(x), y).backward()
    opt.step()
mark("compile_done")

tmp = args.out + ".tmp"
with open(tmp, "w") as f:
    json.dump(out, f)
os.replace(tmp, args.out)
deadline = time.monotonic() + 120
while not os.path.exists(args.hold_file) and time.monotonic() < deadline:
    time.sleep(0.05)
