"""Training loops as users write them: framework trainers (Hugging Face ``Trainer``,
Lightning) and plain PyTorch loops with the things real jobs do besides training — a slow
start-up, checkpoints, evaluation, CPU work in the loop, a periodic blocking call.

The bottleneck scenarios in workload.py each have one textbook cause; these exist because a
rule that only fires on a loop written to trigger it does not work. Each runs on the GPU when
there is one and, smaller, on the CPU (so CI can run the plain loops with real py-spy).
Framework scenarios need their framework installed and build everything locally (tiny model
configs, random tokens): nothing is downloaded.

Like every workload, each prints ``rate <steps_per_s> <total_steps>`` from its own step count
(for the frameworks: from a callback at the end of each optimizer step, the framework's count).
"""

from __future__ import annotations

import os
import tempfile
import time


def _torch():
    import torch

    return torch


def _device(torch):
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _gpu(torch) -> bool:
    return torch.cuda.is_available()


def _mlp(torch, width, depth, device, dtype=None, out=10):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, out))
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype)


def _step(torch, model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def _busy_model(torch):
    """A GPU-bound step of about 25-40 ms on an H200 (bf16 matmuls), small on a CPU."""
    device = _device(torch)
    if _gpu(torch):
        n, depth, batch, dtype = 8192, 6, 8192, torch.bfloat16
    else:
        n, depth, batch, dtype = 256, 3, 256, torch.float32
    model = _mlp(torch, n, depth, device, dtype=dtype)
    x = torch.randn(batch, n, device=device, dtype=dtype)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, x, y


# ---------------------------------------------------------------------------------------------
# Frameworks


def hf_trainer(m) -> None:
    """Hugging Face ``Trainer`` on a GPT-2 (small config on a GPU, tiny on a CPU) built from
    its config, bf16 on a GPU, 2 DataLoader workers, random tokens: the issue's real case."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch = _torch()
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    gpu = _gpu(torch)
    seq = 512 if gpu else 64
    cfg = GPT2Config(n_layer=12 if gpu else 2, n_embd=768 if gpu else 64, n_head=12 if gpu else 4,
                     n_positions=seq, vocab_size=50257 if gpu else 1000)
    model = GPT2LMHeadModel(cfg)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            ids = torch.randint(0, cfg.vocab_size, (seq,))
            return {"input_ids": ids, "labels": ids}

    class Count(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if not m.step():
                control.should_training_stop = True
            return control

    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="gputop-hf-"), per_device_train_batch_size=8 if gpu else 4,
                             max_steps=10 ** 7, bf16=gpu, use_cpu=not gpu, dataloader_num_workers=2, logging_steps=10,
                             save_strategy="no", report_to=[], disable_tqdm=True, learning_rate=3e-4)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Count()]).train()


def lightning_mlp(m) -> None:
    """Lightning on a small MLP, batch 64: each step is tiny on the GPU, so the framework's
    per-step Python (hooks, logging, the optimizer closure) is what the loop spends its time in."""
    torch = _torch()
    try:
        import lightning as L
    except ImportError:
        import pytorch_lightning as L

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _mlp(torch, 256, 3, "cpu")

        def training_step(self, batch, _i):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Count(L.Callback):
        def on_train_batch_end(self, trainer, *a, **kw):
            if not m.step():
                trainer.should_stop = True

    data = torch.utils.data.TensorDataset(torch.randn(64 * 512, 256), torch.randint(0, 10, (64 * 512,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)
    trainer = L.Trainer(accelerator="auto", devices=1, max_epochs=10 ** 6, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Count()])
    trainer.fit(Net(), loader)


# ---------------------------------------------------------------------------------------------
# Plain PyTorch loops with what real jobs do besides training


def checkpoint_stall(m, every_s: float = 4.0) -> None:
    """A GPU-bound loop that saves model and optimizer state synchronously every few seconds
    (``torch.save`` to local disk): the GPU idles while the checkpoint is written."""
    torch = _torch()
    model, x, y = _busy_model(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    # On a CPU the model is small; a 128 MiB copy of the weights (as an EMA would be) keeps the
    # checkpoint big enough to see. On a GPU the model's own 2 GiB of state does that.
    extra = None if _gpu(torch) else torch.zeros(32 << 20)
    path = os.path.join(tempfile.mkdtemp(prefix="gputop-ckpt-"), "checkpoint.pt")
    last = time.monotonic()
    try:
        while True:
            _step(torch, model, opt, x, y)
            if time.monotonic() - last >= every_s:
                save_checkpoint(torch, model, opt, path, extra)
                last = time.monotonic()
            if not m.step():
                return
    finally:
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def save_checkpoint(torch, model, opt, path: str, extra=None) -> None:
    t0 = time.monotonic()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    if extra is not None:
        state["ema"] = extra
    torch.save(state, path)
    print(f"stall {t0:.3f} {time.monotonic() - t0:.3f}", flush=True)


def cpu_work(m, target_ms: float = 30.0) -> None:
    """Each step does ~30 ms of CPU tensor work on the main thread (augmenting the batch on
    the CPU) before a short GPU step: the GPU waits for the host."""
    torch = _torch()
    device = _device(torch)
    model = _mlp(torch, 1024, 4, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    images = torch.rand(64, 3, 96, 96)
    reps = _calibrate(lambda: augment(torch, images, 1), target_ms)
    y = torch.randint(0, 10, (64,), device=device)
    while True:
        batch = augment(torch, images, reps)
        x = batch.reshape(64, -1)[:, :1024].to(device)
        _step(torch, model, opt, x, y)
        if not m.step():
            return


def augment(torch, images, reps: int):
    out = images
    for _ in range(reps):
        out = torch.nn.functional.avg_pool2d(out, 3, stride=1, padding=1)
        out = (out - out.mean()) / (out.std() + 1e-6)
    return out


def _calibrate(fn, target_ms: float) -> int:
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.3:
        fn()
        n += 1
    per = (time.perf_counter() - t0) / n
    return max(1, round(target_ms / 1000.0 / per))


def eval_phase(m, train_s: float = 8.0, eval_s: float = 4.0) -> None:
    """Trains (GPU-bound) for ``train_s``, then evaluates batch by batch without gradients for
    ``eval_s``, over and over: an evaluation phase that is not training."""
    torch = _torch()
    model, x, y = _busy_model(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    while True:
        t_end = time.monotonic() + train_s
        while time.monotonic() < t_end:
            _step(torch, model, opt, x, y)
            if not m.step():
                return
        evaluate(torch, model, x, eval_s)


def evaluate(torch, model, x, seconds: float) -> None:
    model.eval()
    with torch.no_grad():
        t_end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < t_end:
            model(x[i % x.shape[0]: i % x.shape[0] + 1]).argmax(-1).tolist()  # batch 1, read back
            i += 1
    model.train()


def slow_startup(m, build_s: float = 6.0) -> None:
    """Builds a model on the CPU, writes and loads its "pretrained" weights from disk, then
    trains GPU-bound: ~10 s of start-up before the first step, which is no verdict about the job."""
    torch = _torch()
    t_end = time.monotonic() + build_s
    blocks = []
    while time.monotonic() < t_end:  # model construction: weight init on the CPU
        blocks.append(build_block(torch))
    path = os.path.join(tempfile.mkdtemp(prefix="gputop-weights-"), "weights.pt")
    torch.save([b.state_dict() for b in blocks[:8]], path)
    load_weights(torch, path)
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
    del blocks
    model, x, y = _busy_model(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    while True:
        _step(torch, model, opt, x, y)
        if not m.step():
            return


def build_block(torch):
    return torch.nn.Linear(2048, 2048)


def load_weights(torch, path: str):
    return torch.load(path, weights_only=True)


def periodic_stall(m, every_s: float = 3.0, stall_s: float = 1.5) -> None:
    """A GPU-bound loop that blocks for 1.5 s every 3 s in a synchronous call (think: pushing
    metrics to a server and waiting for the reply): half the time, the GPU has nothing to do."""
    torch = _torch()
    model, x, y = _busy_model(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    last = time.monotonic()
    while True:
        _step(torch, model, opt, x, y)
        if time.monotonic() - last >= every_s - stall_s:
            torch.cuda.synchronize() if _gpu(torch) else None
            push_metrics(stall_s)
            last = time.monotonic()
        if not m.step():
            return


def push_metrics(seconds: float) -> None:
    t0 = time.monotonic()
    time.sleep(seconds)
    # the loop's own record of each stall, for benchmarks to compare gputop's period with
    print(f"stall {t0:.3f} {time.monotonic() - t0:.3f}", flush=True)
