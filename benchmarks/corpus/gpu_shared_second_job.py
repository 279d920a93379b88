"""A GPU-bound GPT-style loop whose GPU another job shares (issue 30, item 1).

Cause (gpu_shared): a second training job, started by someone else on the same GPU, runs large
bf16 matmuls; the two take turns on the GPU (time-slicing) and this job gets about half of it.
The second job is started here, detached (a double fork: it is not this job's child, as another
user's job would not be), and ends when this job does.
Fix (--fixed): the second job runs elsewhere (not started).
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import subprocess

from common import Meter, parse, pick, torch_and_device

OTHER = """
import os, sys, time, torch
watched = int(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
    try:
        os.kill(watched, 0)
    except ProcessLookupError:
        break
"""

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"

if gpu and not args.fixed:
    # THE CAUSE: another job on this GPU (detached: setsid, and its parent exits at once)
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    "sys.argv[1], sys.argv[2], sys.argv[3]], start_new_session=True, stdin=subprocess.DEVNULL, "
                    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
                    OTHER, str(os.getpid()), str(args.seconds + 120)], check=True)

width, layers, seq, batch = pick((2048, 12, 1024, 16), (128, 2, 64, 4))
block = torch.nn.TransformerEncoderLayer(width, nhead=max(1, width // 128), dim_feedforward=4 * width,
                                         batch_first=True, norm_first=True)
encoder = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
model = torch.nn.Sequential(torch.nn.Embedding(8192, width), encoder, torch.nn.Linear(width, 8192)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)
tokens = torch.randint(0, 8192, (batch, seq), device=device)
meter = Meter(args.seconds, args.report_every)
while True:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if not meter.step():
        break
meter.done()
