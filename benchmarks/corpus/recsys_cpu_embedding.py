"""DLRM-style click-through model: 8 sparse features looked up in nn.EmbeddingBag tables of 1-3 M rows
(sum-pooled multi-hot bags, sparse gradients, SGD), a bottom MLP on 13 dense features, pairwise dot
interactions and a top MLP on the GPU (bf16 autocast), batch 16384.
Cause (host_bound): the tables stay on the CPU, so their lookups, backward and sparse SGD update run on
the main thread between GPU steps. Fix (--fixed): the embedding tables live on the GPU.
A second fix (--gpu-batches, with --fixed; added after gputop judged the fixed job h2d_copy_bound, +69% on
the H200, +58% on an H100: its line copying the host batches' indices held 23% of the time while the GPU
idled): the batches are
staged on the GPU once, so the fixed job's remaining host-to-device copies go too.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import torch.nn as nn
import torch.nn.functional as F

SECOND_FIX = "the second fix (with --fixed): the batches staged on the GPU once, no host copies per step"
args = parse(__doc__, lambda p: p.add_argument("--gpu-batches", action="store_true", help=SECOND_FIX))
if args.gpu_batches and not args.fixed:
    print("recsys_cpu_embedding: --gpu-batches is the second fix, on top of --fixed: give both", file=sys.stderr)
    sys.exit(2)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
ROWS = pick([3_000_000, 3_000_000, 2_000_000, 2_000_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000], [20_000] * 8)
DIM, HOTS, BATCH, DENSE = 64, 8, pick(16384, 256), 13
EMB_DEVICE = device if args.fixed else torch.device("cpu")   # THE CAUSE: the tables are kept on the CPU


def mlp(sizes, last_act=True):
    layers = []
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_act or k < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        # DLRM's uniform(-1/sqrt(n), 1/sqrt(n)) init, made where the table lives (GPU init is instant)
        self.tables = nn.ModuleList(
            nn.EmbeddingBag.from_pretrained(torch.empty(n, DIM, device=EMB_DEVICE).uniform_(-n ** -0.5, n ** -0.5),
                                            freeze=False, mode="sum", sparse=True) for n in ROWS)
        self.bottom = mlp([DENSE, 512, 256, DIM]).to(device)
        n_feat = len(ROWS) + 1
        self.li, self.lj = torch.tril_indices(n_feat, n_feat, -1, device=device)
        self.top = mlp([DIM + len(self.li), 1024, 1024, 512, 256, 1], last_act=False).to(device)

    def forward(self, dense, indices, offsets):
        z = self.bottom(dense)
        pooled = [t(idx, offsets) for t, idx in zip(self.tables, indices)]          # on EMB_DEVICE
        feats = torch.cat([z[:, None], torch.stack(pooled, 1).to(device, non_blocking=True)], 1)
        inter = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]        # pairwise dot products
        return self.top(torch.cat([z, inter], 1)).squeeze(1)


model = DLRM()
sparse_opt = torch.optim.SGD(model.tables.parameters(), lr=0.05)             # sparse rows only
dense_opt = torch.optim.Adagrad(list(model.bottom.parameters()) + list(model.top.parameters()), lr=0.01)


def make_batch(g):
    """A pre-processed Criteo-like batch as a data pipeline would hand it over (pinned when on the GPU)."""
    def pin(t):
        return t.pin_memory() if device.type == "cuda" else t
    return dict(dense=pin(torch.randn(BATCH, DENSE, generator=g)),
                clicks=pin(torch.randint(0, 2, (BATCH,), generator=g).float()),
                indices=[pin(torch.randint(0, n, (BATCH * HOTS,), generator=g)) for n in ROWS],
                offsets=pin(torch.arange(0, BATCH * HOTS, HOTS)))


g = torch.Generator().manual_seed(0)
batches = [make_batch(g) for _ in range(4)]
if args.gpu_batches:   # the second fix: .to() below is then a no-op for every tensor already there
    # (the lookups' indices and offsets where the tables are, the rest on the GPU)
    batches = [{k: [t.to(EMB_DEVICE) for t in v] if isinstance(v, list)
                else v.to(EMB_DEVICE if k == "offsets" else device) for k, v in b.items()} for b in batches]
step = 0
while True:
    b = batches[step % len(batches)]
    dense, clicks = b["dense"].to(device, non_blocking=True), b["clicks"].to(device, non_blocking=True)
    indices = [i.to(EMB_DEVICE, non_blocking=True) for i in b["indices"]]
    offsets = b["offsets"].to(EMB_DEVICE, non_blocking=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = F.binary_cross_entropy_with_logits(model(dense, indices, offsets).float(), clicks)
    sparse_opt.zero_grad(set_to_none=True)
    dense_opt.zero_grad(set_to_none=True)
    loss.backward()
    sparse_opt.step()
    dense_opt.step()
    step += 1
    if not meter.step():
        break
meter.done()
