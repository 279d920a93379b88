"""A wide ResNet-34-style CNN (bf16 autocast, channels_last) trained on in-memory uint8 images that
the training loop augments batch by batch with CPU tensor ops (flip, shift, colour jitter).

Cause (host_bound): the augmentation runs on the main thread's CPU, ~5x as long as the GPU's
step; the GPU waits for it every step. Fix (--fixed): copy the uint8 batch first and run the
very same augmentation on the GPU.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import random

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
nn = torch.nn

batch, size, n_batches, widths, depths = pick((256, 160, 8, (96, 192, 384, 768), (3, 4, 6, 3)),
                                              (16, 64, 2, (16, 32, 32, 64), (1, 1, 1, 1)))


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                  nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


stages, cin = [], widths[0]
for i, (w, n) in enumerate(zip(widths, depths)):
    stages += [Basic(cin if j == 0 else w, w, 2 if i and j == 0 else 1) for j in range(n)]
    cin = w
model = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True),
                      nn.MaxPool2d(3, 2, 1), *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(widths[-1], 100)).to(device, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)

images = torch.randint(0, 256, (n_batches, batch, 3, size, size), dtype=torch.uint8)  # decoded, in RAM
labels = torch.randint(0, 100, (n_batches, batch))
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def augment(xb):
    """Flip, shift, brightness/contrast jitter, normalise: on whatever device xb is on."""
    x = xb.float().div_(255)
    flip = torch.rand(len(x), 1, 1, 1, device=x.device) < 0.5
    x = torch.where(flip, x.flip(3), x)
    x = torch.roll(x, shifts=(random.randint(-16, 16), random.randint(-16, 16)), dims=(2, 3))
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    contrast = 1 + 0.4 * (torch.rand(len(x), 1, 1, 1, device=x.device) - 0.5)
    bright = 1 + 0.4 * (torch.rand(len(x), 1, 1, 1, device=x.device) - 0.5)
    x = ((x - mean) * contrast + mean) * bright
    x = (x - MEAN.to(x.device)) / STD.to(x.device)
    return x.contiguous(memory_format=torch.channels_last)


meter = Meter(args.seconds, args.report_every)
i = 0
while True:
    xb, y = images[i % n_batches], labels[i % n_batches].to(device)
    if args.fixed:
        x = augment(xb.to(device))  # the fix: move the uint8 batch, augment on the GPU
    else:
        x = augment(xb).to(device)  # as is: augment on the CPU, then copy the float batch
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    i += 1
    if not meter.step():
        break
meter.done()
