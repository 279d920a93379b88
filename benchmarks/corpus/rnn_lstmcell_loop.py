"""Word-level LSTM language model (pytorch/examples word_language_model: 2 layers, hidden 1024, BPTT 128,
batch 64) whose recurrence is nn.LSTMCell stepped in a Python loop over the time steps.
Cause (launch_bound): 128 steps x 2 layers of small cell calls, a dozen tiny kernels each, forward and backward:
the CPU launches slower than the GPU runs them. Fix (--fixed): one nn.LSTM (cuDNN) over the sequence, same maths.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import torch.nn as nn
import torch.nn.functional as F

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
torch.set_float32_matmul_precision("high")  # TF32, as a recipe on Hopper would
VOCAB, HIDDEN, LAYERS, BPTT, BATCH = pick(10_000, 1_000), pick(1024, 64), 2, pick(128, 16), pick(64, 8)


class RNNModel(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.fused = fused
        self.encoder = nn.Embedding(VOCAB, HIDDEN)
        self.drop = nn.Dropout(0.2)
        if fused:
            self.rnn = nn.LSTM(HIDDEN, HIDDEN, LAYERS, dropout=0.2)
        else:
            self.cells = nn.ModuleList(nn.LSTMCell(HIDDEN, HIDDEN) for _ in range(LAYERS))
        self.decoder = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens, hidden):                       # tokens: (BPTT, BATCH)
        x = self.drop(self.encoder(tokens))
        if self.fused:
            out, hidden = self.rnn(x, hidden)
        else:
            h, c = list(hidden[0].unbind(0)), list(hidden[1].unbind(0))
            outs = []
            for x_t in x.unbind(0):                          # THE CAUSE: one Python iteration per time step
                for k, cell in enumerate(self.cells):
                    h[k], c[k] = cell(x_t, (h[k], c[k]))
                    x_t = self.drop(h[k]) if k < LAYERS - 1 else h[k]   # nn.LSTM's inter-layer dropout
                outs.append(x_t)
            out, hidden = torch.stack(outs), (torch.stack(h), torch.stack(c))
        return self.decoder(self.drop(out)), hidden


model = RNNModel(fused=args.fixed).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
# the corpus, batchified on the GPU as in the example: (tokens_per_column, BATCH)
data = torch.randint(0, VOCAB, (BPTT * 64 + 1, BATCH), device=device)
zeros = torch.zeros(LAYERS, BATCH, HIDDEN, device=device)
hidden = (zeros, zeros)

model.train()
step = 0
while True:
    i = (step % 64) * BPTT
    inputs, targets = data[i:i + BPTT], data[i + 1:i + 1 + BPTT]
    hidden = tuple(t.detach() for t in hidden)               # truncated BPTT: carry the state, not its graph
    logits, hidden = model(inputs, hidden)
    loss = F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
    step += 1
    if not meter.step():
        break
meter.done()
