"""DLRM-style click-through model (10 categorical features in nn.Embedding tables of 128 dims, 15.5M rows and
2B parameters in all, dense AdamW on them; 8 dense features through a bottom MLP, pairwise dot interactions, a
1024-1024-512 top MLP; bf16 autocast, batch 4096) trained from a raw in-memory table of 500k impressions (numpy
columns of ids, counts, prices). The GPU step (~15 ms on an H100) is mostly AdamW streaming the 8 GB tables.
Cause (host_bound): each batch's features are built inline on the training thread before model(...): sample
rows, hash the string ids ("user:123") per row with md5, cross user x category, item x hour and shop x city,
bucketize the price, log-transform the counts, then copy to the GPU: ~30-40 ms of single-threaded CPU a batch,
during which the GPU idles (the pageable copies also wait for the last step): expected +100% to +250% steps/s
without it. Fix (--fixed): featurize the whole table once before the loop (the same function over all rows),
keep the features on the GPU and index each batch from them.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hashlib
from contextlib import nullcontext

import numpy as np

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
nn = torch.nn

ROWS, BATCH, DIM = pick(500_000, 20_000), pick(4096, 256), pick(128, 16)
TOP = pick((1024, 1024, 512), (128, 64))
# hash buckets of the hashed features, then the vocabularies of the plain categorical ones
BUCKETS = dict(user=pick(5_000_000, 5_000), item=pick(2_000_000, 5_000), shop=pick(500_000, 2_000),
               user_x_cat=pick(5_000_000, 5_000), item_x_hour=pick(2_000_000, 5_000),
               shop_x_city=pick(1_000_000, 5_000))
CATEGORIES, CITIES, HOURS = 5_000, 1_000, 24
PRICE_EDGES = np.geomspace(0.5, 5_000, 63)  # 64 price buckets

rng = np.random.default_rng(0)
table = dict(  # the raw log: one row an impression (random numbers, nothing is downloaded)
    user_id=rng.integers(0, 50_000_000, ROWS), item_id=rng.integers(0, 5_000_000, ROWS),
    shop_id=rng.integers(0, 300_000, ROWS), category=rng.integers(0, CATEGORIES, ROWS),
    city=rng.integers(0, CITIES, ROWS), hour=rng.integers(0, HOURS, ROWS),
    price=rng.lognormal(3.0, 1.5, ROWS).astype(np.float32), clicks_7d=rng.poisson(3.0, ROWS),
    views_30d=rng.poisson(40.0, ROWS), dwell_s=rng.exponential(20.0, ROWS).astype(np.float32),
    clicked=(rng.random(ROWS) < 0.1).astype(np.float32))


def hash_bucket(key: str, buckets: int) -> int:
    """A stable hash of a string id (Python's hash() changes from run to run)."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:8], "little") % buckets


def featurize(t, rows):
    """Model inputs of the given rows of the raw table: categorical ids, dense features, labels."""
    user, item, shop = t["user_id"][rows].tolist(), t["item_id"][rows].tolist(), t["shop_id"][rows].tolist()
    cat, city, hour = t["category"][rows], t["city"][rows], t["hour"][rows]
    sparse = np.stack([
        [hash_bucket(f"user:{u}", BUCKETS["user"]) for u in user],
        [hash_bucket(f"item:{i}", BUCKETS["item"]) for i in item],
        [hash_bucket(f"shop:{s}", BUCKETS["shop"]) for s in shop],
        [hash_bucket(f"{u}x{c}", BUCKETS["user_x_cat"]) for u, c in zip(user, cat.tolist())],  # crosses
        [hash_bucket(f"{i}x{h}", BUCKETS["item_x_hour"]) for i, h in zip(item, hour.tolist())],
        [hash_bucket(f"{s}x{c}", BUCKETS["shop_x_city"]) for s, c in zip(shop, city.tolist())],
        cat, city, np.digitize(t["price"][rows], PRICE_EDGES), hour,
    ], axis=1).astype(np.int64)
    clicks, views, price = t["clicks_7d"][rows], t["views_30d"][rows], t["price"][rows]
    dense = np.stack([
        np.log1p(clicks), np.log1p(views), (clicks + 1) / (views + 10), np.log(price),
        np.log1p(t["dwell_s"][rows]) - 2.5, np.sin(2 * np.pi * hour / 24), np.cos(2 * np.pi * hour / 24),
        np.log1p(views - np.minimum(clicks, views)),
    ], axis=1).astype(np.float32)
    return sparse, dense, t["clicked"][rows]


def mlp(*widths):
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, vocab_sizes, dim, n_dense):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(n, dim) for n in vocab_sizes)
        self.bottom = mlp(n_dense, 4 * dim, 2 * dim, dim)
        n_f = len(vocab_sizes) + 1
        self.register_buffer("pairs", torch.triu_indices(n_f, n_f, 1), persistent=False)
        self.top = mlp(dim + n_f * (n_f - 1) // 2, *TOP, 1)

    def forward(self, sparse, dense):
        x = self.bottom(dense)
        f = torch.stack([x] + [e(sparse[:, k]) for k, e in enumerate(self.emb)], dim=1)  # (B, F, D)
        dots = (f @ f.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


with torch.device(device):  # random init, straight on the GPU
    model = DLRM(list(BUCKETS.values()) + [CATEGORIES, CITIES, len(PRICE_EDGES) + 1, HOURS], DIM, n_dense=8)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=device.type == "cuda")
ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
loss_fn = nn.BCEWithLogitsLoss()

if args.fixed:  # the fix: every row's features once, on the GPU; a batch is an index into them
    features = [torch.from_numpy(a).to(device) for a in featurize(table, np.arange(ROWS))]

meter = Meter(args.seconds, args.report_every)
model.train()
while True:
    if args.fixed:
        idx = torch.randint(ROWS, (BATCH,), device=device)
        sparse, dense, label = (a[idx] for a in features)
    else:  # as a notebook does it: sample rows, featurize them, copy them over
        rows = rng.integers(0, ROWS, BATCH)
        sparse, dense, label = (torch.from_numpy(a).to(device) for a in featurize(table, rows))
    with ctx:
        loss = loss_fn(model(sparse, dense).float(), label)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if not meter.step():
        break
meter.done()
