"""Lightning audio tagging (after PANNs' Cnn14 AudioSet recipe, at 16 kHz): a Cnn14 (6 conv blocks of two 3x3
conv + BatchNorm + ReLU, 64 to 2048 channels, ~81M parameters, ~48 GFLOP a clip forward+backward, 527 classes,
multi-label BCE), bf16-mixed, AdamW, batch 64 of 4-second clips (401 frames x 64 log-mel bins; ~3 TFLOP, ~20-35 ms
a step on an H100). Each sample is made in Dataset.__getitem__ on the CPU with torch ops, as audio recipes do: a
4.6 s random waveform at 16 kHz, Kaldi-style speed perturbation (0.9/1.0/1.1, windowed-sinc resampling), noise at
a random SNR, a random 4 s crop, pre-emphasis, STFT (n_fft=512, 25 ms Hann window, 10 ms hop), a 64-band mel
filterbank, log, per-utterance normalisation and SpecAugment (2 frequency, 2 time masks); DataLoader(num_workers=2).
Cause (input_bound): a sample costs ~2.2 ms of one core (measured on an EPYC Genoa core: the resampling
convolution, the STFT, the mel projection), so two workers make a batch of 64 every ~70 ms while the GPU trains
one in ~20-35 ms and waits for data the rest of the time. Expect the fix to gain roughly +80% to +220% steps/s
(the step becomes GPU-bound).
Fix (--fixed): DataLoader(num_workers=14) (the machine has 16 cores): the same pipeline makes a batch in ~10-15 ms.
"""
# ruff: noqa: E401, E402, E702
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import math

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
import lightning as L
import torch.nn as nn
import torch.nn.functional as F

gpu = device.type == "cuda"
meter = Meter(args.seconds, args.report_every)
SR, CLIP, BATCH, CLASSES = 16000, pick(4.0, 1.0), pick(64, 8), pick(527, 10)
N_FFT, WIN, HOP, N_MELS = 512, 400, 160, 64
WIDTHS = pick((64, 128, 256, 512, 1024, 2048), (8, 16, 32, 64))  # Cnn14 on the GPU; a 4-block, 8-64 wide CNN on the CPU


