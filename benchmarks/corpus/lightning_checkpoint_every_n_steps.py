"""Lightning causal-LM fine-tuning: a GPT-2 medium-sized model from a GPT2Config (24 layers, d=1024, 16 heads,
~355M parameters; random init stands in for the pretrained weights) in a LightningModule, bf16-mixed, AdamW with
linear warmup/decay, gradient_clip_val=1.0, batch 8 x 1024 tokens of pre-tokenised random ids (4 workers, pinned
memory; the input costs nothing). ~20 TFLOP a step: ~65-90 ms on an H100, the GPU busy with large matmuls. The
Trainer still carries a config left from debugging a resume: ModelCheckpoint(dirpath=..., every_n_train_steps=50,
save_top_k=-1), plus a small callback that deletes all but the two newest checkpoint files (the disk filled up
once), so disk use stays under ~13 GB.
Cause (io_stall): every 50 steps (~3.3-4.5 s of training) ModelCheckpoint writes a full checkpoint from the
training loop's thread: the fp32 weights (~1.4 GB) and AdamW's two moments (~2.8 GB), ~4.3 GB in all. Lightning's
TorchCheckpointIO copies every tensor to the host, torch.save-s them into an in-memory buffer (with a CRC32 of
every record) and then writes the buffer to local disk. Assuming ~0.2 s/GB for the device-to-host copies, ~0.3-0.5
s/GB to serialise and ~0.3-0.5 s/GB to write into the page cache / a local NVMe disk (1-3 GB/s once writeback
throttles), a save takes ~3-5 s while the GPU idles: ~40-60% of the wall time. Expect the fix to gain roughly
+65% to +150% steps/s.
Fix (--fixed): every_n_train_steps=1000, so no checkpoint falls within the run (the pruning callback still runs).
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glob
import shutil
import tempfile

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

gpu = device.type == "cuda"
meter = Meter(args.seconds, args.report_every)
# the fix: every_n_train_steps=1000 (no checkpoint within the run); every 10 steps on the CPU, where steps are slower
EVERY_N_STEPS = 1000 if args.fixed else pick(50, 10)
SEQ, BATCH = pick(1024, 64), pick(8, 4)
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


class LitGPT2(L.LightningModule):
    def __init__(self):
        super().__init__()
        with torch.device(device):  # random init, straight on the GPU
            self.model = GPT2LMHeadModel(cfg)

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=5e-5, weight_decay=0.01)
        scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=100_000)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class KeepLastCheckpoints(L.Callback):
    """Deletes all but the newest `keep` .ckpt files. Lightning runs ModelCheckpoint after every other callback,
    so this sees the previous step's save; it runs every step in both variants."""

    def __init__(self, dirpath, keep=2):
        self.dirpath, self.keep = dirpath, keep

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        ckpts = sorted(glob.glob(os.path.join(self.dirpath, "*.ckpt")), key=os.path.getmtime)
        for path in ckpts[:-self.keep]:
            os.remove(path)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


ckpt_dir = tempfile.mkdtemp(prefix="corpus-lit-ckpt-")  # local disk
# THE CAUSE: a full checkpoint (weights + AdamW state) every 50 steps, written on the loop's thread
checkpoint = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=EVERY_N_STEPS, save_top_k=-1)
loader = torch.utils.data.DataLoader(Tokens(), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=pick(4, 2),
                                     pin_memory=gpu, persistent_workers=True)
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    gradient_clip_val=1.0, logger=False, enable_checkpointing=True, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[StepMeter(), KeepLastCheckpoints(ckpt_dir), checkpoint])
try:
    trainer.fit(LitGPT2(), train_dataloaders=loader)
finally:
    meter.done()
    shutil.rmtree(ckpt_dir, ignore_errors=True)
