"""Two-rank DDP on gloo: the same few steps three times, then a hash of the parameters of each
(tests/test_ddp_collectives.py).

    python -m torch.distributed.run --nproc-per-node 2 tests/workloads/ddp_math.py OUT

One job runs all three (each rank imports torch once, which is most of the cost):

1. plain: before gputop's probe is loaded;
2. probed: after ``gputop.probe.install()`` (its DDP hook goes in at the model's first forward);
3. user: probed, and the job registers its own comm hook after the first forward (it must run,
   in the probe's place).

Each starts from the same parameters and sees the same batches. Prints nothing; rank 0 writes
OUT: {"plain", "probed", "user" (hashes), "user_hook_calls", "ddp_comm"}.
"""

import gc
import hashlib
import json
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def train(user_hook: bool = False) -> tuple[str, int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    for p in model.parameters():
        torch.nn.init.normal_(p)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)   # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)      # different data per rank: the all-reduce matters
    calls = [0]
    for step in range(5):
        x = torch.randn(8, 32, generator=data) * (rank + 1)
        loss = ddp(x).pow(2).mean()
        if step == 0 and user_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            def counting(state, bucket):
                calls[0] += 1
                return default_hooks.allreduce_hook(state, bucket)
            ddp.register_comm_hook(None, counting)
        loss.backward()
        opt.step()
        opt.zero_grad()
    h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    return h, calls[0]


plain, _ = train()
import gputop.probe  # noqa: E402  (loaded here on purpose: the first run is without it)

probe = gputop.probe.install()
probed, _ = train()
ddp_comm = probe.hooks.get("ddp_comm")
user, user_calls = train(user_hook=True)
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"plain": plain, "probed": probed, "user": user, "user_hook_calls": user_calls,
                   "ddp_comm": ddp_comm}, f)
# The DDP models (reference cycles: freed by the collector, else at interpreter teardown) hold the
# gloo process group; torn down with the interpreter, gloo's worker threads can abort the process
# ("terminate called without an active exception", both ranks SIGABRT: seen once in a suite run
# beside two CPU hogs). Freed here first, while the interpreter is whole, as a clean exit does.
gc.collect()
dist.destroy_process_group()
