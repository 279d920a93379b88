"""Lightning ImageNet-style training: torchvision ResNet-50 (weights=None), batch 128, bf16-mixed, channels_last,
8 DataLoader workers (RandomResizedCrop + flip on uint8 tensors) with pin_memory=True; normalised on the GPU.
Healthy: the GPU is busy; the trap is the pin-memory thread, which waits for the GIL but costs the GPU nothing.
Trap removed (--fixed): pin_memory=False (which does not help: the copy then blocks the main thread instead).
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import lightning as L
import torch.nn.functional as F
import torchvision
from torchvision.transforms import v2

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
BATCH, CROP, SRC = pick(128, 8), pick(224, 64), pick(256, 80)


class InMemoryImages(torch.utils.data.Dataset):
    """Random uint8 'photos' held in memory, augmented per sample in the workers (torchvision v2)."""

    def __init__(self, n_images: int):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n_images, 3, SRC, SRC), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 1000, (n_images,), generator=g)
        self.transform = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()])

    def __len__(self):
        return 1_000_000  # one epoch outlasts the run

    def __getitem__(self, i):
        i %= len(self.images)
        return self.transform(self.images[i]), self.labels[i]


class LitResNet(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = torchvision.models.resnet50(weights=None).to(memory_format=torch.channels_last)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        x, y = batch  # uint8 on the GPU: normalise there (a quarter of the bytes of float32 cross PCIe)
        x = ((x.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        return x, y

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.model(x), y, label_smoothing=0.1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9, nesterov=True, weight_decay=5e-5)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


# THE TRAP: pin_memory=True (a pin thread copies each batch to page-locked memory, then an async H2D copy)
loader = torch.utils.data.DataLoader(InMemoryImages(pick(1024, 32)), batch_size=BATCH, shuffle=True, drop_last=True,
                                     num_workers=8, pin_memory=not args.fixed)  # (one epoch outlasts the run: no
# persistent_workers, which with pin_memory makes the exit wait ~5 s per worker, pytorch#81794)
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[StepMeter()])
trainer.fit(LitResNet(), train_dataloaders=loader)
meter.done()
