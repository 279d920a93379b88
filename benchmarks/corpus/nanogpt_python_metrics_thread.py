"""nanoGPT-style train.py on a GPT-2 small (124M, block 1024, batch 16, bf16 autocast, fused AdamW, ~70 ms a
step on an H100) that hands every batch's target ids (copied to the host, non_blocking) to a background
threading.Thread computing "training metrics" in plain Python, "so they do not slow training": 1- to 4-gram
counts with collections.Counter over the batch and the last 16 batches, distinct-n, top bigrams, unigram entropy
and a repetition rate. That is ~100 ms of Python a batch, more than a step, so the thread is always busy (its
bounded queue drops batches). Cause (gil_contention): the thread holds the GIL nearly all the time; the training
thread gives it up around each of the ~300 ops and module calls of its forward and optimizer step and must win
it back, waiting up to a switch interval (5 ms) each time it loses, so its launches fall behind the GPU:
expected tens of percent to ~1.7x fewer steps/s (at worst the two threads' Python runs one after the other).
Fix (--fixed): the same metric function in a multiprocessing.Process (spawn) fed through a multiprocessing
queue: it has its own interpreter and GIL.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import math
import multiprocessing as mp
import queue
import threading
from collections import Counter, deque
from contextlib import nullcontext

import numpy as np

import nanogpt
from common import Meter, parse, pick, torch_and_device


def batch_metrics(targets, stats, window=16):
    """Text statistics of one batch of target ids (B, T) and of the last `window` batches, in plain Python."""
    batch = {n: Counter() for n in range(1, 5)}
    repeats = total = 0
    for row in targets.tolist():
        for n in range(1, 5):  # 1- to 4-gram counts
            batch[n].update(zip(*(row[i:] for i in range(n))))
        seen = set()
        for g in zip(row, row[1:], row[2:], row[3:]):  # 4-grams seen earlier in the same sequence
            repeats += g in seen
            seen.add(g)
            total += 1
    stats["recent"].append(batch)  # running n-gram counts over the last `window` batches
    for n, c in batch.items():
        stats["counts"][n].update(c)
    if len(stats["recent"]) > window:
        for n, c in stats["recent"].popleft().items():
            stats["counts"][n].subtract(c)
            if stats["batches"] % window == 0:
                stats["counts"][n] = +stats["counts"][n]  # drop the n-grams that left the window
    unigrams = stats["counts"][1]
    n_tok = sum(unigrams.values())
    stats["entropy"] = -sum(c / n_tok * math.log(c / n_tok) for c in unigrams.values() if c > 0)
    for n, c in stats["counts"].items():
        stats[f"distinct_{n}"] = sum(1 for v in c.values() if v > 0) / max(n_tok - (n - 1) * len(targets), 1)
    stats["top_bigrams"] = stats["counts"][2].most_common(20)
    stats["repetition"] = 0.99 * stats["repetition"] + 0.01 * repeats / max(total, 1)
    stats["batches"] += 1


def metrics_worker(inbox):
    stats = {"counts": {n: Counter() for n in range(1, 5)}, "recent": deque(), "repetition": 0.0, "batches": 0}
    while (targets := inbox.get()) is not None:
        batch_metrics(targets, stats)


def main():
    args = parse(__doc__)
    # the metrics run beside training, fed through a bounded queue that drops batches when it is full
    if args.fixed:  # the fix: a process of its own (its own interpreter and GIL) instead of a thread
        spawn = mp.get_context("spawn")
        inbox = spawn.Queue(maxsize=4)
        worker = spawn.Process(target=metrics_worker, args=(inbox,), daemon=True, name="train-metrics")
    else:
        inbox = queue.Queue(maxsize=4)
        worker = threading.Thread(target=metrics_worker, args=(inbox,), daemon=True, name="train-metrics")
    worker.start()

    torch, device = torch_and_device()
    gpu = device.type == "cuda"
    batch_size, block_size = pick(16, 4), pick(1024, 64)
    model_args = dict(vocab=pick(50304, 512), block_size=block_size, n_layer=pick(12, 2), d=pick(768, 64),
                      heads=pick(12, 4))
    data = np.random.randint(0, model_args["vocab"], size=4_000_000, dtype=np.uint16)  # stands in for train.bin

    torch.backends.cuda.matmul.allow_tf32 = True
    with torch.device(device):  # random init, straight on the GPU
        model = nanogpt.GPT(**model_args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=gpu)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else nullcontext()

    meter = Meter(args.seconds, args.report_every)
    X, Y = nanogpt.get_batch(data, block_size, batch_size, device)
    pending = None
    while True:
        with ctx:
            logits, loss = model(X, Y)
        if pending is not None:  # last step's targets: their copy to the host finished long ago
            host_targets, copied = pending
            if copied is not None:
                copied.synchronize()
            try:
                inbox.put_nowait(host_targets.numpy())
            except queue.Full:  # the metrics fell behind: skip this batch
                pass
        host_targets = Y.to("cpu", non_blocking=True)  # queued behind the forward, into pinned memory
        pending = (host_targets, torch.cuda.Event() if gpu else None)
        if gpu:
            pending[1].record()
        X, Y = nanogpt.get_batch(data, block_size, batch_size, device)  # prefetch the next batch
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not meter.step():
            break
    meter.done()


if __name__ == "__main__":  # the spawned metrics process imports this file: train only in the parent
    main()
