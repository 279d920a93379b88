"""Writing a recording: the file writer, and the bus subscriber that feeds it from a thread."""

from __future__ import annotations

import os
import threading
import time

from gputop.model import Sample
from gputop.session.recording_format import (
    _FILE_HEADER, CODEC_ZLIB, FORMAT_MAJOR, FORMAT_MINOR, FRAME_CHUNK, FRAME_END, FRAME_META, MAGIC,
    RecordingError, encode_chunk, frame_bytes, json_frame,
)

MAX_QUEUED_SAMPLES = CHUNK_SAMPLES = None  # (the bounded queue comes with the next commit)


class RecordingWriter:
    """Appends frames to a new file. Not thread-safe: the Recorder owns it on one thread."""

    def __init__(self, path: str, meta: dict):
        self.path = path
        try:
            # "x": never overwrite somebody's recording.
            self._f = open(path, "xb")
        except FileExistsError:
            raise RecordingError(f"{path} already exists: choose another --record file or remove it") from None
        except OSError as e:
            raise RecordingError(f"cannot create {path}: {e.strerror}") from None
        self._f.write(_FILE_HEADER.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0))
        self._f.write(json_frame(FRAME_META, meta))
        self._f.flush()
        self.bytes_written = self._f.tell()
        self.closed = False

    def write_meta(self, meta: dict) -> None:
        self._write(json_frame(FRAME_META, meta))

    def write_samples(self, samples: list[Sample]) -> None:
        if samples:
            payload, t0, t1 = encode_chunk(samples)
            self._write(frame_bytes(FRAME_CHUNK, payload, CODEC_ZLIB, t0, t1))

    def _write(self, frame: bytes) -> None:
        self._f.write(frame)
        self._f.flush()  # into the OS: survives kill -9 of gputop
        self.bytes_written += len(frame)

    def close(self, end: dict | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._f.write(json_frame(FRAME_END, end or {}))
            self._f.flush()
            os.fsync(self._f.fileno())
        finally:
            self._f.close()


class Recorder:
    """Bus subscriber that writes samples to a recording, one chunk per ``flush_s`` seconds.

    Publishing only appends to a list; a writer thread does the I/O so no source ever waits on
    the disk. fsync runs every ``fsync_s`` so a power loss costs at most that much, too.
    """

    def __init__(self, writer: RecordingWriter, flush_s: float = 1.0, fsync_s: float = 10.0):
        self.writer = writer
        self.flush_s = flush_s
        self.fsync_s = fsync_s
        self._pending: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputop-recorder", daemon=True)
        self.error: str | None = None
        self.samples_written = 0

    @property
    def path(self) -> str:
        return self.writer.path

    def start(self) -> None:
        self._thread.start()

    def on_samples(self, samples: list[Sample]) -> None:
        with self._lock:
            self._pending.extend(samples)

    def on_reset(self) -> None:  # a live session never seeks
        pass

    def update_meta(self, meta: dict) -> None:
        with self._lock:
            self._flush_locked()
            if self.error is None:
                try:
                    self.writer.write_meta(meta)
                except OSError as e:
                    self.error = f"recording stopped: {e.strerror}"
                except Exception as e:
                    self.error = f"recording stopped: {type(e).__name__}: {e}"

    def _flush_locked(self) -> None:
        batch, self._pending = self._pending, []
        if not batch or self.error is not None:
            return
        try:
            self.writer.write_samples(batch)
            self.samples_written += len(batch)
        except OSError as e:  # disk full: say so, keep monitoring
            self.error = f"recording stopped: {e.strerror}"
        except Exception as e:  # a sample that cannot be encoded: never kill the writer silently
            self.error = f"recording stopped: {type(e).__name__}: {e}"

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _run(self) -> None:
        last_sync = time.monotonic()
        while not self._stop.wait(self.flush_s):
            self.flush()
            if time.monotonic() - last_sync >= self.fsync_s and self.error is None:
                try:
                    os.fsync(self.writer._f.fileno())
                except OSError:
                    pass
                last_sync = time.monotonic()

    def stop(self, end: dict | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._lock:
            self._flush_locked()
            try:
                self.writer.close(end)
            except OSError as e:
                self.error = f"recording not closed cleanly: {e.strerror}"
