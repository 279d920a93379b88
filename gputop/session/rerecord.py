"""A recording's samples fed again through the recorder, as a live session would feed them.

Used to bring an older file to the current format (summary frames included) and to make long
test files from real ones: ``span_s`` loops the file's samples with shifted times until the new
file covers that long, so it has a real session's content and density and whatever the recorder
writes. Nothing is faked past the samples' times: each source chunk is handed to
``Recorder.on_samples`` and written by ``Recorder.flush`` exactly as the writer thread does.
"""

from __future__ import annotations

from typing import Callable

from gputop.model import Sample
from gputop.session.recorder import SUMMARY_S, Recorder, RecordingWriter, Summarizer
from gputop.session.recording_reader import RecordingReader


def rerecord(src: str, dst: str, summarizer: Summarizer | None = None, span_s: float | None = None,
             progress: Callable[[float], None] | None = None, summary_s: float = SUMMARY_S) -> Recorder:
    """Write ``dst`` from ``src``'s samples (looped to ``span_s`` seconds if given); returns the
    stopped recorder (its ``error`` and ``summary_error`` say whether all went well)."""
    with RecordingReader(src) as r:
        meta = dict(r.meta)
        refs = r.index.good_chunks()
        t0, t1 = r.index.t_start, r.index.t_end
        chunks = None if span_s is None else [r.read_chunk(c) for c in refs]   # looped: keep them
        rec = Recorder(RecordingWriter(dst, meta), summarizer=summarizer, summary_s=summary_s)
        period = (t1 - t0) + 1.0
        shift, total = 0.0, span_s if span_s is not None else t1 - t0
        while True:
            for i, ref in enumerate(refs):
                samples = chunks[i] if chunks is not None else r.read_chunk(ref)
                if shift:
                    samples = [_shifted(s, shift) for s in samples]
                rec.on_samples(samples)
                rec.flush()
            shift += period
            if progress is not None:
                progress(min(shift / max(total, 1e-9), 1.0))
            if span_s is None or shift >= span_s:
                break
    rec.stop({"clean": True, "rerecorded_from": src})
    return rec


# Times inside a sample's data, shifted with the sample: a py-spy window's and a kernel-wait
# second's start (``t0``: what places their moments in time) and the target's exit. Unshifted,
# every loop after the first had its stacks at the first loop's times, outside every window.
# Times inside a sample's data that move with it (a stacks window's start, the target's exit).
# Not shifted: a stall_snapshot's own times (t, since, last_step_t): a looped file keeps the
# first loop's there, which only the stall section of a looped test file shows.
_TIME_FIELDS = ("t0", "exit_t")


def _shifted(s: Sample, shift: float) -> Sample:
    data = s.data
    if any(type(data.get(k)) in (int, float) for k in _TIME_FIELDS):
        data = {k: (v + shift if k in _TIME_FIELDS and type(v) in (int, float) else v) for k, v in data.items()}
    return Sample(s.t + shift, s.kind, s.key, data)
