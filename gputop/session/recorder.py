"""Writing a recording: the file writer, and the bus subscriber that feeds it from a thread.

Sources publish on their own threads and must never wait for the disk: ``Recorder.on_samples``
only appends to a bounded queue under a lock that no I/O ever holds; a writer thread drains
the queue to the file. When the disk falls behind (full, frozen NFS, a stalled USB stick) the
queue fills and further samples are dropped and counted, and the recording says so itself (a
``health`` sample of key ``recorder``), so the hole is explained rather than silent.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Protocol

from gputop.sources.files import FilesError, check_dir_chain
from gputop.model import KIND_HEALTH, Sample, health_data
from gputop.session.recording_format import (
    _FILE_HEADER, CHUNK_SLACK_S, FORMAT_MAJOR, FORMAT_MINOR, FRAME_CHUNK, FRAME_END, MAGIC,
    RecordingError, Series, decode_payload, encode_chunk_series, frame_bytes, meta_frame, summary_frame, validate_chunk,
)

MAX_QUEUED_SAMPLES = 200_000   # ~15 minutes of a busy 8-GPU session (about 200 samples/s):
                               # a long disk stall costs samples, never gputop's memory
CHUNK_SAMPLES = 20_000         # a backlog is written as chunks of at most this many samples...
CHUNK_SPAN_S = 5.0             # ... and this span, well inside what the reader accepts
LATE_MARGIN_S = 1.0            # a sample is written only this far inside the reader's CHUNK_SLACK_S
# A summary frame per this many seconds of samples. The report's cost is in proportion to the
# frames (each one's statistics, thread aggregates and hot frames are about the same size however
# long it covers, and are parsed, checked and merged), so longer frames make a long file's report
# cheaper: an hour's report 0.99 -> 0.77 s CPU from this change alone (0.55 s with the others of
# that session; docs/benchmarks.md, "H200 run 10 and long recordings"). What it costs: the
# summarizer holds up to this long of the samples its sections read (~3 MiB for an HF Trainer job
# on one GPU: the stacks, the small kinds, and 0.4 MiB a GPU of energy, power and tensor readings:
# report_partials.held_samples), and a file cut short (no final frame) has up to this long of
# chunks read for its statistics instead of their summary: about a second.
SUMMARY_S = 300.0


class Summarizer(Protocol):
    """What the recorder's summary frames hold (gputop/verdicts/recording_summary.py makes
    them: the report's statistics and the derivations replayed, mergeable frame by frame)."""

    def add(self, series: list[Series], t0: float, t1: float) -> None:
        """One chunk as written, exactly as a reader decodes it."""

    def take(self) -> dict:
        """The summary of the chunks added since the last take."""

    def finish(self) -> dict:
        """The last summary, at a clean stop: it settles what waits for the end of the file."""


class RecordingWriter:
    """Appends frames to a new file. Not thread-safe: the Recorder owns it on one thread."""

    def __init__(self, path: str, meta: dict):
        self.path = path
        try:
            # no other user's link or writable directory above it (O_NOFOLLOW guards only the
            # last component: --record /tmp/mlink/run.gtrec wrote through another user's link)
            real = os.path.join(check_dir_chain(os.path.dirname(path) or "."), os.path.basename(path))
        except FilesError as e:
            raise RecordingError(f"cannot create {path}: {e}") from None
        try:
            # "x": never overwrite; O_NOFOLLOW and 0600: a planted link is refused, the file is
            # private; the directory opened is the one checked
            self._f = open(real, "xb", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            raise RecordingError(f"{path} already exists: choose another --record file or remove it") from None
        except OSError as e:
            raise RecordingError(f"cannot create {path}: {e.strerror}") from None
        self._f.write(_FILE_HEADER.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0))
        self._f.write(meta_frame(meta))
        self._f.flush()
        self.bytes_written = self._f.tell()
        self.closed = False

    def write_meta(self, meta: dict) -> None:
        self._write(meta_frame(meta))

    def write_samples(self, samples: list[Sample]) -> tuple[bytes, float, float, list[Series] | None, bytes] | None:
        """Writes one chunk frame; returns its (payload, t0, t1), its series as a reader will
        decode them, where the encoder could show that they are its own (else None), and its
        codec."""
        if samples:
            payload, t0, t1, series, codec = encode_chunk_series(samples)
            self._write(frame_bytes(FRAME_CHUNK, payload, codec, t0, t1))
            return payload, t0, t1, series, codec
        return None

    def write_summary(self, summary: dict) -> None:
        self._write(summary_frame(summary))

    def _write(self, frame: bytes) -> None:
        self._f.write(frame)
        self._f.flush()  # into the OS: survives kill -9 of gputop
        self.bytes_written += len(frame)

    def fsync(self) -> None:
        """Called without the recorder's I/O lock (it touches only the descriptor): on a disk busy
        with another program's writes one fsync can take seconds, and the last chunk must not
        wait for it. A file closed meanwhile has been synced by its close."""
        try:
            os.fsync(self._f.fileno())
        except (OSError, ValueError):
            pass

    def close(self, end: dict | None = None, sync: bool = True) -> None:
        """``sync=False``: into the OS only (it survives gputop being killed, not a power loss),
        for when another fsync of this file is still waiting: a frozen disk would hang this one."""
        if self.closed:
            return
        self.closed = True
        try:
            self._f.write(meta_frame(end or {}, FRAME_END))
            self._f.flush()
            if sync:
                os.fsync(self._f.fileno())
        finally:
            self._f.close()


