"""torchvision ResNet-50 from scratch at batch 256, bf16 autocast, channels_last, SGD, fed by a
DataLoader with 8 workers doing per-sample RandomResizedCrop + flip on decoded uint8 images.

Healthy: each sample costs a worker ~0.9 ms, so 8 workers make a batch in about half of the GPU's
~55 ms step; the GPU never waits. "Fix" (--fixed): 16 workers; no faster, the GPU is the limit.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import torchvision
from torchvision.transforms import v2

from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
torch.backends.cudnn.benchmark = True

batch, crop, src, n_images = pick((256, 224, (256, 320), 512), (8, 64, (80, 96), 32))


class CachedImageFolder(torch.utils.data.Dataset):
    """ImageNet-sized index over decoded photos kept in RAM as uint8 CHW tensors (random pixels)."""

    def __init__(self, transform):
        self.images = torch.randint(0, 256, (n_images, 3, *src), dtype=torch.uint8)
        self.labels = torch.randint(0, 1000, (n_images,))
        self.transform = transform

    def __len__(self):
        return 1_281_167

    def __getitem__(self, i):
        j = i % n_images
        return self.transform(self.images[j]), self.labels[j]


# The reference's training preset up to the float conversion; ToDtype and Normalize run on the GPU.
transform = v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip(0.5)])
workers = 16 if args.fixed else 8  # the trap's "fix": twice the workers, which nothing is waiting for
loader = torch.utils.data.DataLoader(CachedImageFolder(transform), batch_size=batch, shuffle=True,
                                     num_workers=workers, pin_memory=gpu, drop_last=True)
# (not persistent_workers=True: with pin_memory it makes the exit wait 5 s per worker, pytorch#81794)

model = torchvision.models.resnet50(weights=None).to(device, memory_format=torch.channels_last)
criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=2e-5)
mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

model.train()
meter = Meter(args.seconds, args.report_every)
for image, target in forever(loader):
    image = image.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
    image = (image.float() - mean) / std
    target = target.to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        loss = criterion(model(image), target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if not meter.step():
        break
meter.done()