def mel_fbanks(n_freqs, f_min, f_max, n_mels, sr):
    """Triangular HTK mel filters, as torchaudio.functional.melscale_fbanks builds them: (n_freqs, n_mels)."""
    hz2mel = lambda f: 2595.0 * math.log10(1.0 + f / 700.0)  # noqa: E731
    freqs = torch.linspace(0, sr // 2, n_freqs)
    f_pts = 700.0 * (10 ** (torch.linspace(hz2mel(f_min), hz2mel(f_max), n_mels + 2) / 2595.0) - 1.0)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - freqs.unsqueeze(1)
    down, up = -slopes[:, :-2] / f_diff[:-1], slopes[:, 2:] / f_diff[1:]
    return torch.clamp(torch.min(down, up), min=0.0)


def resample(x, orig, new, width=6, rolloff=0.99):
    """Windowed-sinc polyphase resampling (torchaudio.functional.resample's sinc_interp_hann method)."""
    g = math.gcd(orig, new); orig //= g; new //= g
    base = min(orig, new) * rolloff
    w = math.ceil(width * orig / base)
    idx = torch.arange(-w, w + orig, dtype=torch.float64)[None, None] / orig
    t = ((torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx) * base).clamp(-width, width)
    window = torch.cos(t * math.pi / width / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * window * base / orig
    y = F.conv1d(F.pad(x[None, None], (w, w + orig)), kernels.float().view(new, 1, -1), stride=orig)
    return y.transpose(1, 2).reshape(-1)[: math.ceil(new * x.shape[-1] / orig)]


class SyntheticClips(torch.utils.data.Dataset):
    """Random waveforms turned into augmented log-mel spectrograms, one per item, on the CPU."""

    def __init__(self):
        self.fbanks = mel_fbanks(N_FFT // 2 + 1, 50.0, SR / 2, N_MELS, SR)
        self.window = torch.hann_window(WIN)

    def __len__(self):
        return 2_000_000  # AudioSet-sized: one epoch is far longer than the run

    def __getitem__(self, i):
        n = int(SR * CLIP * 1.15)
        wav = torch.randn(n) * (0.3 + torch.rand(n // 400).repeat_interleave(400))  # a "recording", with loudness
        speed = (0.9, 1.0, 1.1)[i % 3]  # speed perturbation
        if speed != 1.0:
            wav = resample(wav, int(SR * speed), SR)
        noise = torch.randn(wav.numel())
        snr_db = 5.0 + 15.0 * torch.rand(())  # background noise at 5-20 dB SNR
        wav = wav + noise * (wav.norm() / noise.norm()) * 10 ** (-snr_db / 20)
        length = int(SR * CLIP)
        start = int(torch.randint(0, wav.numel() - length + 1, ()))
        wav = wav[start:start + length]
        wav = torch.cat([wav[:1], wav[1:] - 0.97 * wav[:-1]])  # pre-emphasis
        power = torch.stft(wav, N_FFT, HOP, WIN, self.window, return_complex=True).abs().pow(2)
        logmel = torch.log(self.fbanks.T @ power + 1e-6).T  # (frames, mels)
        logmel = (logmel - logmel.mean(0)) / (logmel.std(0) + 1e-5)
        for _ in range(2):  # SpecAugment: frequency masks (F=8), then time masks (T=40)
            f = int(torch.randint(0, 9, ())); f0 = int(torch.randint(0, N_MELS - f + 1, ()))
            logmel[:, f0:f0 + f] = 0.0
        for _ in range(2):
            t = int(torch.randint(0, 41, ())); t0 = int(torch.randint(0, logmel.shape[0] - t + 1, ()))
            logmel[t0:t0 + t] = 0.0
        target = torch.zeros(CLASSES)
        target[torch.randint(0, CLASSES, (3,))] = 1.0  # multi-label, 1-3 tags
        return logmel.unsqueeze(0), target


class ConvBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)

    def forward(self, x, pool=(2, 2)):
        x = F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        return F.avg_pool2d(x, pool)


class LitCnn14(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.bn0 = nn.BatchNorm2d(N_MELS)
        self.blocks = nn.ModuleList(ConvBlock(cin, cout) for cin, cout in zip((1,) + WIDTHS[:-1], WIDTHS))
        self.fc1 = nn.Linear(WIDTHS[-1], WIDTHS[-1])
        self.fc_audioset = nn.Linear(WIDTHS[-1], CLASSES)

    def forward(self, x):  # x: (batch, 1, frames, mels)
        x = self.bn0(x.transpose(1, 3)).transpose(1, 3)
        for j, block in enumerate(self.blocks):
            x = F.dropout(block(x, (1, 1) if j == len(self.blocks) - 1 else (2, 2)), 0.2, self.training)
        x = x.mean(dim=3)
        x = x.max(dim=2).values + x.mean(dim=2)
        x = F.relu(self.fc1(F.dropout(x, 0.5, self.training)))
        return self.fc_audioset(F.dropout(x, 0.5, self.training))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.01)


class StepMeter(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not meter.step():
            trainer.should_stop = True


# THE CAUSE: two workers make every log-mel spectrogram of a 64-clip batch.
loader = torch.utils.data.DataLoader(SyntheticClips(), batch_size=BATCH, shuffle=True, drop_last=True,
                                     num_workers=14 if args.fixed else 2,  # the fix: num_workers=14
                                     pin_memory=gpu, persistent_workers=True)
trainer = L.Trainer(accelerator="auto", devices=1, precision=pick("bf16-mixed", "32-true"), max_epochs=10_000,
                    benchmark=True, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[StepMeter()])
trainer.fit(LitCnn14(), train_dataloaders=loader)
meter.done()
