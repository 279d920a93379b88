"""Lightning CIFAR-100-style CNN (bf16-mixed, batch 512) whose training_step computes its metrics on the host.

Cause (sync_stall): every step reads .item() several times and .cpu().numpy() the probabilities, then does
numpy/Python metric maths (calibration error, per-class F1) while the GPU, drained by the reads, idles.
Fix (--fixed): the same metrics as GPU tensors, handed to self.log without being read on the host.
"""

import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401, E702
from common import Meter, parse, pick, torch_and_device

import lightning as L
import numpy as np
import torch.nn as nn
import torch.nn.functional as F

args = parse(__doc__)
torch, device = torch_and_device()
meter = Meter(args.seconds, args.report_every)
BATCH, CLASSES, BINS = pick(512, 32), 100, 15
WIDTHS = pick((128, 256, 512), (16, 32, 64))


class PinnedBatches(torch.utils.data.Dataset):
    """Ready CIFAR-sized batches in pinned memory (the input costs nothing here: the job is about metrics)."""

    def __init__(self, n: int):
        self.x = [torch.randn(BATCH, 3, 32, 32).pin_memory() if device.type == "cuda" else torch.randn(BATCH, 3, 32, 32)
                  for _ in range(n)]
        self.y = [torch.randint(0, CLASSES, (BATCH,)) for _ in range(n)]

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        return self.x[i % len(self.x)], self.y[i % len(self.y)]


def conv_bn(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        a, b, c = WIDTHS
        self.net = nn.Sequential(conv_bn(3, a), conv_bn(a, a), nn.MaxPool2d(2), conv_bn(a, b), conv_bn(b, b),
                                 nn.MaxPool2d(2), conv_bn(b, c), conv_bn(c, c), nn.MaxPool2d(2), conv_bn(c, c),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, CLASSES))
        self.register_buffer("edges", torch.linspace(0, 1, BINS + 1)[1:-1])

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y, label_smoothing=0.1)
        if args.fixed:
            self.log_dict(self.metrics_on_gpu(logits.detach().float(), y, loss.detach()))
        else:
            self.log_dict(self.metrics_on_host(logits.detach().float(), y, loss))
        return loss

    def metrics_on_host(self, logits, y, loss):
        # THE CAUSE: each .item() / .cpu() waits for the GPU to finish; the numpy maths then runs while it idles
        m = {"train/loss": loss.item(), "train/acc": (logits.argmax(1) == y).float().mean().item(),
             "train/top5": (logits.topk(5, 1).indices == y[:, None]).any(1).float().mean().item()}
        probs, labels = logits.softmax(1).cpu().numpy(), y.cpu().numpy()
        conf, pred = probs.max(1), probs.argmax(1)
        correct = pred == labels
        ece = 0.0
        for lo, hi in zip(np.linspace(0, 1, BINS + 1)[:-1], np.linspace(0, 1, BINS + 1)[1:]):
            in_bin = (conf > lo) & (conf <= hi)
            if in_bin.any():
                ece += in_bin.mean() * abs(conf[in_bin].mean() - correct[in_bin].mean())
        f1 = []
        for k in range(CLASSES):                                    # per-class F1, the usual way
            tp, fp = np.sum((pred == k) & (labels == k)), np.sum((pred == k) & (labels != k))
            fn = np.sum((pred != k) & (labels == k))
            precision, recall = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
            f1.append(2 * precision * recall / max(precision + recall, 1e-12))
        m.update({"train/ece": float(ece), "train/macro_f1": float(np.mean(f1)),
                  "train/entropy": float(-(probs * np.log(probs + 1e-12)).sum(1).mean())})
        return m

    def metrics_on_gpu(self, logits, y, loss):
        probs = logits.softmax(1)
        conf, pred = probs.max(1)
        correct = (pred == y).float()
        bins = torch.bucketize(conf, self.edges)                   # 15 bins; no host read anywhere below
        gap = torch.zeros(BINS, device=logits.device).index_add_(0, bins, conf - correct)
        tp = torch.zeros(CLASSES, device=logits.device).index_add_(0, y, correct)
        ones = torch.ones_like(correct)
        precision = tp / torch.zeros(CLASSES, device=logits.device).index_add_(0, pred, ones).clamp(min=1)
        recall = tp / torch.zeros(CLASSES, device=logits.device).index_add_(0, y, ones).clamp(min=1)
        f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
        return {"train/loss": loss, "train/acc": correct.mean(),
                "train/top5": (logits.topk(5, 1).indices == y[:, None]).any(1).float().mean(),
                "train/ece": gap.abs().sum() / len(y), "train/macro_f1": f1.mean(),
                "train/entropy": -(probs * (probs + 1e-12).log()).sum(1).mean()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


loader = torch.utils.data.DataLoader(PinnedBatches(4), batch_size=None, shuffle=False)
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[StepMeter()])
trainer.fit(LitClassifier(), train_dataloaders=loader)
meter.done()
