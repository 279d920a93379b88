"""timm ViT-S/16 (pretrained=False) trained at batch 128 in bf16 autocast with AdamW on batches already on the
GPU (timm benchmark.py style), calling torch.cuda.empty_cache() after every optimizer step.
Written after allocator_thrash's cost was set (fourth session of 2026-12-07), before it ran: an unseen check.
Cause (allocator_thrash): every call gives the cached segments back and the next step cudaMallocs them again.
Fix (--fixed): no empty_cache() in the loop.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import timm
from timm.optim import create_optimizer_v2

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
MODEL, BATCH = pick(("vit_small_patch16_224", 128), ("vit_tiny_patch16_224", 4))

model = timm.create_model(MODEL, pretrained=False, num_classes=1000).to(device)
optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
images = torch.randn(2, BATCH, 3, 224, 224, device=device)   # two synthetic batches resident on the GPU
labels = torch.randint(0, 1000, (2, BATCH), device=device)

model.train()
step = 0
while True:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = loss_fn(model(images[step % 2]), labels[step % 2])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step += 1
    if not args.fixed and device.type == "cuda":
        torch.cuda.empty_cache()  # the cause: the allocator's cache given back every step
    if not meter.step():
        break
meter.done()
