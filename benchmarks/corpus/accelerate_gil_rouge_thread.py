"""Accelerate causal-LM fine-tuning (the examples' nlp_example loop) of a GPT-2 small from a GPT2Config (12 layers,
d=768, ~124M parameters, random init, dropout 0.1), Accelerator(mixed_precision="bf16"), eager, AdamW, linear
warm-up schedule, gradient clipping, batch 16 x 512 pre-tokenised tokens with the decoded text and a reference
summary kept alongside (the dataset's "text" and "summary" columns; DataLoader(num_workers=0), prepared by
Accelerate), with a "live" metric bolted on: each step the loop hands the batch's texts to a background
threading.Thread that scores every sample against its reference with a pure-Python ROUGE-1/2 (n-gram overlap) and
ROUGE-L (LCS) implementation, the rouge-score package's algorithm, from a small queue (when it is full the batch is
skipped, so training never waits on the metric).
Cause (gil_contention): the scorer is always busy (a batch is 16 LCS tables of 512 x 96 words, ~120 ms of bytecode
on one core) and holds the GIL the whole time, while the loop needs the GIL to launch its work: GPT-2 small eager
is ~600 Python-dispatched ops forward (~8-10 ms of host time; the Python tanh-GELU alone is 8 ops a layer), then
the optimizer's foreach AdamW, clipping and zero_grad (~3 ms), for ~25-35 ms of GPU work a step (~6.4 TFLOP of
matmuls plus the eager elementwise kernels). Sharing the GIL in 5 ms switch intervals halves the loop's Python
speed (forward ~20-30 ms, the GPU waiting on it for most of that), and each time the loop lets the GIL go for
longer than a moment (the two blocking batch .to(device) copies, the first of which waits for the previous step's
kernels, and loss.backward(), which runs in C++) it gets it back only after the scorer's 5 ms interval: ~10 ms
with the GPU idle at each step's start. As is ~50-65 ms a step against ~25-35 ms fixed: ~35-55% of the time
lost. Expect the fix to gain roughly +55% to +120% steps/s.
Fix (--fixed): the same scorer runs in a separate process (multiprocessing, fork context, forked before any CUDA
work), fed through a multiprocessing.Queue with the same put-or-skip rule: the same scoring code, as busy, on its
own core and with its own GIL.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multiprocessing as mp
import queue
import random
import re
import threading
from collections import Counter

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
SCORER_IN_PROCESS = args.fixed  # the fix: score in a separate process, not a thread of the training process


def _tokens(text):
    return re.findall(r"[a-z0-9]+", text.lower())


def _ngrams(words, n):
    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def _f1(overlap, n_pred, n_ref):
    if overlap == 0:
        return 0.0
    p, r = overlap / n_pred, overlap / n_ref
    return 2 * p * r / (p + r)


def _lcs(a, b):
    """Length of the longest common subsequence: the O(len(a) * len(b)) table, one row at a time."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge(prediction, reference):
    """ROUGE-1, ROUGE-2 and ROUGE-L F1 of two texts, as rouge_score.RougeScorer computes them (no stemming)."""
    p, r = _tokens(prediction), _tokens(reference)
    scores = {}
    for n in (1, 2):
        pn, rn = _ngrams(p, n), _ngrams(r, n)
        scores[f"rouge{n}"] = _f1(sum((pn & rn).values()), max(sum(pn.values()), 1), max(sum(rn.values()), 1))
    scores["rougeL"] = _f1(_lcs(p, r), max(len(p), 1), max(len(r), 1))
    return scores


def live_rouge(q, n_scored, rouge_l_sum):
    """The live metric: score every sample of every batch taken from the queue, forever (None stops it)."""
    while True:
        item = q.get()
        if item is None:
            return
        for text, summary in zip(*item):
            s = rouge(text, summary)
            with n_scored.get_lock():
                n_scored.value += 1
            with rouge_l_sum.get_lock():
                rouge_l_sum.value += s["rougeL"]


# The scorer starts first: as a process (the fix) it is forked before CUDA is touched.
ctx = mp.get_context("fork")
n_scored, rouge_l_sum = ctx.Value("l", 0), ctx.Value("d", 0.0)
if SCORER_IN_PROCESS:
    score_queue = ctx.Queue(maxsize=4)
    scorer = ctx.Process(target=live_rouge, args=(score_queue, n_scored, rouge_l_sum), daemon=True)
else:
    score_queue = queue.Queue(maxsize=4)
    scorer = threading.Thread(target=live_rouge, args=(score_queue, n_scored, rouge_l_sum), daemon=True)  # THE CAUSE
scorer.start()

from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

SEQ, BATCH, SUMMARY = pick(512, 64), pick(16, 4), pick(96, 32)
N_EXAMPLES = pick(2048, 256)
cfg = GPT2Config(n_layer=pick(12, 2), n_embd=pick(768, 128), n_head=pick(12, 4), n_positions=pick(1024, 128),
                 vocab_size=pick(50257, 8000), bos_token_id=pick(50256, 7999), eos_token_id=pick(50256, 7999))

# Synthetic pre-tokenised corpus: random ids, their "decoded" text through a made-up vocabulary of words, and a
# reference summary per example: four spans of its text with ~30% of the words changed (so the scores are not 0).
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyz"
vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(cfg.vocab_size)]
ids = torch.randint(0, cfg.vocab_size, (N_EXAMPLES, SEQ), generator=torch.Generator().manual_seed(0))
texts, summaries = [], []
for row in ids.tolist():
    words = [vocab[t] for t in row]
    starts = sorted(rng.sample(range(SEQ - SUMMARY // 4), 4))
    span_words = [w for a in starts for w in words[a:a + SUMMARY // 4]]
    texts.append(" ".join(words))
    summaries.append(" ".join(w if rng.random() < 0.7 else rng.choice(vocab) for w in span_words))


class SummarizationLM(torch.utils.data.Dataset):
    def __len__(self):
        return N_EXAMPLES

    def __getitem__(self, i):
        return {"input_ids": ids[i], "labels": ids[i], "text": texts[i], "summary": summaries[i]}


accelerator = Accelerator(mixed_precision="bf16" if gpu else "no", cpu=not gpu)
model = GPT2LMHeadModel(cfg)
loader = torch.utils.data.DataLoader(SummarizationLM(), batch_size=BATCH, shuffle=True, drop_last=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=100_000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

meter = Meter(args.seconds, args.report_every)
model.train()
try:
    running = True
    while running:
        for batch in loader:
            text, summary = batch.pop("text"), batch.pop("summary")
            outputs = model(**batch)
            accelerator.backward(outputs.loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            try:
                score_queue.put_nowait((text, summary))  # the live metric: skip the batch if the scorer is behind
            except queue.Full:
                pass
            if not meter.step():
                running = False
                break
finally:
    meter.done()
    print(f"live ROUGE-L {rouge_l_sum.value / max(n_scored.value, 1):.4f} over {n_scored.value} samples", flush=True)
    if SCORER_IN_PROCESS:
        score_queue.cancel_join_thread()
        scorer.terminate()
        scorer.join(timeout=10)
