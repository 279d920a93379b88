"""The nanoGPT model and batch sampler the nanoGPT-style corpus jobs share (nanoGPT's model.py and
train.py's get_batch, condensed): one definition, so that the jobs differ only in what they are
about (a checkpoint, an evaluation, a sync in forward, a logged loss)."""

from __future__ import annotations

import numpy as np
import torch

F, nn = torch.nn.functional, torch.nn


class Block(nn.Module):
    """nanoGPT's pre-LayerNorm transformer block."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.ln_1, self.ln_2 = heads, nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block_size, n_layer, d, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        for m in self.modules():  # GPT-2's init: N(0, 0.02)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def after_block(self, x) -> None:
        """Called with each block's output (a job that watches its activations overrides it)."""

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
            self.after_block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def get_batch(data, block_size: int, batch_size: int, device):
    """nanoGPT's get_batch over a memory-mapped-like token array: pinned, non_blocking on a GPU."""
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y
