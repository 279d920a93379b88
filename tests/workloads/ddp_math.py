"""Two-rank DDP on gloo: a few steps, then a hash of the parameters (tests/test_ddp_collectives.py).

    python -m torch.distributed.run --nproc-per-node 2 tests/workloads/ddp_math.py OUT [--probe] [--user-hook]

--probe installs gputop's probe first (its DDP hook goes in at the first forward); --user-hook
registers the job's own comm hook after the first forward (it must run, in the probe's place).
Prints nothing; rank 0 writes OUT: {"hash", "user_hook_calls", "ddp_comm"}.
"""

import hashlib
import json
import sys

import torch
import torch.distributed as dist

probe = None
if "--probe" in sys.argv:
    import gputop.probe
    probe = gputop.probe.install()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)          # different data per rank: the all-reduce matters
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
torch.manual_seed(0)
for p in model.parameters():
    torch.nn.init.normal_(p)
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)   # several buckets
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
calls = [0]
for step in range(5):
    x = torch.randn(8, 32) * (rank + 1)
    loss = ddp(x).pow(2).mean()
    if step == 0 and "--user-hook" in sys.argv:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def counting(state, bucket):
            calls[0] += 1
            return default_hooks.allreduce_hook(state, bucket)
        ddp.register_comm_hook(None, counting)
    loss.backward()
    opt.step()
    opt.zero_grad()
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"hash": h, "user_hook_calls": calls[0],
                   "ddp_comm": probe.hooks.get("ddp_comm") if probe is not None else None}, f)
dist.destroy_process_group()
