"""Accelerate causal-LM loop (the examples' complete_nlp_example pattern) on a GPT-2 medium-sized model from a
GPT2Config (24 layers, d=1024, ~355M parameters, bf16 mixed precision, AdamW, batch 8 x 512 random tokens, ~80-120
ms a step on an H100) that keeps the examples' `--checkpointing_steps` habit: accelerator.save_state every 25 steps.
Cause (io_stall): each save_state writes model.safetensors (~1.4 GB fp32) and optimizer.bin (~2.8 GB of AdamW
moments) to local disk from the training loop, copying every tensor to the host first: ~2-4 s of writing every
~2.5 s of training, while the GPU idles. Expect the fix to gain roughly +60% to +150% steps/s.
Fix (--fixed): checkpointing_steps=5000, so no checkpoint falls within the run.
A second fix (--compile, added after the fix was measured: gputop called the fixed job host_bound, +25%, its hot
code the model's own forward and backward): torch.compile(model), the first remedy its advice names. It also
fuses the GPU's own work, so it can gain more than removing the launches alone; a gain under 10% refutes the call.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import tempfile

from common import Meter, forever, parse, pick, torch_and_device

SECOND_FIX = "the second fix: torch.compile(model)"
args = parse(__doc__, lambda p: p.add_argument("--compile", action="store_true", help=SECOND_FIX))
torch, device = torch_and_device()
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

gpu = device.type == "cuda"
SEQ, BATCH = pick(512, 64), pick(8, 4)
checkpointing_steps = 5000 if args.fixed else 25  # the fix: checkpoint every 5000 steps, not every 25
# GPT-2 medium on the GPU; on the CPU a ~4M-parameter model (a ~45 MB checkpoint, so the save still shows)
cfg = GPT2Config(n_layer=pick(24, 2), n_embd=pick(1024, 256), n_head=pick(16, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 8000))


class Tokens(torch.utils.data.Dataset):
    """Pre-tokenised text (random ids): the input costs nothing."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        ids = torch.randint(0, cfg.vocab_size, (SEQ,))
        return {"input_ids": ids, "labels": ids}


accelerator = Accelerator(mixed_precision="bf16" if gpu else "no", cpu=not gpu)
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
loader = torch.utils.data.DataLoader(Tokens(), batch_size=BATCH, shuffle=True, num_workers=2)
if args.compile:  # the second fix
    model = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=100_000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
output_dir = tempfile.mkdtemp(prefix="corpus-accel-state-")  # one directory on local disk, overwritten each time

meter = Meter(args.seconds, args.report_every)
model.train()
overall_step = 0
try:
    for batch in forever(loader):
        loss = model(**batch).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        overall_step += 1
        if overall_step % checkpointing_steps == 0:
            accelerator.save_state(output_dir)  # model, optimizer, scheduler, RNG: on the loop's thread
        if not meter.step():
            break
finally:
    meter.done()
    shutil.rmtree(output_dir, ignore_errors=True)
