"""timm train.py-style ImageNet classification loop (timm resnet50 from timm.create_model, 25.6M parameters, no
pretrained weights; bf16 autocast, channels_last, SGD nesterov momentum 0.9, label smoothing 0.1, batch 256 x
3x224x224 synthetic images made on the GPU like timm's --synthetic loader, ~55-75 ms a step on an H100) in which
the author left a debugging habit in the loop: every 5 steps it torch.save()s the batch's images (fp32, 154 MB),
pre-pool features (256x2048x7x7 fp32, 103 MB), logits, softmax probabilities, predictions and targets to one file
on local disk (~260 MB, overwritten each time), then flush() + os.fsync() "so the notebook never reads half a file".
Cause (io_stall): each dump drains the GPU (.cpu() of every tensor, pageable device-to-host copies), serialises
~260 MB into the page cache and waits for fsync to push it to the disk: ~0.2-0.45 s on the training thread for
every ~0.3 s of training, while the GPU idles. Expect the fix to gain roughly +40% to +150% steps/s.
Fix (--fixed): dump_every=5000, so no dump falls within the run.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import tempfile

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
import torch.nn as nn

gpu = device.type == "cuda"
BATCH, IMG, CLASSES = pick(256, 16), pick(224, 64), pick(1000, 100)
dump_every = 5000 if args.fixed else 5  # the fix: dump every 5000 steps, not every 5
fmt = torch.channels_last if gpu else torch.contiguous_format  # channels_last convs are slow on the CPU

try:
    import timm
except ImportError:  # a CPU box without timm: a small ResNet with timm's forward_features / forward_head split
    timm = None


class SmallResNet(nn.Module):
    def __init__(self, num_classes, widths=(32, 64, 128, 256)):
        super().__init__()
        layers, c_in = [nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()], widths[0]
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(c_in, w, 3, 1 if i == 0 else 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                       nn.Conv2d(w, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            c_in = w
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, num_classes)

    def forward_features(self, x):
        return self.features(x)

    def forward_head(self, x):
        return self.fc(x.mean((2, 3)))


torch.backends.cudnn.benchmark = True
if timm is not None:
    model = timm.create_model(pick("resnet50", "resnet10t"), pretrained=False, num_classes=CLASSES)
else:
    model = SmallResNet(CLASSES)
model = model.to(device, memory_format=fmt)
optimizer = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.9, nesterov=True, weight_decay=5e-5)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
MEAN = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
dump_dir = tempfile.mkdtemp(prefix="corpus-timm-debug-")  # local disk; the same file is overwritten each time
dump_path = os.path.join(dump_dir, "last_batch.pt")


def synthetic_batch():
    """timm's prefetcher output: uint8-range pixels normalised on the GPU, channels_last."""
    x = torch.randint(0, 256, (BATCH, 3, IMG, IMG), device=device, dtype=torch.uint8)
    x = ((x.float() - MEAN) / STD).contiguous(memory_format=fmt)
    return x, torch.randint(0, CLASSES, (BATCH,), device=device)


def dump_debug(step, images, features, logits, target):
    """The leftover debugging hook: everything about this batch, to look at later in a notebook."""
    state = {"step": step, "images": images.float().cpu(), "features": features.float().cpu(),
             "logits": logits.float().cpu(), "probs": logits.float().softmax(-1).cpu(),
             "preds": logits.argmax(-1).cpu(), "targets": target.cpu()}
    with open(dump_path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # wait until it is really on the disk


meter = Meter(args.seconds, args.report_every)
model.train()
step = 0
try:
    while True:
        images, target = synthetic_batch()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
            features = model.forward_features(images)
            logits = model.forward_head(features)
            loss = criterion(logits, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step % dump_every == 0:
            dump_debug(step, images, features.detach(), logits.detach(), target)
        del features, logits
        if not meter.step():
            break
finally:
    meter.done()
    shutil.rmtree(dump_dir, ignore_errors=True)
