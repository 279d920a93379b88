"""HF Trainer image classification (after transformers' examples/pytorch/image-classification): a ViT-Base/16
(86M parameters, 224x224, 1000 classes, random init from a ViTConfig), bf16, per_device_train_batch_size=64,
on 256x256 RGB "photos" (random uint8, held in memory) with a torchvision pipeline in __getitem__:
RandomResizedCrop(224) + RandomHorizontalFlip + ColorJitter(0.4, 0.4, 0.4) + ToTensor + Normalize;
dataloader_num_workers=0.
Cause (input_bound): with no workers the Trainer's DataLoader runs the pipeline for all 64 samples in the
training process, between two steps: ~2 ms of PIL work a sample (crop-resize, jitter, ToTensor), ~110-130 ms
a batch, while the GPU idles; the GPU step (~35-45 ms) does not overlap it either, since the Trainer reads
each step's loss (its nan/inf filter) before it fetches the next batch.
Fix (--fixed): dataloader_num_workers=12: the same pipeline runs ahead in 12 worker processes (~11 ms of
wall time a batch); expected gain about +150% to +300% steps/s (the step becomes GPU-bound).
A second fix (--compile, added after the fix was measured: gputop called the fixed job host_bound, +57%, its hot
code the model's own forward and backward): TrainingArguments(torch_compile=True), the first remedy its advice
names. It also fuses the GPU's own work, so it can gain more than removing the launches alone; a gain under 10%
refutes the call.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shutil
import tempfile

import numpy as np
from PIL import Image

from common import Meter, parse, pick, torch_and_device

SECOND_FIX = "the second fix: TrainingArguments(torch_compile=True)"
args = parse(__doc__, lambda p: p.add_argument("--compile", action="store_true", help=SECOND_FIX))
torch, device = torch_and_device()
from torchvision import transforms
from transformers import Trainer, TrainerCallback, TrainingArguments, ViTConfig, ViTForImageClassification

gpu = device.type == "cuda"
SIZE, SRC, BATCH, CLASSES = pick(224, 32), pick(256, 40), pick(64, 8), pick(1000, 10)
# ViT-Base/16 on the GPU; a 2-layer, 64-wide ViT on the CPU
cfg = ViTConfig(image_size=SIZE, patch_size=pick(16, 8), hidden_size=pick(768, 64), num_hidden_layers=pick(12, 2),
                num_attention_heads=pick(12, 2), intermediate_size=pick(3072, 128), num_labels=CLASSES)

normalize = transforms.Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])  # ViTImageProcessor's mean/std
train_transforms = transforms.Compose([
    transforms.RandomResizedCrop(SIZE),
    transforms.RandomHorizontalFlip(),
    transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
    transforms.ToTensor(),
    normalize,
])


class Photos(torch.utils.data.Dataset):
    """Random uint8 RGB images kept in memory (a decoded image dataset); augmented per item."""

    def __init__(self, n, transform):
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, size=(n, SRC, SRC, 3), dtype=np.uint8)
        self.labels = rng.integers(0, CLASSES, size=n)
        self.transform = transform

    def __len__(self):
        return 1_000_000  # an epoch far longer than the run

    def __getitem__(self, i):
        i %= len(self.images)
        image = Image.fromarray(self.images[i])
        return {"pixel_values": self.transform(image), "labels": int(self.labels[i])}


class StepMeter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if not meter.step():
            control.should_training_stop = True
        return control


out = tempfile.mkdtemp(prefix="corpus-trainer-vit-")
targs = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=10**7, learning_rate=3e-4,
                          warmup_steps=100, weight_decay=0.05, logging_steps=50, report_to=[], disable_tqdm=True,
                          bf16=gpu, use_cpu=not gpu, save_strategy="no", remove_unused_columns=False,
                          torch_compile=args.compile,  # the second fix
                          dataloader_num_workers=12 if args.fixed else 0)  # the fix: dataloader_num_workers=12
with torch.device(device):  # random init, straight on the GPU
    model = ViTForImageClassification(cfg)
trainer = Trainer(model=model, args=targs, train_dataset=Photos(pick(1024, 64), train_transforms),
                  callbacks=[StepMeter()])
meter = Meter(args.seconds, args.report_every)
try:
    trainer.train()
finally:
    meter.done()
    shutil.rmtree(out, ignore_errors=True)
