"""Accelerate causal-LM loop (run_clm_no_trainer shape) on a GPT-2; a pure-Python WordPiece tokenizer
runs in the DataLoader's collate_fn with num_workers=0. Cause (input_bound): the loader's blocking .to()
lets the GPU finish its step, then the main thread tokenises the next batch (~35% of a step) while the
GPU waits. Fix (--fixed): num_workers=3, the collate_fn runs in worker processes ahead of the loop.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import random
import re

from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

SEQ, BATCH = pick(512, 64), pick(16, 4)
WORDS = pick(560, 60)  # words per document: a document tokenises to more than SEQ tokens (truncated)
SYL = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + [c + v + e for c in "bdkmst" for v in "aeiou"
                                                                for e in "nrst"]


class WordPiece:
    """A BERT-style tokenizer in pure Python: regex pre-split, then greedy longest-match subwords."""

    pattern = re.compile(r"\w+|[^\w\s]")

    def __init__(self, vocab_size, rng):
        words = sorted({"".join(rng.choice(SYL) for _ in range(rng.randint(1, 3))) for _ in range(20000)})
        pieces = ["[PAD]", "[UNK]", ".", ",", "!", "?", *SYL, *("##" + s for s in SYL), *words]
        self.vocab = {p: i for i, p in enumerate(pieces[:vocab_size])}

    def word_ids(self, word):
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):  # the longest piece in the vocabulary first
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
            else:
                return [1]  # [UNK]
            start = end
        return ids

    def __call__(self, texts, max_length):
        ids = torch.zeros(len(texts), max_length, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, text in enumerate(texts):
            toks = [i for w in self.pattern.findall(text.lower()) for i in self.word_ids(w)][:max_length]
            ids[row, :len(toks)], mask[row, :len(toks)] = torch.tensor(toks), 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


rng = random.Random(0)
cfg = GPT2Config(n_layer=pick(12, 2), n_embd=pick(768, 64), n_head=pick(12, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 2000))
tokenizer = WordPiece(cfg.vocab_size, rng)
# raw documents (random syllable words with punctuation), as a datasets "text" column would hold them
docs = [" ".join("".join(rng.choice(SYL) for _ in range(rng.randint(1, 4))) + ("." if rng.random() < 0.08 else "")
                 for _ in range(WORDS)) for _ in range(64)]


def collate(texts):  # the tokenising collate_fn: runs where the DataLoader runs it
    return tokenizer(texts, SEQ)


accelerator = Accelerator(mixed_precision="bf16" if device.type == "cuda" else "no", cpu=device.type != "cuda")
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
loader = torch.utils.data.DataLoader(docs * 512, batch_size=BATCH, shuffle=True, collate_fn=collate, drop_last=True,
                                     num_workers=3 if args.fixed else 0)  # the fix: tokenise in 3 workers
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=100_000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

meter = Meter(args.seconds, args.report_every)
model.train()
for batch in forever(loader):
    outputs = model(**batch)
    accelerator.backward(outputs.loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    if not meter.step():
        break
meter.done()
