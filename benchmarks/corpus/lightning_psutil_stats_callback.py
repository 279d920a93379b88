"""Lightning image classification (a DeiT/timm-style recipe, written in plain torch.nn): a ViT-B/16 (12 blocks,
d=768, 12 heads, MLP 3072, ~86M parameters, ~105 GFLOP an image forward+backward, 1000 classes, label smoothing
0.1), bf16-mixed, AdamW, batch 128 of 224x224 random crops + flips of a bank of synthetic 256x256 uint8 images
(DataLoader(num_workers=8, pin_memory=True), the uint8 batch normalised on the GPU), CSVLogger in a temp dir.
~13.5 TFLOP a step: ~50-65 ms of GPU work on an H100 (~2,000-2,600 img/s eager), while the loop thread needs
only ~10-20 ms to queue a step's kernels. The run carries a "system stats" Callback copied from a forum answer:
every on_train_batch_end it logs psutil.cpu_percent(interval=0.1) and psutil.virtual_memory().percent through
pl_module.log.
Cause (loop_blocked): psutil.cpu_percent(interval=0.1) samples the CPU times, time.sleep(0.1), and samples them
again, on the training loop's thread, every step. The GPU drains the queued step in the first ~40-50 ms of the
sleep and then idles; the next step cannot be queued before the sleep ends (and the logged Python float goes
to the GPU as torch.tensor(value, device="cuda"), which waits for the stream anyway). A step takes ~10-20 ms of
launching + 100 ms of sleep ~ 112-123 ms instead of ~52-67 ms of GPU work: ~40-58% of the wall time lost. Expect
the fix to gain roughly +60% to +140% steps/s.
Fix (--fixed): psutil.cpu_percent(interval=None), which returns at once the CPU use since the previous call.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import tempfile

import psutil

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
import lightning as L
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger

gpu = device.type == "cuda"
meter = Meter(args.seconds, args.report_every)
STATS_INTERVAL = None if args.fixed else 0.1  # the fix: interval=None (non-blocking)
# ViT-B/16 at 224 px on the GPU; a 2-block, 64-wide ViT on 32 px images on the CPU
IMG, STORED, PATCH = pick(224, 32), pick(256, 40), pick(16, 8)
DIM, DEPTH, HEADS = pick(768, 64), pick(12, 2), pick(12, 4)
BATCH, CLASSES, WORKERS, BANK = pick(128, 16), pick(1000, 10), pick(8, 2), pick(512, 64)


class SyntheticImages(torch.utils.data.Dataset):
    """An ImageNet-like stream: random crops and flips of a bank of decoded uint8 images (made at start)."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.bank = torch.randint(0, 256, (BANK, 3, STORED, STORED), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, CLASSES, (BANK,), generator=g)

    def __len__(self):
        return 1_281_167  # one ImageNet epoch, far longer than the run

    def __getitem__(self, i):
        j = i % BANK
        y0, x0 = (int(v) for v in torch.randint(0, STORED - IMG + 1, (2,)))
        img = self.bank[j, :, y0:y0 + IMG, x0:x0 + IMG]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        return img.contiguous(), self.labels[j]


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LitViT(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, PATCH, PATCH)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, (IMG // PATCH) ** 2 + 1, DIM) * 0.02)
        self.blocks = nn.Sequential(*(Block(DIM, HEADS) for _ in range(DEPTH)))
        self.norm = nn.LayerNorm(DIM, eps=1e-6)
        self.head = nn.Linear(DIM, CLASSES)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])

    def training_step(self, batch, batch_idx):
        images, labels = batch
        images = (images.float() - self.mean) / self.std  # uint8 -> normalised float, on the GPU
        loss = F.cross_entropy(self(images), labels, label_smoothing=0.1)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.05)


class SystemStats(L.Callback):
    """Logs the machine's load next to the loss, every step."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # THE CAUSE: interval=0.1 sleeps 100 ms on the training loop's thread, every step
        pl_module.log("sys/cpu_percent", psutil.cpu_percent(interval=STATS_INTERVAL))
        pl_module.log("sys/ram_percent", psutil.virtual_memory().percent)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


out = tempfile.mkdtemp(prefix="corpus-lit-psutil-")
loader = torch.utils.data.DataLoader(SyntheticImages(), batch_size=BATCH, shuffle=True, drop_last=True,
                                     num_workers=WORKERS, pin_memory=gpu, persistent_workers=True)
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    logger=CSVLogger(out, name="vit"), enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[SystemStats(), StepMeter()])
try:
    trainer.fit(LitViT(), train_dataloaders=loader)
finally:
    meter.done()
    shutil.rmtree(out, ignore_errors=True)
