"""Lightning image classifier (a ResNet-34-like CNN, bf16-mixed, batch 128) on CPU-augmented images, num_workers=0.
Cause (input_bound): every sample is decoded from uint8 and augmented (random resized crop, flip, colour jitter)
with CPU tensor ops in the Dataset, in the training process itself, while the GPU waits for the batch.
Fix (--fixed): DataLoader(num_workers=12): the same augmentation runs ahead in 12 worker processes (8 on
the H200 left the loop still waiting ~11% for data: 7 of 8 workers at 100% CPU, gputop predicted +12%).
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import lightning as L
import torch.nn as nn
import torch.nn.functional as F

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
# Sized on an H200: ~0.4 ms of CPU a sample, ~60-70 ms a batch in the main process, against a ~25 ms GPU step;
# 8 workers make a batch every ~15 ms.
BATCH, CROP, SRC, CLASSES = pick(128, 16), pick(160, 48), pick(200, 64), 100


class AugmentedImages(torch.utils.data.Dataset):
    """Random uint8 'photos' held in memory; __getitem__ decodes and augments one of them on the CPU."""

    def __init__(self, n_images: int):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n_images, 3, SRC, SRC), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, CLASSES, (n_images,), generator=g)
        self.luma = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)

    def __len__(self):
        return 1_000_000  # an epoch far longer than the run: no epoch boundary (and worker restart) mid-run

    def __getitem__(self, i):
        i %= len(self.images)
        img = self.images[i].float()                                             # "decode"
        side = int(SRC * float(torch.empty(()).uniform_(0.35, 1.0)) ** 0.5)     # random resized crop
        y, x = torch.randint(0, SRC - side + 1, (2,)).tolist()
        img = F.interpolate(img[None, :, y:y + side, x:x + side], size=(CROP, CROP), mode="bilinear",
                            antialias=True, align_corners=False)[0]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        b, c, s = torch.empty(3).uniform_(0.6, 1.4).tolist()                     # colour jitter
        img = img * b
        mean = img.mean()
        img = (img - mean) * c + mean
        gray = (img * self.luma).sum(0, keepdim=True)
        img = (img - gray) * s + gray
        # back to uint8 (as torchvision's uint8 pipelines do): a quarter of float32's bytes to move and pin
        return img.clamp_(0, 255).round_().to(torch.uint8), self.labels[i]


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class LitCNN(L.LightningModule):
    def __init__(self):
        super().__init__()
        widths = pick((64, 128, 256, 512), (16, 32, 64, 128))
        layers = [nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)]
        for k, (w, n) in enumerate(zip(widths, pick((3, 4, 6, 3), (1, 1, 1, 1)))):   # ResNet-34 depths
            layers += [block(widths[max(k - 1, 0)], w, 1 if k == 0 else 2)] + [block(w, w, 1) for _ in range(n - 1)]
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[-1], CLASSES))
        self.net.to(memory_format=torch.channels_last)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

    def training_step(self, batch, batch_idx):
        x, y = batch  # normalised here, on the GPU
        x = ((x.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(self.net(x), y, label_smoothing=0.1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


# THE CAUSE: num_workers=0 runs __getitem__ for all BATCH samples in the main process, between two steps.
loader = torch.utils.data.DataLoader(AugmentedImages(pick(2048, 64)), batch_size=BATCH, shuffle=True, drop_last=True,
                                     num_workers=12 if args.fixed else 0, pin_memory=device.type == "cuda")
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[StepMeter()])
trainer.fit(LitCNN(), train_dataloaders=loader)
meter.done()
