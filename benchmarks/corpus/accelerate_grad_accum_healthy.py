"""Accelerate causal-LM loop with gradient accumulation (the examples' by_feature/gradient_accumulation.py pattern)
on a GPT-2 medium-sized model from a GPT2Config (24 layers, d=1024, 16 heads, ~355M parameters, random init):
Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4), AdamW, cosine schedule, batch 8 x 1024 random
tokens per micro-step (32 x 1024 per optimizer step), DataLoader(num_workers=4, pin_memory=True). Each micro-step
is ~20 TFLOP of matmuls (6 x 355M x 8192 tokens plus attention), ~60-90 ms on an H100, so an optimizer step is
~250-350 ms of GPU work. The loop carries the habits people add to such a run: accelerator.clip_grad_norm_ at each
sync step, a tqdm progress bar over optimizer steps, a log line with loss.item() every 10 optimizer steps,
torch.cuda.max_memory_allocated() read every optimizer step for the bar, and an evaluation of 5 batches under
torch.no_grad() every 40 optimizer steps (the job's meter is paused through it).
Cause (none, healthy): every habit is cheap next to the step. The tqdm update is a few us (it redraws at most
10 times a second); max_memory_allocated reads the caching allocator's counters on the host, no GPU sync; the
loss.item() waits for the GPU once every ~3 s of training (~0.3 ms of drain lost, as the host stays ~4 micro-steps
of launches ahead otherwise); the clipping is a handful of foreach kernels once per 4 micro-steps; the evaluation
is paused out of the measured time. The host launches a micro-step in ~10-15 ms while the GPU needs ~60-90 ms, so
the GPU stays busy in both variants. Expect the fix to change steps/s by less than 3% (noise).
Fix (--fixed): one flag switches the habits off: no tqdm bar, no loss.item() log line, no max_memory_allocated
read; the evaluation still runs every 40 optimizer steps and the clipping is unchanged.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

gpu = device.type == "cuda"
HABITS = not args.fixed  # the fix: HABITS = False (no progress bar, no loss.item() log, no max_memory_allocated)
SEQ, BATCH, ACCUM = pick(1024, 64), pick(8, 4), 4
LOG_EVERY, EVAL_EVERY, EVAL_BATCHES = pick(10, 5), pick(40, 10), 5  # in optimizer steps (a 30 s run logs and evaluates)
# GPT-2 medium on the GPU; a 2-layer, 128-wide GPT-2 on the CPU
cfg = GPT2Config(n_layer=pick(24, 2), n_embd=pick(1024, 128), n_head=pick(16, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 8000))


class Tokens(torch.utils.data.Dataset):
    """Pre-tokenised text (random ids): the input costs nothing."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, cfg.vocab_size, (SEQ,))
        return {"input_ids": ids, "labels": ids}


accelerator = Accelerator(mixed_precision="bf16" if gpu else "no", gradient_accumulation_steps=ACCUM, cpu=not gpu)
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
train_loader = torch.utils.data.DataLoader(Tokens(1 << 20), batch_size=BATCH, shuffle=True, drop_last=True,
                                           num_workers=4, pin_memory=gpu, persistent_workers=True)
eval_loader = torch.utils.data.DataLoader(Tokens(EVAL_BATCHES * BATCH), batch_size=BATCH, num_workers=2,
                                          pin_memory=gpu)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=100_000)
model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
    model, optimizer, train_loader, eval_loader, scheduler)


def evaluate():
    model.eval()
    losses = []
    with torch.no_grad():
        for batch in eval_loader:
            losses.append(model(**batch).loss.float())
    model.train()
    return torch.stack(losses).mean().item()


progress = tqdm(total=100_000, desc="train", disable=not (HABITS and accelerator.is_local_main_process))
meter = Meter(args.seconds, args.report_every)
model.train()
overall_step = 0
try:
    for batch in forever(train_loader):
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()  # skipped by Accelerate except on sync steps
            scheduler.step()
            optimizer.zero_grad()
        if not accelerator.sync_gradients:
            continue
        overall_step += 1
        if HABITS:
            peak_gb = torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0
            progress.set_postfix(mem=f"{peak_gb:.1f}G", refresh=False)
            progress.update(1)
            if overall_step % LOG_EVERY == 0:
                accelerator.print(f"step {overall_step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e} "
                                  f"peak_mem {peak_gb:.1f} GB")
        if overall_step % EVAL_EVERY == 0:
            meter.pause()
            accelerator.print(f"step {overall_step} eval_loss {evaluate():.4f}")
            meter.resume()
        if not meter.step():
            break
finally:
    progress.close()
    meter.done()
