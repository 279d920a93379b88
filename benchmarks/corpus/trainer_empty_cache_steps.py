"""HF Trainer on a GPT-2 small (8 x 1024 tokens, bf16, 4 DataLoader workers) with
torch_empty_cache_steps=1, the TrainingArguments option "to lower peak memory": every training step
calls torch.cuda.empty_cache() between its forward and backward.
Cause (allocator_thrash): each call waits for the GPU and gives every unused cached segment back (a
cudaFree each); the backward cudaMallocs them again while the GPU waits.
Fix (--fixed): torch_empty_cache_steps=None (the default).
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import tempfile

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

gpu = device.type == "cuda"
SEQ, BATCH = pick(1024, 64), int(os.environ.get("EC_BATCH", pick(8, 8)))
cfg = GPT2Config(n_layer=pick(12, 2), n_embd=pick(768, 64), n_head=pick(12, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 2000))


class Tokens(torch.utils.data.Dataset):
    """Pre-tokenised text (random ids), read by 4 workers: the input keeps up."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        ids = torch.randint(0, cfg.vocab_size, (SEQ,))
        return {"input_ids": ids, "labels": ids}


class StepMeter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if not meter.step():
            control.should_training_stop = True
        return control


out = tempfile.mkdtemp(prefix="corpus-trainer-empty-cache-")
targs = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=10**7, learning_rate=3e-4,
                          warmup_steps=100, weight_decay=0.01, save_strategy="no", report_to="none",
                          disable_tqdm=True, bf16=gpu, use_cpu=not gpu, dataloader_num_workers=4,
                          logging_steps=500,
                          torch_empty_cache_steps=None if args.fixed else 1)  # the fix: the default, None
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
trainer = Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=[StepMeter()])
meter = Meter(args.seconds, args.report_every)
try:
    trainer.train()
finally:
    meter.done()
    shutil.rmtree(out, ignore_errors=True)
