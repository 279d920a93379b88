"""A small MLP trained on large float32 feature batches that live in pageable host memory.

Cause (h2d_copy_bound): every step copies a 256 MiB batch with a plain ``.to(device)`` from
pageable memory (~6 GB/s, synchronous), far longer than the model's few milliseconds of compute.
Fix (--fixed): pin the host batches once at start-up and copy them with ``non_blocking=True``.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"

# A host-side data set of precomputed features (think: audio or sensor embeddings), a few batches
# cycled over: 8192 rows x 8192 float32 features = 256 MiB a batch on the GPU.
rows, feat, hidden, n_batches = pick((8192, 8192, 4096, 4), (256, 512, 256, 2))
# Made on the device and brought back, so start-up stays short; .cpu() gives pageable memory.
host = [torch.randn(rows, feat, device=device).cpu() for _ in range(n_batches)]
labels = [torch.randint(0, 100, (rows,)).to(device) for _ in range(n_batches)]
if args.fixed:
    host = [b.pin_memory() for b in host] if gpu else host  # the fix: page-locked once, reused

model = torch.nn.Sequential(
    torch.nn.Linear(feat, hidden), torch.nn.GELU(),
    torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
    torch.nn.Linear(hidden, 100),
).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)

meter = Meter(args.seconds, args.report_every)
i = 0
while True:
    # As is: a synchronous pageable copy, the CPU and the GPU's compute both wait for it.
    # Fixed: a DMA from pinned memory, queued without blocking the host (same bytes moved).
    x = host[i % n_batches].to(device, non_blocking=args.fixed)
    y = labels[i % n_batches]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    i += 1
    if not meter.step():
        break
meter.done()
