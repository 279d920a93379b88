"""HF Trainer causal-LM pre-training (after transformers' examples/pytorch/language-modeling/run_clm.py): a GPT-2
medium-sized model from a GPT2Config (24 layers, d=1024, 16 heads, ~355M parameters, random init), bf16, AdamW,
cosine schedule, max_grad_norm=1.0, per_device_train_batch_size=8 x 1024 tokens (~65-90 ms a step on an H100, the
GPU busy with large matmuls), on a pre-tokenised dataset of random ids (the input costs nothing), 4 dataloader
workers, dataloader_pin_memory=True. The job carries the habits people add to such a run: logging_steps=10 with
the default tqdm progress bar, a TrainerCallback that every 20 steps appends a JSON line of the last logged metrics
(and the latest system stats) to metrics.jsonl in the output directory, and a background thread that samples
psutil (CPU %, RSS, load average) once a second.
Cause (none, healthy): every habit is cheap next to the step: a log every 10 steps reads two scalars (~1 ms once
the GPU is done, and the Trainer already waits for each step's loss in its nan/inf filter), a 200-byte append
every 20 steps, one psutil sample a second on a thread that sleeps the rest of the time; the gradient clipping is
a few fused kernels. Expect the fix to change steps/s by less than 5%.
Fix (--fixed): one flag switches the habits off: logging_steps=1000 and no progress bar, no JSON-lines callback, no
sampler thread.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import json
import shutil
import tempfile
import threading
import time

import psutil

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

gpu = device.type == "cuda"
HABITS = not args.fixed  # the fix: HABITS = False (frequent logging, the JSON-lines callback, the sampler thread)
SEQ, BATCH = pick(1024, 64), pick(8, 4)
# GPT-2 medium on the GPU; a 2-layer, 128-wide GPT-2 on the CPU
cfg = GPT2Config(n_layer=pick(24, 2), n_embd=pick(1024, 128), n_head=pick(16, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 8000))


class Tokens(torch.utils.data.Dataset):
    """Pre-tokenised text (random ids): the input costs nothing."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        ids = torch.randint(0, cfg.vocab_size, (SEQ,))
        return {"input_ids": ids, "labels": ids}


class SystemSampler(threading.Thread):
    """Samples the machine once a second, as a "monitoring" helper would."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop, self.latest, self.proc = threading.Event(), {}, psutil.Process()

    def run(self):
        psutil.cpu_percent(interval=None)
        while not self.stop.wait(1.0):
            self.latest = {"cpu_percent": psutil.cpu_percent(interval=None),
                           "rss_gb": round(self.proc.memory_info().rss / 2**30, 3),
                           "load1": os.getloadavg()[0],
                           "gpu_mem_gb": round(torch.cuda.memory_allocated() / 2**30, 3) if gpu else 0.0}


class JsonLinesLogger(TrainerCallback):
    """Every 20 steps, one JSON line of the last logged metrics (and system stats) to a local file."""

    def __init__(self, path, sampler):
        self.path, self.sampler, self.last_logs = path, sampler, {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.last_logs = dict(logs or {})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % 20 == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": state.global_step, "time": time.time(), **self.last_logs,
                                    **self.sampler.latest}) + "\n")


class StepMeter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if not meter.step():
            control.should_training_stop = True
        return control


out = tempfile.mkdtemp(prefix="corpus-trainer-gpt2-")
targs = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=10**7, learning_rate=3e-4,
                          lr_scheduler_type="cosine", warmup_steps=100, weight_decay=0.1, max_grad_norm=1.0,
                          logging_steps=10 if HABITS else 1000, disable_tqdm=not HABITS, report_to=[],
                          bf16=gpu, use_cpu=not gpu, save_strategy="no", dataloader_num_workers=4,
                          dataloader_pin_memory=True)
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
sampler = SystemSampler()
callbacks = [StepMeter()]
if HABITS:
    sampler.start()
    callbacks.append(JsonLinesLogger(os.path.join(out, "metrics.jsonl"), sampler))
trainer = Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=callbacks)
meter = Meter(args.seconds, args.report_every)
try:
    trainer.train()
finally:
    meter.done()
    sampler.stop.set()
    shutil.rmtree(out, ignore_errors=True)
