"""Lightning transformer classifier (6 encoder layers, d=768, 512 tokens, batch 32, bf16-mixed, AdamW) with a
callback that calls torch.cuda.empty_cache() after every training batch, as memory "cleanup" callbacks do.
Written after allocator_thrash's cost was set (fourth session of 2026-12-07), before it ran: an unseen check.
Cause (allocator_thrash): every call gives the cached segments back and the next step cudaMallocs them again.
Fix (--fixed): no cleanup callback.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import lightning as L
import torch.nn as nn
import torch.nn.functional as F

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
BATCH, SEQ, D, LAYERS, CLASSES, VOCAB = pick((32, 512, 768, 6, 50, 32000), (4, 32, 64, 2, 5, 500))


class Tokens(torch.utils.data.Dataset):
    """Pre-tokenised documents (random ids) and their labels, read by 4 workers: the input keeps up."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        return torch.randint(0, VOCAB, (SEQ,)), torch.randint(0, CLASSES, ()).item()


class LitTextClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed, self.pos = nn.Embedding(VOCAB, D), nn.Parameter(torch.zeros(SEQ, D))
        layer = nn.TransformerEncoderLayer(D, D // 64, 4 * D, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D, CLASSES)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        h = self.encoder(self.embed(ids) + self.pos)
        loss = F.cross_entropy(self.head(h.mean(1)), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.01)


class MemoryCleanup(L.Callback):
    """Frees "unused" GPU memory after each batch: the cause."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


loader = torch.utils.data.DataLoader(Tokens(), batch_size=BATCH, num_workers=4, pin_memory=device.type == "cuda")
callbacks = [StepMeter()] if args.fixed else [MemoryCleanup(), StepMeter()]
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=callbacks)
trainer.fit(LitTextClassifier(), train_dataloaders=loader)
meter.done()
