"""A GPT-style loop at the edge of GPU memory, fed a new sequence length every step (issue 30, item 4).

Cause (allocator_thrash): other tensors (a frozen teacher, a cache) leave the job ~3% headroom over
its own peak; each batch has another length, so the blocks cached for one length do not fit the
next, cudaMalloc fails, and torch's caching allocator frees its whole cache (a device sync) and
allocates again. The lengths rise through each group of 16 batches (batches grouped by length),
so most steps want blocks a little larger than any the cache holds (random lengths made 4
retries in 48 steps on an H100: a longer batch mostly found a block). Its peak is measured at
the longest length, then the cache is emptied before the rest of the GPU is taken, so the cache
is rebuilt under varying lengths. ALLOC_SIZE=width,layers,batch,max_len tries other sizes,
ALLOC_HEADROOM other margins (a share of the peak; "none": the rest of the GPU left free).
ALLOC_TRACE=1 records the allocator's segment events (cudaMalloc, cudaFree, OOM) after the set-up
with torch's memory history, and prints what its flushes took (exploring how to time them).
Fix (--fixed): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, set before torch loads: segments
grow in place instead of being freed and allocated again.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import random
import time

from common import Meter, parse, pick

args = parse(__doc__)
if args.fixed:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"   # the fix (before torch loads)
from common import torch_and_device  # noqa: E402

torch, device = torch_and_device()
gpu = device.type == "cuda"
width, layers, batch, max_len = pick((2048, 12, 16, 2048), (64, 2, 4, 64))
if os.environ.get("ALLOC_SIZE"):   # exploring other sizes: ALLOC_SIZE=width,layers,batch,max_len
    try:
        width, layers, batch, max_len = (int(v) for v in os.environ["ALLOC_SIZE"].split(","))
    except ValueError:
        print(f"alloc_thrash_varlen: ALLOC_SIZE={os.environ['ALLOC_SIZE']!r} is not four integers "
              "(width,layers,batch,max_len)", file=sys.stderr)
        sys.exit(2)
margin = os.environ.get("ALLOC_HEADROOM", "0.03")   # a share of the peak; "none": no filler
try:
    margin = None if margin == "none" else float(margin)
except ValueError:
    print(f"alloc_thrash_varlen: ALLOC_HEADROOM={margin!r} is not a number or 'none'", file=sys.stderr)
    sys.exit(2)
# ALLOC_ON_OOM=skip: an OOM drops its batch and the headroom stays as it was (the default, grow,
# gives the job 1 GiB more at each OOM, so a run's pressure eases as it goes: on the H200 the thrash
# of the first seconds cost +44% in a bare 10 s run and +6% in the steady part of a 20 s one)
on_oom = os.environ.get("ALLOC_ON_OOM", "grow")
if on_oom not in ("grow", "skip"):
    print(f"alloc_thrash_varlen: ALLOC_ON_OOM={on_oom!r} is not 'grow' or 'skip'", file=sys.stderr)
    sys.exit(2)
skip_on_oom = on_oom == "skip"
if skip_on_oom:
    # cuDNN's attention fails on a workspace it cannot allocate with a RuntimeError, not an OOM
    # (H200, 2026-12-06: "mha_graph.execute(...) is_good()", the job died after 14 steps): a job
    # that goes on after OOMs uses the other SDPA kernels (flash), which raise OutOfMemoryError
    torch.backends.cuda.enable_cudnn_sdp(False)
block = torch.nn.TransformerEncoderLayer(width, nhead=max(1, width // 128), dim_feedforward=4 * width,
                                         batch_first=True, norm_first=True)
model = torch.nn.Sequential(torch.nn.Embedding(8192, width),
                            torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False),
                            torch.nn.Linear(width, 8192)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)


def train_step(length: int) -> None:
    tokens = torch.randint(0, 8192, (batch, length + 1), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


filler = None
if gpu:
    # the job's own peak at the longest batch, then the rest of the GPU taken but ~3% of it
    for _ in range(2):
        train_step(max_len)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_reserved()
    # The cache is emptied first: kept, it holds blocks cut for the longest batch, every shorter
    # one fits in them and the allocator never has to ask CUDA again (0 retries on 2026-12-06).
    # Emptied, it is rebuilt by whichever lengths come first, and a longer one later finds no
    # block that fits and no free memory beside the cache: the real job's situation.
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info()
    spare = -1 if margin is None else free - (peak - torch.cuda.memory_reserved()) - int(margin * peak)
    if spare > 0:
        filler = torch.empty(spare, dtype=torch.uint8, device=device)   # THE CAUSE: no headroom
trace = gpu and os.environ.get("ALLOC_TRACE") == "1"
if trace:
    # only the segment events: a cudaMalloc, a cudaFree, an OOM (each block's alloc and free skipped,
    # no stacks), so what the history costs is what a retry's flush costs to note
    try:
        torch.cuda.memory._record_memory_history(
            "all", context=None, stacks="python", max_entries=1 << 20,
            skip_actions=["alloc", "free_requested", "free_completed"])
        print("trace: segment events only", flush=True)
    except TypeError:   # a torch without skip_actions: every block's events too
        torch.cuda.memory._record_memory_history("all", context=None, stacks="python", max_entries=1 << 22)
        print("trace: every event (no skip_actions in this torch)", flush=True)
rng = random.Random(0)
meter = Meter(args.seconds, args.report_every)
ooms = 0
step = 0
loop_t0 = last_snap = time.perf_counter()
snap_ms: list[float] = []
batch_no = 0   # the batches drawn: with skip, a failed batch is dropped and the next one comes
while True:
    try:
        # a new length each step: batches grouped by length and served shortest first within
        # each group of 16 (length-grouped sampling), so most steps want blocks a little larger
        # than any the cache holds
        train_step(max_len // 2 + (batch_no % 16) * (max_len // 32) + rng.randrange(max_len // 32))
    except torch.OutOfMemoryError:
        ooms += 1   # a job at the edge sometimes fails outright: give it 1 GiB more and go on
        # the clock is read here too, so a job whose every batch fails still ends
        if time.perf_counter() - (meter.t0 or loop_t0) >= meter.seconds:
            break
        if skip_on_oom:
            # ALLOC_ON_OOM=skip: drop the batch and go on to the next, as fairseq's trainer does.
            # (Until 2026-12-07 the failed position was drawn again, the same longest length each
            # time, so every batch after the first OOM failed: the livelock of the fourth session
            # of 2026-12-06 was this script's, not the allocator's.)
            batch_no += 1
            continue
        if filler is not None:
            keep = filler.numel() - (1 << 30)
            filler = None   # (freed before the smaller one is taken: both would not fit)
            torch.cuda.empty_cache()
            filler = torch.empty(keep, dtype=torch.uint8, device=device) if keep > 0 else None
        continue
    step += 1
    batch_no += 1
    if trace and time.perf_counter() - last_snap >= 2.0:
        # what a probe reading the segment events every 2 s would cost the job: the whole snapshot
        # (segments, blocks and the trace ring) is built on the calling thread, holding the GIL
        t = time.perf_counter()
        torch.cuda.memory._snapshot()
        snap_ms.append((time.perf_counter() - t) * 1e3)
        last_snap = time.perf_counter()
    if not meter.step():
        break
retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) if gpu else 0
print(f"ooms {ooms} alloc_retries {retries} steps {step}", flush=True)
if trace:
    # a flush: a run of cudaFrees (release_cached_blocks) up to the cudaMalloc that follows it; an
    # OOM ends the run uncounted (the frees did not make room: what follows is the next batch)
    events = [e for e in torch.cuda.memory._snapshot()["device_traces"][0]
              if e["action"] in ("segment_free", "segment_alloc", "oom")]
    flushes, mallocs, first_free = [], 0, None
    for e in events:
        if e["action"] == "segment_free":
            first_free = e.get("time_us", 0) if first_free is None else first_free
        elif e["action"] == "segment_alloc":
            mallocs += 1
            if first_free is not None:
                flushes.append((e.get("time_us", 0) - first_free) / 1e3)
            first_free = None
        else:   # an OOM
            first_free = None
    flushes.sort()
    if os.environ.get("ALLOC_TRACE_OUT"):   # the segment events, for replaying a flush's timing on a CPU
        import json
        with open(os.environ["ALLOC_TRACE_OUT"], "w") as f:
            json.dump([{k: e.get(k) for k in ("action", "time_us", "size", "stream")} for e in events], f)
    snap_ms.sort()
    print(f"trace snapshots {len(snap_ms)} snapshot_ms_median {snap_ms[len(snap_ms) // 2] if snap_ms else 0:.2f} "
          f"max {snap_ms[-1] if snap_ms else 0:.2f}", flush=True)
    print("trace keys", sorted(events[0]) if events else None, flush=True)
    span_s = (events[-1].get("time_us", 0) - events[0].get("time_us", 0)) / 1e6 if len(events) > 1 else 0.0
    print(f"trace events {len(events)} mallocs {mallocs} frees "
          f"{sum(e['action'] == 'segment_free' for e in events)} flushes {len(flushes)} "
          f"flush_ms_median {flushes[len(flushes) // 2] if flushes else 0:.2f} "
          f"flush_ms_total {sum(flushes):.1f} over_s {span_s:.2f}", flush=True)
meter.done()
