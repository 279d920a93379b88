"""An fp16 mixed-precision loop whose forward overflows: GradScaler skips every step (issue 30, item 3).

Cause (skipped_steps): inputs with outliers push one layer's activations past fp16's range (65504);
the loss is inf/NaN, GradScaler finds inf gradients, skips every optimizer step and halves the loss
scale each time. The GPU stays busy and the job learns nothing, at full speed.
Fix (--fixed): bf16 autocast (fp32's range), no scaler.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
torch.manual_seed(0)
width, depth, batch = pick((4096, 6, 4096), (128, 2, 64))
layers = []
for _ in range(depth):
    layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler(device.type, enabled=not args.fixed)
dtype = torch.bfloat16 if args.fixed else torch.float16
x = torch.randn(batch, width, device=device)
x[:, :8] *= 3e4                      # THE CAUSE's trigger: outliers that overflow fp16 in the first matmul
y = torch.randint(0, 10, (batch,), device=device)
meter = Meter(args.seconds, args.report_every)
while True:
    with torch.autocast(device.type, dtype=dtype):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    if not meter.step():
        break
print(f"loss_scale {scaler.get_scale() if scaler.is_enabled() else None}", flush=True)
meter.done()
