"""A GPU-bound GPT-style transformer (plain PyTorch: 12 layers, d=1024, seq 1024, batch 16, bf16 autocast,
fused AdamW) beside a status-logging thread that wakes every 20 ms to format a line to a log file.
Healthy: the thread holds the GIL ~50 us per wake-up (<1%), never reads a GPU value, and the GPU stays busy.
Trap removed (--fixed): no logging thread.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import logging
import shutil
import tempfile
import threading
import time

import torch.nn as nn
import torch.nn.functional as F

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
LAYERS, DIM, HEADS, SEQ, BATCH, VOCAB = pick((12, 1024, 16, 1024, 16, 32_000), (2, 64, 4, 64, 4, 1000))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(approximate="tanh"), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def status_logger(stop: threading.Event, path: str):
    """Formats a status line every 20 ms: host-side numbers only (no .item(): nothing waits for the GPU)."""
    log = logging.getLogger("status")
    log.propagate = False
    log.addHandler(logging.FileHandler(path))
    log.setLevel(logging.INFO)
    last_steps, last_t = 0, time.perf_counter()
    while not stop.wait(0.02):
        now = time.perf_counter()
        mem = torch.cuda.memory_allocated() / 2**30 if device.type == "cuda" else 0.0
        log.info("step %d | %.1f steps/s | lr %.2e | mem %.2f GiB | threads %d", meter.steps,
                 (meter.steps - last_steps) / (now - last_t), optimizer.param_groups[0]["lr"], mem,
                 threading.active_count())
        last_steps, last_t = meter.steps, now


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device.type == "cuda")
data = torch.randint(0, VOCAB, (8, BATCH, SEQ + 1), device=device)   # a few token batches resident on the GPU
tmp = tempfile.mkdtemp(prefix="logger_thread_light-")
stop = threading.Event()
if not args.fixed:  # THE TRAP: a light logging thread
    threading.Thread(target=status_logger, args=(stop, os.path.join(tmp, "status.log")), daemon=True).start()

step = 0
while True:
    batch = data[step % len(data)]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step += 1
    if not meter.step():
        break
stop.set()
meter.done()
logging.shutdown()
shutil.rmtree(tmp, ignore_errors=True)
