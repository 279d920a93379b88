"""One side of ``gputop diff``: a recording's report (``gputop report``'s own ``build_report``,
verdicts and time budget replayed as the report does) and the few time series the comparison
needs beyond it — the probe's step windows and the GPU counters of the training part — read
through the session's reader and sanitiser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gputop.catalogue import KIND_PROBE_STEP
from gputop.derive.phases import JUDGED
from gputop.derive.steps import pool_steps
from gputop.model import KIND_GPU, KIND_GPU_INFO, Sample
from gputop.report import build_report
from gputop.session.recording import RecordingReader
from gputop.session.sanitize import clean_series

# The GPU counters the diff compares (their labels and units come from the catalogue).
GPU_FIELDS = ("sm_active", "tensor_active", "util_gpu", "dram_bw", "util_mem", "power_w", "clock_sm_mhz",
              "mem_used")


@dataclass
class Side:
    path: str
    report: dict
    windows: list[Sample] = field(default_factory=list)    # probe_step windows of ``process``
    process: str | None = None                             # the probed process followed (its PID)
    gpu: dict[str, list[tuple[float, dict]]] = field(default_factory=dict)   # GPU key -> (t, fields)
    gpu_info: dict[str, dict] = field(default_factory=dict)                  # GPU key -> last info

    @property
    def training_windows(self) -> list[Sample]:
        return [w for w in self.windows if w.data.get("steps")]

    @property
    def span(self) -> tuple[float, float] | None:
        """The training part: from the first to the last probe window with a step; without the
        probe, from the start of the first judged phase (training, checkpointing, running) to
        the end of the last; None when neither is known."""
        train = self.training_windows
        if train:
            first = train[0]
            return first.t - (_num(first.data.get("window_s")) or 0.0), train[-1].t
        phases = [p for p in self.report.get("phases") or [] if isinstance(p, dict) and _num(p.get("t")) is not None]
        t_end = self._t_end()
        judged = [(p["t"], phases[i + 1]["t"] if i + 1 < len(phases) else t_end)
                  for i, p in enumerate(phases) if p.get("phase") in JUDGED]
        judged = [(a, b) for a, b in judged if b is not None and b > a]
        return (judged[0][0], judged[-1][1]) if judged else None

    def _t_end(self) -> float | None:
        ts = [t for rows in self.gpu.values() for t, _ in rows[-1:]] + [w.t for w in self.windows[-1:]]
        return max(ts) if ts else None

    @property
    def pool(self):
        """The followed process's steps pooled as ``gputop report`` pools them."""
        return pool_steps(w.data for w in self.training_windows)

    def watched_gpus(self) -> list[str]:
        keys = sorted(set(self.gpu) | set(self.gpu_info), key=lambda k: (len(k), k))
        watched = [k for k in keys if self.gpu_info.get(k, {}).get("watched") is not False]
        return watched or keys

    def gpu_means(self) -> dict[str, float]:
        """Each GPU counter's mean over the training part, averaged over the watched GPUs
        (power: summed over them, the job's draw)."""
        span = self.span
        out: dict[str, float] = {}
        for name in GPU_FIELDS:
            per_gpu = []
            for key in self.watched_gpus():
                vals = [d[name] for t, d in self.gpu.get(key, [])
                        if (span is None or span[0] <= t <= span[1]) and _num(d.get(name)) is not None]
                if vals:
                    per_gpu.append(sum(vals) / len(vals))
            if per_gpu:
                out[name] = sum(per_gpu) if name == "power_w" else sum(per_gpu) / len(per_gpu)
        return out


def load(path: str) -> Side:
    """Read one recording. Raises RecordingError (or OSError) when it cannot be read."""
    report = build_report(path)
    side = Side(path=path, report=report)
    steps: dict[str, list[Sample]] = {}
    with RecordingReader(path) as reader:
        for ref in reader.index.chunks:
            for series in reader.read_series(ref):
                series = clean_series(*series)
                if series is None:
                    continue
                kind, key, ts, cols = series
                if kind == KIND_PROBE_STEP:
                    names = list(cols)
                    steps.setdefault(key, []).extend(
                        Sample(float(t), kind, key, {n: cols[n][i] for n in names}) for i, t in enumerate(ts))
                elif kind == KIND_GPU:
                    wanted = [n for n in GPU_FIELDS if n in cols]
                    side.gpu.setdefault(key, []).extend(
                        (float(t), {n: cols[n][i] for n in wanted}) for i, t in enumerate(ts))
                elif kind == KIND_GPU_INFO:
                    info = side.gpu_info.setdefault(key, {})
                    for n, col in cols.items():
                        got = [v for v in col if v is not None]
                        if got:
                            info[n] = got[-1]   # a partial update keeps what it left out
    for rows in side.gpu.values():
        rows.sort(key=lambda r: r[0])
    if steps:
        # The process that trained most (rank 0 of a DDP job steps as often as the others).
        def timed(key):
            return sum(int(_num(w.data.get("step_n")) or 0) for w in steps[key])
        side.process = max(sorted(steps), key=timed)
        side.windows = sorted(steps[side.process], key=lambda s: s.t)
    return side


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
