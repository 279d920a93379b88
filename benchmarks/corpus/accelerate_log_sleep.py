"""Accelerate loop on a GPT-2 (~60 ms a step) that logs each batch's data time to an in-house metrics
client whose flusher thread uploads the buffer while holding the client's lock (80 ms every ~95 ms).
Cause (loop_blocked): log() waits off the CPU for that lock, ~35 ms a step, with the GPU idle (the batch
copy has synchronised). Fix (--fixed): hand records to the flusher through a queue, never waiting.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import queue
import threading
import time

from common import Meter, forever, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

SEQ, BATCH = pick(512, 64), pick(16, 4)
UPLOAD_S, FLUSH_EVERY_S = pick(0.08, 0.03), pick(0.015, 0.005)


class MetricsClient:
    """A metrics client as written in-house: records are buffered, a thread uploads them in batches."""

    def __init__(self):
        self.lock, self.buffer, self.inbox = threading.Lock(), [], queue.SimpleQueue()
        threading.Thread(target=self._flusher, daemon=True, name="metrics-flusher").start()

    def log(self, record):  # takes the lock: waits for any upload in progress
        with self.lock:
            self.buffer.append(record)

    def log_nowait(self, record):  # hands the record over, never waits
        self.inbox.put_nowait(record)

    def _flusher(self):
        while True:
            time.sleep(FLUSH_EVERY_S)
            with self.lock:
                while not self.inbox.empty():
                    self.buffer.append(self.inbox.get_nowait())
                batch, self.buffer = self.buffer, []
                self._upload(batch)  # the bug: the slow write happens under the lock

    def _upload(self, batch):
        time.sleep(UPLOAD_S)  # stands in for an HTTP POST of the batch to a metrics server


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        ids = torch.randint(0, cfg.vocab_size, (SEQ,))
        return {"input_ids": ids, "labels": ids}


cfg = GPT2Config(n_layer=pick(12, 2), n_embd=pick(768, 64), n_head=pick(12, 4), n_positions=SEQ,
                 vocab_size=pick(50257, 2000))
accelerator = Accelerator(mixed_precision="bf16" if device.type == "cuda" else "no", cpu=device.type != "cuda")
with torch.device(device):  # random init, straight on the GPU
    model = GPT2LMHeadModel(cfg)
loader = torch.utils.data.DataLoader(Tokens(), batch_size=BATCH, num_workers=2)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=100_000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
metrics = MetricsClient()
log = metrics.log_nowait if args.fixed else metrics.log  # the fix: a queue, no waiting on the lock

meter = Meter(args.seconds, args.report_every)
model.train()
end = time.perf_counter()
for step, batch in enumerate(forever(loader)):
    # the batch is on the GPU (a blocking copy, so the GPU has finished the last step): log its data time
    log({"step": step, "data_time": time.perf_counter() - end, "lr": scheduler.get_last_lr()[0]})
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    end = time.perf_counter()
    if not meter.step():
        break
meter.done()
