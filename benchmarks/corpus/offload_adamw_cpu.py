"""A GPT-style transformer whose AdamW steps on the CPU: ZeRO-Offload by hand (issue 30, item 2).

Cause (optimizer_offload): the model runs on the GPU in bf16, but the optimizer holds fp32 master
weights on the host. Each step copies every gradient to the host (a blocking, pageable
``.to("cpu")``), runs AdamW there, and copies the weights back; the GPU idles through all three.
Fix (--fixed): the fp32 master weights and a fused AdamW stay on the GPU (the state fits: ~0.3 B
parameters need ~5 GB).
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"

width, layers, seq, batch = pick((1536, 8, 512, 8), (128, 2, 64, 4))
block = torch.nn.TransformerEncoderLayer(width, nhead=max(1, width // 128), dim_feedforward=4 * width,
                                         batch_first=True, norm_first=True)
encoder = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
model = torch.nn.Sequential(torch.nn.Embedding(8192, width), encoder,
                            torch.nn.Linear(width, 8192)).to(device)
if gpu:
    model = model.to(torch.bfloat16)
params = [p for p in model.parameters()]
if args.fixed:
    # the fix: fp32 master weights and the optimizer's state on the GPU, one fused kernel a step
    master = [p.detach().float().clone().requires_grad_(False) for p in params]
    opt = torch.optim.AdamW(master, lr=1e-4, fused=gpu)
else:
    # THE CAUSE: fp32 master weights on the host, AdamW on the CPU
    master = [p.detach().float().cpu().clone() for p in params]
    opt = torch.optim.AdamW(master, lr=1e-4)

tokens = torch.randint(0, 8192, (batch, seq), device=device)
meter = Meter(args.seconds, args.report_every)
while True:
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    model.zero_grad(set_to_none=True)
    loss.backward()
    for m, p in zip(master, params):
        m.grad = p.grad.to(m.device, torch.float32)   # as is: a blocking device->host copy of each gradient
    opt.step()
    with torch.no_grad():
        for m, p in zip(master, params):
            p.copy_(m)                                  # as is: the weights back, host->device
    if not meter.step():
        break
meter.done()
