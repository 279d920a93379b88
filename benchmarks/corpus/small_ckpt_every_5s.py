"""A GPU-bound Lightning CNN (~5 M params, 128x128 images, batch 256, bf16-mixed) with a callback that saves a
~21 MB weights-only checkpoint (trainer.save_checkpoint) every 5 s.
Healthy: each save drains the GPU and writes for some tens of ms, about 1% of the 5 s between saves.
Trap removed (--fixed): no checkpoint callback.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import shutil
import tempfile
import time

import lightning as L
import torch.nn as nn
import torch.nn.functional as F

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
BATCH, SIZE, WIDTHS = pick(256, 8), pick(128, 32), pick((64, 128, 256, 256), (16, 32, 64, 64))


class PinnedBatches(torch.utils.data.Dataset):
    """Ready uint8 batches in pinned memory (the input costs nothing here: the job is about the checkpoint)."""

    def __init__(self, n: int):
        pin = device.type == "cuda"
        self.x = [torch.randint(0, 256, (BATCH, 3, SIZE, SIZE), dtype=torch.uint8) for _ in range(n)]
        self.x = [x.pin_memory() if pin else x for x in self.x]
        self.y = [torch.randint(0, 200, (BATCH,)) for _ in range(n)]

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        return self.x[i % len(self.x)], self.y[i % len(self.y)]


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class LitCNN(L.LightningModule):
    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(3, WIDTHS[0], 3, 2, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU(inplace=True)]
        for k, w in enumerate(WIDTHS):
            layers += [block(WIDTHS[max(k - 1, 0)], w, 1 if k == 0 else 2), block(w, w, 1)]
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(WIDTHS[-1], 200))
        self.net.to(memory_format=torch.channels_last)

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x.float().div_(127.5).sub_(1).contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


class SaveEvery(L.Callback):
    """Saves the weights every `seconds` of wall time, over the same file (keep the latest)."""

    def __init__(self, path: str, seconds: float):
        self.path, self.seconds, self.last = path, seconds, time.monotonic()

    def on_train_start(self, trainer, pl_module):
        self.last = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if time.monotonic() - self.last >= self.seconds:
            trainer.save_checkpoint(self.path, weights_only=True)
            self.last = time.monotonic()


tmp = tempfile.mkdtemp(prefix="small_ckpt_every_5s-")
callbacks = [StepMeter()]
if not args.fixed:  # THE TRAP: a small checkpoint every 5 s
    callbacks.append(SaveEvery(os.path.join(tmp, "last.ckpt"), 5.0))
loader = torch.utils.data.DataLoader(PinnedBatches(4), batch_size=None)
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=callbacks)
trainer.fit(LitCNN(), train_dataloaders=loader)
meter.done()
shutil.rmtree(tmp, ignore_errors=True)
