"""torchvision classification reference (train.py) style: ResNet-50 (25.6M parameters, bf16 autocast,
channels_last, SGD momentum 0.9, label smoothing 0.1) at batch 128 on 224x224 crops of JPEG photos.
The "ImageFolder" is ~2000 JPEGs (256 to 400 px a side, quality 90) encoded once at start and held in
memory as bytes; each sample is decoded with PIL, then RandomResizedCrop(224) + RandomHorizontalFlip +
ToTensor + Normalize, in DataLoader(num_workers=2, pin_memory=True).
Cause (input_bound): a sample costs ~2 ms of CPU (JPEG decode ~0.8 ms, antialiased crop-resize, ToTensor,
Normalize), so two workers make ~1000 samples/s, a batch every ~120-140 ms, while the GPU trains a batch
in ~40 ms (the loop never syncs, so a step takes as long as its batch) and waits for data most of the time.
Fix (--fixed): DataLoader(num_workers=14) (the machine has 16 cores): the same pipeline makes a batch in
~20 ms and keeps up with the GPU; expected gain about +150% to +250% steps/s (the step becomes GPU-bound).
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import io
import random

import numpy as np
from PIL import Image

from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
import torch.nn as nn
import torchvision
from torchvision import transforms

gpu = device.type == "cuda"
BATCH, CROP, N_IMAGES, CLASSES = pick(128, 8), pick(224, 48), pick(2000, 64), pick(1000, 10)
SIDES = pick((256, 400), (56, 80))
fmt = torch.channels_last if gpu else torch.contiguous_format  # channels_last convs are slow on the CPU


def make_jpegs(n, seed=0):
    """Random-ish 'photos': smooth colour fields (upsampled noise) with a little grain, JPEG-encoded."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w, h = (int(s) for s in rng.integers(SIDES[0], SIDES[1] + 1, size=2))
        low = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(low).resize((w, h), Image.BICUBIC), dtype=np.int16)
        img = np.clip(img + rng.integers(-12, 13, size=img.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class InMemoryJPEGs(torch.utils.data.Dataset):
    """ImageFolder stand-in: JPEG bytes in memory, decoded and augmented per sample like the reference's
    ClassificationPresetTrain (PIL backend)."""

    def __init__(self, blobs, transform):
        self.blobs, self.transform = blobs, transform
        self.targets = [random.Random(i).randrange(CLASSES) for i in range(len(blobs))]

    def __len__(self):
        return 1_281_167  # ImageNet's train set: one epoch is far longer than the run

    def __getitem__(self, i):
        i %= len(self.blobs)
        img = Image.open(io.BytesIO(self.blobs[i])).convert("RGB")
        return self.transform(img), self.targets[i]


train_transform = transforms.Compose([
    transforms.RandomResizedCrop(CROP, interpolation=transforms.InterpolationMode.BILINEAR, antialias=True),
    transforms.RandomHorizontalFlip(0.5),
    transforms.ToTensor(),
    transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
])
dataset = InMemoryJPEGs(make_jpegs(N_IMAGES), train_transform)
# THE CAUSE: two workers decode and augment every sample of a 128-image batch.
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True,
                                     num_workers=14 if args.fixed else 2,  # the fix: num_workers=14
                                     pin_memory=gpu)

torch.backends.cudnn.benchmark = True
if gpu:
    model = torchvision.models.resnet50(weights=None, num_classes=CLASSES)
else:  # a ResNet-10 on the CPU so the smoke run steps a few times a second
    model = torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=CLASSES)
model = model.to(device, memory_format=fmt)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=2e-5)

meter = Meter(args.seconds, args.report_every)
model.train()
for image, target in forever(loader):
    image = image.to(device, non_blocking=True).contiguous(memory_format=fmt)
    target = target.to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        output = model(image)
        loss = criterion(output, target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if not meter.step():
        break
meter.done()
