"""timm ViT-B/16 (pretrained=False) trained at batch 256 in bf16 autocast with AdamW on batches already on the GPU
(timm benchmark.py style), with a tqdm progress bar updated every step (step count and lr in its postfix).
Healthy: the GPU-bound step is ~0.1 s; tqdm redraws at most every 0.1 s and reads no GPU value.
Trap removed (--fixed): no progress bar (tqdm(disable=True)).
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import timm
from timm.optim import create_optimizer_v2
from tqdm import tqdm

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
MODEL, BATCH = pick(("vit_base_patch16_224", 256), ("vit_tiny_patch16_224", 4))
STEPS_PER_EPOCH = 5000  # an ImageNet epoch at this batch size

model = timm.create_model(MODEL, pretrained=False, num_classes=1000).to(device)
optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
# two synthetic batches resident on the GPU: the input costs nothing (the job is about the bar)
images = torch.randn(2, BATCH, 3, 224, 224, device=device)
labels = torch.randint(0, 1000, (2, BATCH), device=device)

model.train()
bar = tqdm(total=STEPS_PER_EPOCH, desc="train", unit="step", dynamic_ncols=True, disable=args.fixed)  # THE TRAP
step = 0
while True:
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = loss_fn(model(images[step % 2]), labels[step % 2])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step += 1
    bar.update(1)
    bar.set_postfix(step=step, lr=f"{optimizer.param_groups[0]['lr']:.2e}", refresh=False)
    if not meter.step():
        break
bar.close()
meter.done()
