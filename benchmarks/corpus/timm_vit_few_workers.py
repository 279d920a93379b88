"""timm train.py-style loop: ViT-S/8 (bf16 autocast, AdamW, batch 128) fed by timm's create_loader with heavy
per-sample CPU transforms (RandomResizedCrop with random interpolation, flip, RandAugment m9) and 2 DataLoader workers.
Cause (input_bound): 2 worker processes make about half the images per second the GPU trains on, so the GPU waits
for each batch. Fix (--fixed): num_workers=12: the same transforms keep well ahead of the GPU.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, forever, parse, pick, torch_and_device

import numpy as np
import timm
from PIL import Image
from timm.data import create_loader
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
# Sized on an H200: ~3 ms of worker CPU a sample (PIL transforms, collate, shared memory), so 2 workers make a batch
# every ~190 ms, 12 workers every ~35 ms, against a ~90 ms GPU step (ViT-S/8: 785 tokens an image).
MODEL, BATCH, SRC = pick(("vit_small_patch8_224", 128, 288), ("vit_tiny_patch16_224", 8, 256))


class RandomPhotos(torch.utils.data.Dataset):
    """An ImageNet-like folder, held in memory: random uint8 RGB 'photos' handed to the transform as PIL
    images (the decoded JPEGs of a real ImageDataset). create_loader sets .transform, as in timm."""

    def __init__(self, n_images: int):
        rng = np.random.default_rng(0)
        self.pixels = rng.integers(0, 256, (n_images, SRC, SRC, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 1000, n_images)
        self.transform = None

    def __len__(self):
        return 1_000_000  # one epoch outlasts the run: no epoch boundary mid-measurement

    def __getitem__(self, i):
        i %= len(self.pixels)
        return self.transform(Image.fromarray(self.pixels[i])), int(self.labels[i])


model = timm.create_model(MODEL, pretrained=False, num_classes=1000, drop_path_rate=0.1).to(device)
optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
loss_fn = LabelSmoothingCrossEntropy(smoothing=0.1)
# timm's train.py path: uint8 batches from fast_collate, normalised and randomly erased on the GPU by the
# PrefetchLoader. THE CAUSE: num_workers=2 (timm's default is 4; the fix gives the 16-core host 12).
loader = create_loader(RandomPhotos(pick(1024, 32)), input_size=(3, 224, 224), batch_size=BATCH, is_training=True,
                       use_prefetcher=True, re_prob=0.25, re_mode="pixel", auto_augment="rand-m9-mstd0.5-inc1",
                       interpolation="random", num_workers=12 if args.fixed else 2, pin_memory=True, device=device,
                       persistent_workers=False)

model.train()
batches = forever(loader)
for x, y in batches:
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if not meter.step():
        break
meter.done()
batches.close()  # shuts the workers down now, not in the interpreter's teardown
