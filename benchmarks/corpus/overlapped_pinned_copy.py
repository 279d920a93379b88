"""A bf16 MLP on large float32 feature batches, fed the way NVIDIA's data_prefetcher does it.

Healthy, with a trap: each 512 MiB batch sits in pinned host memory and is copied non_blocking
on a side CUDA stream while the GPU computes the current step (~30 ms of matmuls), so the copy
engine is busy a third of the time but the step never waits for it.
"Fix" (--fixed): the whole data set preloaded on the GPU (no copies at all); same speed.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"

rows, feat, depth, n_batches = pick((16384, 8192, 3, 4), (256, 256, 2, 2))
# The data set: n_batches x rows x feat float32 in page-locked host memory (2 GiB on a GPU),
# filled from the device so that start-up stays short.
host = [torch.empty(rows, feat, pin_memory=gpu).copy_(torch.randn(rows, feat, device=device))
        for _ in range(n_batches)]
labels = torch.randint(0, 1000, (n_batches, rows), device=device)
if args.fixed:
    resident = [b.to(device) for b in host]  # the "fix": everything resident on the GPU

layers = []
for _ in range(depth):
    layers += [torch.nn.Linear(feat, feat), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(feat, 1000)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)
copy_stream = torch.cuda.Stream() if gpu else None


def fetch(j):
    """Batch j: from the GPU-resident copy, or started copying on the side stream now."""
    if args.fixed:
        return resident[j % n_batches]
    if not gpu:
        return host[j % n_batches]
    with torch.cuda.stream(copy_stream):
        return host[j % n_batches].to(device, non_blocking=True)


meter = Meter(args.seconds, args.report_every)
i, nxt = 0, fetch(0)
while True:
    x = nxt
    if gpu and not args.fixed:
        torch.cuda.current_stream().wait_stream(copy_stream)  # batch i has landed
        x.record_stream(torch.cuda.current_stream())  # its memory is in use on this stream too
    nxt = fetch(i + 1)  # batch i+1 copies while this step computes
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        loss = torch.nn.functional.cross_entropy(model(x), labels[i % n_batches])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    i += 1
    if not meter.step():
        break
meter.done()
