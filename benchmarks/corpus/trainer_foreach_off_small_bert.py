"""HF Trainer sequence-classification fine-tuning (after transformers' examples/pytorch/text-classification/
run_glue.py) of a small, deep BERT from a BertConfig (12 layers, hidden 256, 4 heads, intermediate 1024, ~17M
parameters in 201 parameter tensors, random init), bf16, linear schedule, max_grad_norm=1.0, batch 16 x 128 random
token ids, 2 labels. The optimizer is passed in by hand, as `optimizers=(AdamW(...), None)`, built with
foreach=False (a habit kept from a project where the multi-tensor path once blew up memory), so AdamW runs its
single-tensor loop.
Cause (launch_bound): the single-tensor AdamW issues 8 kernels per parameter tensor (weight-decay mul_, lerp_,
mul_, addcmul_, sqrt, div, add_, addcdiv_) plus a host-side step increment and bias-correction arithmetic:
~1,600 kernel launches a step at ~7-10 us of eager host time each, ~12-18 ms of launching while each kernel runs
for a few us on tensors of at most a few MB (~0.5 ms of GPU work for the whole update). The forward and backward of
this small model are themselves only ~1-2 ms of GPU work spread over ~1,200 kernels (~10-16 ms of launching with
the Trainer's per-step bookkeeping), so the GPU waits on the host the whole step: as is ~25-35 ms a step, of which
the optimizer's launches are ~40-55%. Expect the fix to gain roughly +60% to +120% steps/s.
Fix (--fixed): torch.optim.AdamW(..., fused=True): one multi-tensor kernel does the update of all 201 tensors.
Gradient clipping (the Trainer's clip_grad_norm_, foreach where it can) is the same in both variants.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import tempfile

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

gpu = device.type == "cuda"
SEQ, BATCH = pick(128, 32), pick(16, 4)
# 12 x 256-wide BERT on the GPU (201 parameter tensors); a 2-layer, 64-wide BERT on the CPU
cfg = BertConfig(vocab_size=pick(30522, 4000), hidden_size=pick(256, 64), num_hidden_layers=pick(12, 2),
                 num_attention_heads=pick(4, 2), intermediate_size=pick(1024, 256), max_position_embeddings=512,
                 num_labels=2)


class Sentences(torch.utils.data.Dataset):
    """Pre-tokenised sentence pairs (random ids, made at start) with a binary label."""

    def __init__(self, n=4096):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1000 if gpu else 100, cfg.vocab_size, (n, SEQ), generator=g)
        self.types = (torch.arange(SEQ) >= SEQ // 2).long().expand(n, SEQ)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "token_type_ids": self.types[i],
                "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.labels[i]}


class StepMeter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if not meter.step():
            control.should_training_stop = True
        return control


out = tempfile.mkdtemp(prefix="corpus-trainer-bert-")
targs = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=10**7, learning_rate=5e-5,
                          lr_scheduler_type="linear", warmup_steps=100, weight_decay=0.01, max_grad_norm=1.0,
                          logging_steps=500, disable_tqdm=True, report_to=[], bf16=gpu, use_cpu=not gpu,
                          save_strategy="no", dataloader_num_workers=2, dataloader_pin_memory=gpu)
with torch.device(device):  # random init, straight on the GPU
    model = BertForSequenceClassification(cfg)
if args.fixed:  # the fix: the fused AdamW, one kernel for every tensor
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
else:  # THE CAUSE: the single-tensor AdamW, 8 small kernels per parameter tensor
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, foreach=False)
trainer = Trainer(model=model, args=targs, train_dataset=Sentences(), callbacks=[StepMeter()],
                  optimizers=(optimizer, None))
meter = Meter(args.seconds, args.report_every)
try:
    trainer.train()
finally:
    meter.done()
    shutil.rmtree(out, ignore_errors=True)
