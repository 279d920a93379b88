"""Masked-language-model pretraining of a BERT-base (transformers' BertForMaskedLM from a config, 12 layers,
batch 32 x 256 tokens, bf16 autocast, fused AdamW) on token batches already on the GPU, with
torch.cuda.empty_cache() after every optimizer step. Written after allocator_thrash's cost was revised and
before it ran (fourth session of 2026-12-07): the third unseen check.
Cause (allocator_thrash): every call gives the cached segments back and the next step cudaMallocs them again.
Fix (--fixed): no empty_cache() in the loop.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contextlib import nullcontext

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from transformers import BertConfig, BertForMaskedLM

gpu = device.type == "cuda"
BATCH, SEQ = pick(32, 4), pick(256, 32)
cfg = BertConfig(hidden_size=pick(768, 64), num_hidden_layers=pick(12, 2), num_attention_heads=pick(12, 4),
                 intermediate_size=pick(3072, 128), vocab_size=pick(30522, 1000), max_position_embeddings=512)
with torch.device(device):  # random init, straight on the GPU
    model = BertForMaskedLM(cfg)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=gpu)


def masked_batch():
    """Token ids with 15% of them masked; the loss reads only those (labels -100 elsewhere)."""
    ids = torch.randint(pick(1000, 200), cfg.vocab_size, (BATCH, SEQ), device=device)   # (past the special tokens)
    mask = torch.rand(BATCH, SEQ, device=device) < 0.15
    labels = torch.where(mask, ids, torch.full_like(ids, -100))
    return ids.masked_fill(mask, 103), labels   # 103: [MASK]


batches = [masked_batch() for _ in range(2)]   # resident on the GPU: the input costs nothing here
ctx = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else nullcontext()
model.train()
meter = Meter(args.seconds, args.report_every)
step = 0
while True:
    ids, labels = batches[step % 2]
    with ctx:
        loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    if not args.fixed and gpu:
        torch.cuda.empty_cache()  # the cause: the allocator's cache given back every step
    if not meter.step():
        break
meter.done()
