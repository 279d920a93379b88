"""HF Trainer on a GPT-2 whose Dataset parses, cleans and tokenises a JSON record in __getitem__, with
dataloader_num_workers=0. Cause (input_bound): the Trainer's loader copies each batch with a blocking
.to(), so the main thread builds the next 16 samples (~half a GPU step) while the GPU waits.
Fix (--fixed): dataloader_num_workers=6, the samples are built in worker processes ahead of the loop.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import json
import random
import re
import shutil
import tempfile
import unicodedata
import zlib

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

gpu = device.type == "cuda"
SEQ, BATCH, WORDS = pick(512, 64), pick(16, 4), pick(1500, 300)
cfg = GPT2Config(n_layer=pick(12, 2), n_embd=pick(768, 64), n_head=pick(12, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 2000))
rng = random.Random(0)
SYL = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
# a JSON-lines corpus of web pages (random syllable words), as read from a .jsonl file
records = [json.dumps({"id": i, "url": f"https://example.org/{i}", "text": " ".join(
    "".join(rng.choice(SYL) for _ in range(rng.randint(1, 4))) + ("." if rng.random() < 0.08 else "")
    for _ in range(WORDS))}) for i in range(32)]


class WebText(torch.utils.data.Dataset):
    """Each sample: parse the record, normalise and split its text, hash the words to ids, and take
    a random window of SEQ tokens: all of it Python, in whichever process calls __getitem__."""

    space, punct = re.compile(r"\s+"), re.compile(r"([.,!?;:])")

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        text = json.loads(records[i % len(records)])["text"]
        text = self.punct.sub(r" \1 ", self.space.sub(" ", unicodedata.normalize("NFKC", text).lower()))
        ids = [zlib.crc32(w.encode()) % cfg.vocab_size for w in text.split()]
        start = random.randrange(len(ids) - SEQ)
        window = torch.tensor(ids[start:start + SEQ])
        return {"input_ids": window, "labels": window.clone()}


class StepMeter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if not meter.step():
            control.should_training_stop = True
        return control


out = tempfile.mkdtemp(prefix="corpus-trainer-")
targs = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=10**7, learning_rate=3e-4,
                          warmup_steps=100, weight_decay=0.01, logging_steps=50, save_strategy="no", report_to="none",
                          disable_tqdm=True, bf16=gpu, use_cpu=not gpu,
                          dataloader_num_workers=6 if args.fixed else 0)  # the fix: 6 workers build the samples
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
trainer = Trainer(model=model, args=targs, train_dataset=WebText(), callbacks=[StepMeter()])
meter = Meter(args.seconds, args.report_every)
try:
    trainer.train()
finally:
    meter.done()
    shutil.rmtree(out, ignore_errors=True)
