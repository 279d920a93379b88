"""A torch.compile'd transformer fed a new sequence length every few steps (issue 30, item 5).

Cause (recompilation): ``torch.compile(dynamic=False)`` specialises on the sequence length; each
new length fails a shape guard and compiles the model again (the recompile limit raised, as jobs
that hit it do), so the loop spends much of its time compiling.
Fix (--fixed): every batch padded to one length (the longest): one compile.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import importlib

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
dynamo = importlib.import_module("torch._dynamo")
dynamo.config.recompile_limit = 1000
dynamo.config.cache_size_limit = 1000
width, layers, batch, max_len = pick((1024, 6, 16, 512), (64, 2, 4, 64))
block = torch.nn.TransformerEncoderLayer(width, nhead=max(1, width // 64), dim_feedforward=4 * width, batch_first=True)
model = torch.nn.Sequential(torch.nn.Embedding(8192, width),
                            torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False),
                            torch.nn.Linear(width, 8192)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)


def forward_loss(tokens):
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


step_fn = torch.compile(forward_loss, dynamic=False, backend="inductor" if gpu else "eager")
meter = Meter(args.seconds, args.report_every)
step = 0
while True:
    # THE CAUSE: a new length every 10 steps (the fix: always the longest)
    length = max_len if args.fixed else max_len // 2 + (step // 10) % (max_len // 2)
    tokens = torch.randint(0, 8192, (batch, length + 1), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        loss = step_fn(tokens)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    step += 1
    if not meter.step():
        break
meter.done()
