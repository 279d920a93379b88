"""torchvision ResNet-50 at batch 128, bf16 autocast, channels_last, SGD, fed by 8 DataLoader workers
(flip only, keeps up), with torch.cuda.empty_cache() after every optimizer step, as notebooks add it
"to avoid out-of-memory errors". Written as an unseen check of allocator_thrash's cost (H100, fourth
session of 2026-12-07): its label is the rule's, and the fix's gain decides whether it holds.
Cause (allocator_thrash): every call gives the allocator's cached segments back and the next step
cudaMallocs them again. Fix (--fixed): no empty_cache() in the loop.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import torchvision
from torchvision.transforms import v2

from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
torch.backends.cudnn.benchmark = True

batch, crop, n_images = pick((128, 224, 512), (8, 64, 32))


class CachedCrops(torch.utils.data.Dataset):
    """Decoded, cropped photos kept in RAM as uint8 CHW tensors (random pixels)."""

    def __init__(self, transform):
        self.images = torch.randint(0, 256, (n_images, 3, crop, crop), dtype=torch.uint8)
        self.labels = torch.randint(0, 1000, (n_images,))
        self.transform = transform

    def __len__(self):
        return 1_281_167

    def __getitem__(self, i):
        j = i % n_images
        return self.transform(self.images[j]), self.labels[j]


loader = torch.utils.data.DataLoader(CachedCrops(v2.RandomHorizontalFlip(0.5)), batch_size=batch, shuffle=True,
                                     num_workers=pick(8, 2), pin_memory=gpu, drop_last=True)
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
    if not args.fixed and gpu:
        torch.cuda.empty_cache()  # the cause: the allocator's cache given back every step
    if not meter.step():
        break
meter.done()
