"""torchvision's classification reference (train.py) in small: ResNet-18 from scratch, fp32 (the
reference's default, no --amp) in channels_last, SGD with momentum, per-sample RandomResizedCrop
and flip on decoded uint8 images, DataLoader(num_workers=0).

Cause (input_bound): with num_workers=0 the main process transforms all 256 samples of a batch
itself (~0.9 ms each), ~8x the GPU's ~28 ms step; the GPU waits for data. Fix (--fixed): num_workers=10.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import torchvision
from torchvision.transforms import v2

from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
torch.backends.cudnn.benchmark = True  # as the reference does unless --use-deterministic-algorithms

batch, crop, src, n_images = pick((256, 224, 256, 512), (8, 64, 80, 32))


class CachedImageFolder(torch.utils.data.Dataset):
    """ImageNet-sized index over decoded images kept in RAM as uint8 CHW tensors (random pixels)."""

    def __init__(self, transform):
        self.images = torch.randint(0, 256, (n_images, 3, src, src), dtype=torch.uint8)
        self.labels = torch.randint(0, 1000, (n_images,))
        self.transform = transform

    def __len__(self):
        return 1_281_167

    def __getitem__(self, i):
        j = i % n_images
        return self.transform(self.images[j]), self.labels[j]


# ClassificationPresetTrain(backend="tensor", use_v2=True) up to the float conversion; ToDtype and
# Normalize run on the GPU after the copy (a quarter of the bytes through collate and pinning).
transform = v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip(0.5)])
workers = 10 if args.fixed else 0  # the fix: 10 worker processes instead of the main process alone
loader = torch.utils.data.DataLoader(CachedImageFolder(transform), batch_size=batch, shuffle=True,
                                     num_workers=workers, pin_memory=gpu, drop_last=True)
# (not persistent_workers=True: with pin_memory it makes the exit wait 5 s per worker, pytorch#81794)

model = torchvision.models.resnet18(weights=None).to(device, memory_format=torch.channels_last)
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

model.train()
meter = Meter(args.seconds, args.report_every)
for image, target in forever(loader):
    image = image.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
    image = (image.float() - mean) / std
    target = target.to(device, non_blocking=True)
    loss = criterion(model(image), target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if not meter.step():
        break
meter.done()