def _pieces(batch: list[Sample]) -> list[list[Sample]]:
    """A backlog cut into chunks the reader accepts (bounded count and span), in order."""
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    lo = hi = 0.0
    for s in batch:
        if cur and (len(cur) >= CHUNK_SAMPLES or max(hi, s.t) - min(lo, s.t) > CHUNK_SPAN_S):
            out.append(cur)
            cur = []
        if not cur:
            lo = hi = s.t
        cur.append(s)
        lo, hi = min(lo, s.t), max(hi, s.t)
    if cur:
        out.append(cur)
    return out


class Recorder:
    """Bus subscriber that writes samples to a recording, one chunk per ``flush_s`` seconds.

    Publishing only appends to a bounded queue; a writer thread does the I/O, so no source ever
    waits on the disk. fsync runs every ``fsync_s`` so a power loss costs at most that much, too.
    """

    def __init__(self, writer: RecordingWriter, flush_s: float = 1.0, fsync_s: float = 10.0,
                 max_queued: int = MAX_QUEUED_SAMPLES, summarizer: Summarizer | None = None,
                 summary_s: float = SUMMARY_S):
        self.writer = writer
        self.summarizer = summarizer
        self.summary_s = summary_s
        self.summary_error: str | None = None   # the summarizer failed: the file has samples only
        self._summary_t0: float | None = None   # first chunk time since the last summary frame
        self.flush_s = flush_s
        self.fsync_s = fsync_s
        self.max_queued = max_queued
        self._queue: list = []          # Samples, and dicts for metadata frames, in order
        self._queued_samples = 0
        self._lock = threading.Lock()   # guards the queue only: never held while writing
        self._io_lock = threading.Lock()  # one writer of the file at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputop-recorder", daemon=True)
        self.error: str | None = None
        self.written_to: float | None = None   # session time of the newest sample written
        self.samples_written = 0
        self.dropped = 0                # samples dropped because the disk fell behind
        # samples that came over CHUNK_SLACK_S after newer ones were written (a source starved on
        # a loaded machine): a reader refuses a chunk that far out of time order, so the chunk
        # would be lost whole, with the in-order samples beside them (a session's last seconds)
        self.late = 0
        self._dropped_noted = 0
        self._last_t = 0.0

    @property
    def path(self) -> str:
        return self.writer.path

    def start(self) -> None:
        self._thread.start()

    def health(self) -> dict:
        """The recorder's state, as a health sample's data."""
        if self.error is not None:
            return health_data("failed", self.error, dropped_samples=self.dropped)
        problems = []
        if self.dropped:
            problems.append(f"{self.dropped} samples not recorded: the disk fell behind")
        if self.late:
            problems.append(f"{self.late} samples not recorded: they came over {CHUNK_SLACK_S:g} s late "
                            "(a source was starved of CPU)")
        if problems:
            return health_data("degraded", "; ".join(problems), dropped_samples=self.dropped + self.late)
        return health_data("ok", "", dropped_samples=0)

    def on_samples(self, samples: list[Sample]) -> None:
        if not samples:
            return
        with self._lock:
            room = self.max_queued - self._queued_samples
            if room <= 0:
                self.dropped += len(samples)
                return
            if len(samples) > room:
                self.dropped += len(samples) - room
                samples = samples[:room]
            self._queue.extend(samples)
            self._queued_samples += len(samples)
            self._last_t = samples[-1].t

    def on_reset(self) -> None:  # a live session never seeks
        pass

    def update_meta(self, meta: dict) -> None:
        """Queued like samples (the writer thread writes it): never waits for the disk."""
        with self._lock:
            self._queue.append(dict(meta))
        self._wake.set()

    def _take(self) -> list:
        with self._lock:
            batch, self._queue, self._queued_samples = self._queue, [], 0
            if self.dropped + self.late > self._dropped_noted:
                self._dropped_noted = self.dropped + self.late
                batch.append(Sample(self._last_t, KIND_HEALTH, "recorder", self.health()))
        return batch

    def _write_batch(self, batch: list) -> None:
        """Writes what was taken from the queue; the caller holds ``_io_lock`` (and took the batch
        under it, so batches reach the file in the order they left the queue)."""
        if self.error is not None or self.writer.closed:
            return
        late_before = self.late
        try:
            run: list[Sample] = []
            for item in batch + [None]:
                if isinstance(item, Sample):
                    run.append(item)
                    continue
                self._write_run(self._in_time_order(run))
                run = []
                if isinstance(item, dict):
                    self.writer.write_meta(item)
            if self.late > late_before:   # found while writing: said in the file at once
                self._dropped_noted = self.dropped + self.late
                self._write_run([Sample(self.written_to, KIND_HEALTH, "recorder", self.health())])
        except OSError as e:  # disk full: say so, keep monitoring
            self.error = f"recording stopped early{self._at()}: {e.strerror}"
        except Exception as e:  # a sample that cannot be encoded: never kill the writer silently
            self.error = f"recording stopped early{self._at()}: {type(e).__name__}: {e}"

    def _write_run(self, run: list[Sample]) -> None:
        """Samples in time order, as chunks, each one summarized as it is written."""
        for piece in _pieces(run):
            written = self.writer.write_samples(piece)
            self.samples_written += len(piece)
            newest = max(x.t for x in piece)
            self.written_to = newest if self.written_to is None else max(self.written_to, newest)
            if written is not None:
                self._summarize(*written)

    def _in_time_order(self, run: list[Sample]) -> list[Sample]:
        """``run`` sorted by time (stable: samples of one time keep their order), less the samples
        too late to be written in time order (counted in ``late``)."""
        run = sorted(run, key=lambda s: s.t)
        if self.written_to is None or not run or run[0].t >= self.written_to - CHUNK_SLACK_S + LATE_MARGIN_S:
            return run
        floor = self.written_to - CHUNK_SLACK_S + LATE_MARGIN_S
        keep = [s for s in run if s.t >= floor]
        self.late += len(run) - len(keep)
        return keep

    def _at(self) -> str:
        """" at 0:05.9 of the session" (the newest sample written), or "" before any."""
        t = self.written_to
        if t is None:
            return ""
        return f" at {int(t // 60)}:{t % 60:04.1f} of the session"

    def _summarize(self, payload: bytes, t0: float, t1: float, series: list[Series] | None, codec: bytes) -> None:
        """Feed one written chunk to the summarizer; a summary frame per ``summary_s`` seconds.
        A failing summarizer stops the summaries, never the recording (readers then replay).
        The chunk is what a reader decodes: the encoder's series where it showed them to be
        exactly that (encode_chunk_series), else the payload decoded again."""
        if self.summarizer is None:
            return
        try:
            if series is None:
                series = validate_chunk(decode_payload(codec, payload), t0, t1)
            self.summarizer.add(series, t0, t1)
            if self._summary_t0 is None:
                self._summary_t0 = t0
            if t1 - self._summary_t0 >= self.summary_s:
                self.writer.write_summary(self.summarizer.take())
                self._summary_t0 = None
        except OSError:
            raise
        except Exception as e:
            self._summary_failed(e)

    def _summary_failed(self, e: Exception) -> None:
        self.summary_error = f"summaries stopped: {type(e).__name__}: {e}"
        self.summarizer = None

    def flush(self) -> None:
        """Write what is queued now (on the calling thread)."""
        with self._io_lock:
            self._write_batch(self._take())

    def _run(self) -> None:
        last_sync = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(self.flush_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.flush()
            if time.monotonic() - last_sync >= self.fsync_s and self.error is None:
                self.writer.fsync()
                last_sync = time.monotonic()

    def stop(self, end: dict | None = None, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        # A writer thread still alive is in a slow fsync (it holds no lock: the rest is written
        # here all the same) or stuck inside a write, holding the lock (a frozen disk): then the
        # file is left as a kill would leave it.
        if not self._io_lock.acquire(timeout=0.1):
            self.error = self.error or "recording not closed cleanly: the disk did not respond"
            return
        try:
            self._write_batch(self._take())
            try:
                if self.summarizer is not None and self.error is None:
                    try:
                        final = self.summarizer.finish()
                    except Exception as e:
                        self._summary_failed(e)
                    else:
                        self.writer.write_summary(final)
                # the writer thread still in its fsync: a second one would wait as long (forever
                # on a frozen disk, and gputop would never exit)
                self.writer.close(end, sync=not self._thread.is_alive())
            except OSError as e:
                # (the first error says when the recording stopped: a full disk mid-session)
                self.error = self.error or f"recording not closed cleanly: {e.strerror}"
        finally:
            self._io_lock.release()
