"""Lightning GPT pre-training: a 12-layer GPT (d=1024, 16 heads, separate q/k/v nn.Linear, ~185M parameters,
vocab 32768) on 512-token windows of random ids, batch 16, bf16-mixed, AdamW (~25-30 ms a step on an H100),
whose on_before_optimizer_step logs the gradient norm of each of its 196 parameters the way people write it:
norms[name] = p.grad.norm().item(), then the max.
Cause (sync_stall): each .item() waits for the GPU to finish all queued work and copies one number back, so the
CPU can never queue kernels ahead: the GPU idles through ~196 round trips (~50 us each, ~10 ms a step; the same
hook on a 16-layer encoder measured 8-10 ms) and again while the next step is launched from an empty queue.
Expect about +30-40%. Fix (--fixed): norms = torch.stack([p.grad.norm() ...]) on the GPU, log norms.max() as a tensor.
A second fix (--foreach-norm with --fixed, added after the fix was measured: gputop called the fixed job
host_bound, +20%, its hottest line the fix's own list of 196 norm launches): torch._foreach_norm, one launch
for all the norms, what clip_grad_norm_ does.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Meter, parse, pick, torch_and_device

import lightning as L
import torch.nn as nn
import torch.nn.functional as F

SECOND_FIX = "the second fix: the norms in one torch._foreach_norm launch"
args = parse(__doc__, lambda p: p.add_argument("--foreach-norm", action="store_true", help=SECOND_FIX))
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
BATCH, SEQ, VOCAB = pick(16, 4), pick(512, 64), pick(32768, 1000)
D, HEADS, LAYERS = pick(1024, 64), pick(16, 4), pick(12, 2)


class RandomTokens(torch.utils.data.Dataset):
    """Pre-tokenised text (random ids): the input costs nothing."""

    def __init__(self, n_tokens: int):
        self.data = torch.randint(0, VOCAB, (n_tokens,), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return 1_000_000  # an epoch far longer than the run: no epoch boundary (and worker restart) mid-run

    def __getitem__(self, i):
        i = i % (len(self.data) - SEQ - 1)
        return self.data[i:i + SEQ], self.data[i + 1:i + 1 + SEQ]


class Block(nn.Module):
    """A pre-LayerNorm GPT block with separate q, k, v projections."""

    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q, self.k, self.v, self.proj = (nn.Linear(D, D) for _ in range(4))
        self.fc, self.fc_out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.ln_1(x)
        q, k, v = (m(h).view(B, T, HEADS, D // HEADS).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class LitGPT(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.blocks(self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device)))
        logits = self.lm_head(self.ln_f(h))
        return F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))

    def on_before_optimizer_step(self, optimizer):
        if args.fixed:  # THE FIX: the norms stay on the GPU, nothing waits for it
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            if args.foreach_norm:  # the second fix: one launch for every norm
                norms = torch.stack(torch._foreach_norm(grads))
            else:
                norms = torch.stack([g.norm() for g in grads])
            self.log("grad_norm/max", norms.max())
        else:  # THE CAUSE: one .item() (a full wait for the GPU) per parameter
            norms = {}
            for name, p in self.named_parameters():
                if p.grad is not None:
                    norms[name] = p.grad.norm().item()
            self.log("grad_norm/max", max(norms.values()))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.01)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


loader = torch.utils.data.DataLoader(RandomTokens(pick(4_000_000, 100_000)), batch_size=BATCH, shuffle=True,
                                     drop_last=True, num_workers=2, pin_memory=device.type == "cuda")
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[StepMeter()])
trainer.fit(LitGPT(), train_dataloaders=loader)
meter.done()
