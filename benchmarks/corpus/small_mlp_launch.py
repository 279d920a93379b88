"""A 24-layer narrow MLP (width 256, LayerNorm + GELU blocks) trained at batch 64.

Cause (launch_bound): each step is ~300 kernels of a few microseconds each; the Python and
kernel-launch overhead of issuing them takes far longer than the GPU needs to run them.
Fix (--fixed): torch.cuda.make_graphed_callables on the model: forward and backward each replay
as one CUDA graph (the loss and the fused optimizer step stay outside it). No-op on a CPU.
A second fix (--graph-step, added after the first was measured: +226%, and its fixed job was still
judged launch_bound, CPU 98% busy, GPU 30%): forward, loss and backward captured as one CUDA graph
(torch.cuda.graph, as the CUDA graphs docs' whole-network example); the fused AdamW steps outside it
on the graph's static gradients, so the optimizer-step hook still counts each step.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

from common import Meter, parse, pick, torch_and_device

SECOND_FIX = "the second fix: forward, loss and backward in one CUDA graph, the fused optimizer outside"
args = parse(__doc__, lambda p: p.add_argument("--graph-step", action="store_true", help=SECOND_FIX))
if args.fixed and args.graph_step:
    print("small_mlp_launch: --fixed and --graph-step are two fixes: give one", file=sys.stderr)
    sys.exit(2)
torch, device = torch_and_device()
gpu = device.type == "cuda"

width, depth, batch, classes = 256, 24, 64, 10
steps_in_data = pick(512, 16)


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc, self.norm = torch.nn.Linear(d, d), torch.nn.LayerNorm(d)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.norm(self.fc(x)))  # residual keeps 24 layers trainable


model = torch.nn.Sequential(torch.nn.Linear(32, width), *[Block(width) for _ in range(depth)],
                            torch.nn.Linear(width, classes)).to(device)
# fused=True: one kernel for the whole update, in both variants (the graph leaves it outside).
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=gpu)

# A small tabular data set already on the device, served as fixed-size batches (a graph needs
# the same shapes every step).
xs = torch.randn(steps_in_data, batch, 32, device=device)
ys = torch.randint(0, classes, (steps_in_data, batch), device=device)

if args.fixed and gpu:
    # The fix: capture forward and backward once (it warms up on a side stream by itself).
    model = torch.cuda.make_graphed_callables(model, (xs[0],))

graph = None
if args.graph_step and gpu:
    # The second fix: warm up on a side stream (no update), then capture forward, loss and backward
    # with static inputs; the gradients are made inside the capture (set to None before it), so each
    # replay writes them afresh where the optimizer reads them: never zero them outside again.
    static_x, static_y = xs[0].clone(), ys[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(static_x), static_y).backward()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.nn.functional.cross_entropy(model(static_x), static_y).backward()

meter = Meter(args.seconds, args.report_every)
i = 0
while True:
    x, y = xs[i % steps_in_data], ys[i % steps_in_data]
    if graph is not None:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
    else:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    opt.step()
    i += 1
    if not meter.step():
        break
meter.done()
