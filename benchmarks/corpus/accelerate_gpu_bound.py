"""Accelerate loop on a GPT-2 small (bf16) with gradient accumulation (2 micro-batches of 16 x 1024) and
accelerator.clip_grad_norm_ at every optimizer step: GPU-bound, ~210 ms a step.
Healthy; the trap: gradient clipping, a few foreach kernels (~1 ms of GPU work) per optimizer step.
Fix (--fixed): no gradient clipping.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

SEQ, BATCH, ACCUM = pick(1024, 64), pick(16, 4), 2
max_grad_norm = None if args.fixed else 1.0  # the fix: no clipping


class Tokens(torch.utils.data.Dataset):
    """Pre-tokenised text (random ids), read by 2 workers: the input keeps up."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        ids = torch.randint(0, cfg.vocab_size, (SEQ,))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


cfg = GPT2Config(n_layer=pick(12, 2), n_embd=pick(768, 64), n_head=pick(12, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 2000))
accelerator = Accelerator(gradient_accumulation_steps=ACCUM, mixed_precision="bf16" if device.type == "cuda" else "no",
                          cpu=device.type != "cuda")
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
loader = torch.utils.data.DataLoader(Tokens(), batch_size=BATCH, num_workers=2, pin_memory=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=device.type == "cuda")
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=100_000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

meter = Meter(args.seconds, args.report_every)
model.train()
for batch in forever(loader):
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        if accelerator.sync_gradients and max_grad_norm is not None:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()  # a no-op on the micro-batches that only accumulate
        scheduler.step()
        optimizer.zero_grad()
    if accelerator.sync_gradients and not meter.step():  # one meter step per optimizer step
        break
meter.done()
