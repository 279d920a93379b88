"""HF Trainer on a GPT-2 (124M parameters: a 500 MB fp32 model, 1.5 GB with its AdamW state) with
save_steps=20. Cause (io_stall): every 20 steps (~1.3 s of training) the Trainer writes a checkpoint
(model.safetensors, optimizer.pt, scheduler, RNG state) on the training thread while the GPU idles.
Fix (--fixed): save_steps=100000, a checkpoint far less often than every 20 steps.
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
SEQ, BATCH = pick(512, 64), pick(16, 4)
# GPT-2 small on the GPU; on the CPU a model of ~25 MB so that its checkpoint still shows
cfg = GPT2Config(n_layer=pick(12, 2), n_embd=pick(768, 256), n_head=pick(12, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 8000))


class Tokens(torch.utils.data.Dataset):
    """Pre-tokenised text (random ids): the input costs nothing."""

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


out = tempfile.mkdtemp(prefix="corpus-trainer-save-")
targs = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=10**7, learning_rate=3e-4,
                          warmup_steps=100, weight_decay=0.01, logging_steps=50, report_to="none", disable_tqdm=True,
                          bf16=gpu, use_cpu=not gpu, dataloader_num_workers=2,
                          save_strategy="steps", save_total_limit=2,
                          save_steps=100_000 if args.fixed else 20)  # the fix: save_steps=100000
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
trainer = Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=[StepMeter()])
meter = Meter(args.seconds, args.report_every)
try:
    trainer.train()
finally:
    meter.done()
    shutil.rmtree(out, ignore_errors=True)
