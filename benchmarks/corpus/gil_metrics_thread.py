"""A GPT-style transformer (6 layers, d=1024, bf16 autocast) trained beside a telemetry thread.

Cause (gil_contention): the telemetry thread summarises a window of 100k recent samples
(percentiles via sorted(), a histogram in a Python loop, formatted lines) again and again with
no pause; the training loop waits for the GIL before each launch and the GPU runs dry.
Fix (--fixed): the telemetry thread sleeps 5 s between summaries.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import collections
import random
import threading
import time

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
F = torch.nn.functional

d, layers, heads, batch, seq, vocab = pick((1024, 6, 16, 16, 512, 8192), (64, 2, 4, 4, 32, 256))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).view(batch, seq, 3, heads, d // heads).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(batch, seq, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


model = torch.nn.Sequential(torch.nn.Embedding(vocab, d), *[Block() for _ in range(layers)],
                            torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=gpu)
tokens = torch.randint(0, vocab, (64, batch, seq + 1), device=device)

# Telemetry: a rolling window of per-sample latencies (prefilled with the earlier history) that a
# side thread turns into percentiles and a text histogram for a dashboard.
window = collections.deque((random.random() for _ in range(100_000)), maxlen=100_000)
latest = {}


def summarise():
    values = list(window)
    ordered = sorted(values)  # one long C call: the GIL is held the whole time
    pct = {p: ordered[int(p / 100 * (len(ordered) - 1))] for p in (50, 90, 99, 99.9)}
    hist = {}
    for v in values:  # pure-Python loop over the list
        b = int(v * 40)
        hist[b] = hist.get(b, 0) + 1
    lines = [f"{b / 40:5.3f} {'#' * (60 * c // len(values))}" for b, c in sorted(hist.items())]
    latest.update(pct=pct, histogram="\n".join(lines), at=time.time())


def telemetry():
    while True:
        summarise()
        if args.fixed:
            time.sleep(5.0)  # the fix: summarise every 5 s instead of spinning


def train_step(x):
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.float().view(-1, vocab), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


train_step(tokens[0])  # CUDA and cuBLAS warm-up, before the dashboard thread starts
threading.Thread(target=telemetry, name="telemetry", daemon=True).start()

meter = Meter(args.seconds, args.report_every)
i = 0
while True:
    t0 = time.perf_counter()
    train_step(tokens[i % len(tokens)])
    window.append(time.perf_counter() - t0)
    i += 1
    if not meter.step():
        break
meter.done()
