"""Word-level LSTM language model (pytorch/examples word_language_model: 2 layers, hidden 1024, BPTT 128,
batch 64) whose recurrence is nn.LSTMCell stepped in a Python loop over the time steps.
Cause (launch_bound): 128 steps x 2 layers of small cell calls, a dozen tiny kernels each, forward and backward:
the CPU launches slower than the GPU runs them. Fix (--fixed): one nn.LSTM (cuDNN) over the sequence, same maths.
A second fix (--graph-step, added after the first was measured: +609% where gputop predicted +187%, since
cuDNN also cuts the GPU's own work): the same cells, their forward, loss and backward captured as one CUDA
graph (launch overhead removed, the GPU's kernels kept); gradient clipping and SGD step outside it.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import torch.nn as nn
import torch.nn.functional as F

SECOND_FIX = "the second fix: the LSTMCell loop's forward, loss and backward in one CUDA graph"
args = parse(__doc__, lambda p: p.add_argument("--graph-step", action="store_true", help=SECOND_FIX))
if args.fixed and args.graph_step:
    print("rnn_lstmcell_loop: --fixed and --graph-step are two fixes: give one", file=sys.stderr)
    sys.exit(2)
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
graph = None
if args.graph_step and device.type == "cuda":
    # The second fix: static inputs, targets and state; warm up on a side stream (no update), then
    # capture forward, loss and backward once. The gradients are made inside the capture (set to None
    # before it), so each replay writes them afresh where clipping and SGD read them.
    static_in, static_tg = data[:BPTT].clone(), data[1:1 + BPTT].clone()
    static_h = (zeros.clone(), zeros.clone())

    def forward_backward():
        logits, out_h = model(static_in, static_h)
        F.cross_entropy(logits.view(-1, VOCAB), static_tg.reshape(-1)).backward()
        return out_h

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            forward_backward()
    torch.cuda.current_stream().wait_stream(side)
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_h = forward_backward()
step = 0
while True:
    i = (step % 64) * BPTT
    inputs, targets = data[i:i + BPTT], data[i + 1:i + 1 + BPTT]
    if graph is not None:
        static_in.copy_(inputs)
        static_tg.copy_(targets)
        graph.replay()
        for dst, src in zip(static_h, graph_h):              # truncated BPTT: carry the state
            dst.copy_(src.detach())
    else:
        hidden = tuple(t.detach() for t in hidden)           # truncated BPTT: carry the state, not its graph
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
