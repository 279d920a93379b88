"""The recording file: an append-only sequence of checksummed frames.

Why this format (docs/architecture.md has the longer story):
- **Crash-safe by construction.** Frames are only ever appended; the recorder writes one chunk
  frame per second and flushes it, so ``kill -9`` of gputop loses at most the last second. A
  frame cut short by the kill is detected (length + CRC) and dropped by the reader.
- **One file.** Nothing beside it (no journal, no WAL) to forget when handing it to a colleague.
- **Readable while written.** A reader scans frames up to the last complete one and can look
  again later for more (``RecordingReader.refresh``).
- **Safe to open.** Data is zlib-compressed JSON, decoded with ``json.loads`` and validated;
  nothing in a file is ever executed. Sizes are bounded before anything is allocated.
- **Seekable.** Each chunk frame carries its first and last sample time in its header, so an
  index of a one-hour file is built by hopping from header to header without decompressing.

Layout::

    file   := MAGIC(8) major(u16) minor(u16) reserved(u32)  frame*
    frame  := b"GF" type(1) codec(1) length(u32) crc32(u32) t0(f64) t1(f64)  payload[length]
    type   := b"M" metadata (JSON object; later M frames add/override keys)
            | b"C" chunk of samples (JSON, columnar per series)
            | b"E" end of session (JSON object; written on a clean stop)
    codec  := 0 plain JSON | 1 zlib-compressed JSON
    crc32  := zlib.crc32 over t0, t1 and the payload

Chunk payload::

    {"series": [[kind, key, [t, ...], {field: [value, ...], ...}], ...]}

All integers little-endian. Major version bumps when an old reader could not read new files.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Iterator

from gputop.model import Sample

MAGIC = b"\x89GTREC\r\n"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0
_FILE_HEADER = struct.Struct("<8sHHI")
_FRAME_HEADER = struct.Struct("<2sccIIdd")
FRAME_MARK = b"GF"
FRAME_META, FRAME_CHUNK, FRAME_END = b"M", b"C", b"E"
CODEC_JSON, CODEC_ZLIB = b"\x00", b"\x01"

MAX_FRAME_BYTES = 64 * 1024 * 1024      # no honest frame is this big: refuse before allocating
MAX_DECODED_BYTES = 256 * 1024 * 1024   # zlib bomb guard
MAX_STRING = 1 << 20
CHUNK_SLACK_S = 10.0   # how far out of time order a chunk's first sample may be (late publishers)


class RecordingError(Exception):
    """A recording cannot be read. The message is one line for the user: what and what to do."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    offset: int      # of the frame header
    length: int      # payload length
    t0: float
    t1: float


@dataclass
class RecordingIndex:
    meta: dict = field(default_factory=dict)
    chunks: list[ChunkRef] = field(default_factory=list)
    end: dict | None = None            # the E frame's data when the session stopped cleanly
    truncated: bool = False            # the file ends inside a frame (killed, or still being written)
    has_meta: bool = False
    scanned_to: int = 0                # offset after the last complete frame

    @property
    def t_start(self) -> float:
        return self.chunks[0].t0 if self.chunks else 0.0

    @property
    def t_end(self) -> float:
        return max((c.t1 for c in self.chunks), default=0.0)


# ---------------------------------------------------------------------------------------------
# Encoding


def _finite(v):
    """Replace NaN/inf (which JSON cannot hold) by None, recursively."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    return v


def encode_chunk(samples: list[Sample]) -> tuple[bytes, float, float]:
    """Samples -> (payload, t0, t1). Columnar per (kind, key): compresses about 5-10x better."""
    groups: dict[tuple[str, str], tuple[list, dict]] = {}
    for s in samples:
        g = groups.get((s.kind, s.key))
        if g is None:
            g = groups[(s.kind, s.key)] = ([], {})
        ts, cols = g
        n = len(ts)
        ts.append(round(s.t, 4))
        for name, v in s.data.items():
            col = cols.get(name)
            if col is None:
                col = cols[name] = [None] * n
            col.append(v)
        for col in cols.values():
            if len(col) < n + 1:
                col.append(None)
    series = [[kind, key, ts, cols] for (kind, key), (ts, cols) in groups.items()]
    try:
        text = json.dumps({"series": series}, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps({"series": _finite(series)}, separators=(",", ":"), allow_nan=False)
    t0 = min(s.t for s in samples)
    t1 = max(s.t for s in samples)
    return zlib.compress(text.encode(), 6), t0, t1


def _frame(ftype: bytes, payload: bytes, codec: bytes = CODEC_ZLIB, t0: float = 0.0, t1: float = 0.0) -> bytes:
    crc = zlib.crc32(struct.pack("<dd", t0, t1) + payload)
    return _FRAME_HEADER.pack(FRAME_MARK, ftype, codec, len(payload), crc, t0, t1) + payload


def _json_frame(ftype: bytes, obj: dict) -> bytes:
    return _frame(ftype, zlib.compress(json.dumps(_finite(obj), allow_nan=False).encode(), 6))


class RecordingWriter:
    """Appends frames to a new file. Not thread-safe: the Recorder owns it on one thread."""

    def __init__(self, path: str, meta: dict):
        self.path = path
        try:
            # "x": never overwrite somebody's recording.
            self._f = open(path, "xb", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            raise RecordingError(f"{path} already exists: choose another --record file or remove it") from None
        except OSError as e:
            raise RecordingError(f"cannot create {path}: {e.strerror}") from None
        self._f.write(_FILE_HEADER.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0))
        self._f.write(_json_frame(FRAME_META, meta))
        self._f.flush()
        self.bytes_written = self._f.tell()
        self.closed = False

    def write_meta(self, meta: dict) -> None:
        self._write(_json_frame(FRAME_META, meta))

    def write_samples(self, samples: list[Sample]) -> None:
        if samples:
            payload, t0, t1 = encode_chunk(samples)
            self._write(_frame(FRAME_CHUNK, payload, CODEC_ZLIB, t0, t1))

    def _write(self, frame: bytes) -> None:
        self._f.write(frame)
        self._f.flush()  # into the OS: survives kill -9 of gputop
        self.bytes_written += len(frame)

    def close(self, end: dict | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._f.write(_json_frame(FRAME_END, end or {}))
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


# ---------------------------------------------------------------------------------------------
# Reading


def _decode_payload(codec: bytes, payload: bytes, where: str):
    if codec == CODEC_ZLIB:
        d = zlib.decompressobj()
        try:
            raw = d.decompress(payload, MAX_DECODED_BYTES)
        except zlib.error:
            raise RecordingError(f"{where}: compressed data is damaged; the file is corrupted") from None
        if d.unconsumed_tail:
            raise RecordingError(f"{where}: decompresses to more than {MAX_DECODED_BYTES >> 20} MiB; refusing")
    elif codec == CODEC_JSON:
        raw = payload
    else:
        raise RecordingError(f"{where}: unknown codec {codec!r}; the file is corrupted or from a newer gputop")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RecordingError(f"{where}: not valid JSON; the file is corrupted") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed in a recording")


_SCALARS = (type(None), bool, int, float, str)


def _check_value(v, depth: int = 0) -> bool:
    if isinstance(v, _SCALARS):
        return not (isinstance(v, str) and len(v) > MAX_STRING)
    if depth > 6:
        return False
    if isinstance(v, list):
        return all(_check_value(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _check_value(x, depth + 1) for k, x in v.items())
    return False


Series = tuple  # (kind: str, key: str, ts: list[float], cols: dict[str, list])


def validate_chunk(obj, where: str = "chunk") -> list[Series]:
    """Check a decoded chunk's structure; return its columnar series."""
    bad = RecordingError(f"{where}: unexpected structure; the file is corrupted or not a gputop recording")
    if not isinstance(obj, dict) or not isinstance(obj.get("series"), list):
        raise bad
    out: list[Series] = []
    for entry in obj["series"]:
        if not (isinstance(entry, list) and len(entry) == 4):
            raise bad
        kind, key, ts, cols = entry
        if not (isinstance(kind, str) and isinstance(key, str) and isinstance(ts, list) and isinstance(cols, dict)):
            raise bad
        n = len(ts)
        for t in ts:
            if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
                raise bad
        for name, col in cols.items():
            # Values need no further check: json.loads only makes JSON types, NaN/Infinity are
            # refused while parsing (_reject_constant), and depth and size are bounded there.
            if not isinstance(name, str) or not isinstance(col, list) or len(col) != n:
                raise bad
        out.append((kind, key, ts, cols))
    return out


def samples_of(series: list[Series]) -> list[Sample]:
    """Columnar series -> samples sorted by time."""
    out: list[Sample] = []
    for kind, key, ts, cols in series:
        names = list(cols)
        columns = [cols[c] for c in names]
        for i in range(len(ts)):
            out.append(Sample(float(ts[i]), kind, key, {name: col[i] for name, col in zip(names, columns)}))
    out.sort(key=lambda s: s.t)
    return out




class RecordingReader:
    """Reads a recording. ``open`` validates the header and indexes frames; chunks are read and
    checked on demand. Every problem surfaces as one RecordingError with a line for the user."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._f = open(path, "rb")
        except FileNotFoundError:
            raise RecordingError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise RecordingError(f"{path} is a directory, not a gputop recording") from None
        except PermissionError:
            raise RecordingError(f"{path}: permission denied") from None
        except OSError as e:
            raise RecordingError(f"{path}: cannot open ({e.strerror})") from None
        self.index = RecordingIndex()
        self._t0s: list[float] = []
        self._last_checked = -1
        head = self._f.read(_FILE_HEADER.size)
        if len(head) < _FILE_HEADER.size or head[:8] != MAGIC:
            self._f.close()
            if len(head) == 0:
                raise RecordingError(f"{path} is empty: not a gputop recording")
            raise RecordingError(f"{path} is not a gputop recording (no gputop header)")
        _, major, minor, _ = _FILE_HEADER.unpack(head)
        self.format_version = (major, minor)
        if major > FORMAT_MAJOR:
            self._f.close()
            raise RecordingError(
                f"{path} uses recording format {major}.{minor}, newer than this gputop reads "
                f"({FORMAT_MAJOR}.x): upgrade gputop (pip install -U gputop-triage)")
        self.index.scanned_to = _FILE_HEADER.size
        try:
            self.refresh()
        except RecordingError:
            self._f.close()
            raise
        if not self.index.has_meta:
            self._f.close()
            if self.index.truncated:
                raise RecordingError(f"{path} has no readable metadata (cut off or damaged after its header): "
                                     "nothing to read")
            raise RecordingError(f"{path} has no metadata frame: not a complete gputop recording")

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def meta(self) -> dict:
        return self.index.meta

    def refresh(self) -> bool:
        """Index frames appended since the last scan (a file still being written). True if new.

        Damage at the end of the file — a frame cut short, or garbage after the last good frame
        (a power loss can leave zeros there) — counts as truncation: everything before it is
        kept. Damage with good frames after it is corruption and raises RecordingError."""
        idx = self.index
        f = self._f
        pos = idx.scanned_to
        size = os.fstat(f.fileno()).st_size
        found = False
        idx.truncated = False
        while pos < size:
            if size - pos < _FRAME_HEADER.size:
                idx.truncated = True
                break
            f.seek(pos)
            hdr = f.read(_FRAME_HEADER.size)
            mark, ftype, codec, length, crc, t0, t1 = _FRAME_HEADER.unpack(hdr)
            where = f"{self.path}: frame at byte {pos}"
            try:
                if mark != FRAME_MARK:
                    raise RecordingError(f"{where} has no frame marker; the file is corrupted")
                if length > MAX_FRAME_BYTES:
                    raise RecordingError(f"{where} claims {length} bytes; the file is corrupted")
                if pos + _FRAME_HEADER.size + length > size:
                    idx.truncated = True  # killed mid-write, or still being written
                    break
                if ftype == FRAME_CHUNK:
                    if not (math.isfinite(t0) and math.isfinite(t1) and t0 <= t1):
                        raise RecordingError(f"{where} has impossible times; the file is corrupted")
                    idx.chunks.append(ChunkRef(pos, length, t0, t1))
                elif ftype in (FRAME_META, FRAME_END):
                    payload = f.read(length)
                    self._check_crc(payload, crc, t0, t1, where)
                    obj = _decode_payload(codec, payload, where)
                    if not isinstance(obj, dict) or not _check_value(obj):
                        raise RecordingError(f"{where}: metadata is not an object; the file is corrupted")
                    if ftype == FRAME_META:
                        idx.meta.update(obj)
                        idx.has_meta = True
                    else:
                        idx.end = obj
                # Frame types unknown to this minor version are skipped: newer minor versions may
                # add frames that old readers can ignore.
            except RecordingError:
                if self._good_frame_after(pos + 1, size):
                    raise
                idx.truncated = True  # damage at the end only: keep everything before it
                break
            pos += _FRAME_HEADER.size + length
            idx.scanned_to = pos
            found = True
        self._check_last_chunk()
        return found

    def _check_last_chunk(self) -> None:
        """The last chunk is the one a crash may have damaged: check it now (the others are
        checked when read) and drop it, as truncation, if its checksum fails."""
        chunks = self.index.chunks
        if not chunks or chunks[-1].offset == self._last_checked:
            return
        ref = chunks[-1]
        self._f.seek(ref.offset)
        _, _, _, length, crc, t0, t1 = _FRAME_HEADER.unpack(self._f.read(_FRAME_HEADER.size))
        payload = self._f.read(length)
        if len(payload) != length or zlib.crc32(struct.pack("<dd", t0, t1) + payload) != crc:
            chunks.pop()
            self.index.truncated = True
        else:
            self._last_checked = ref.offset

    def _good_frame_after(self, start: int, size: int) -> bool:
        """Is there an intact frame (marker, known type and codec, length inside the file,
        matching checksum) anywhere after ``start``? Looks at most 64 MiB further."""
        f = self._f
        f.seek(start)
        data = f.read(min(size - start, MAX_FRAME_BYTES))
        i = data.find(FRAME_MARK)
        while i >= 0:
            hdr = data[i:i + _FRAME_HEADER.size]
            if len(hdr) == _FRAME_HEADER.size:
                _, ftype, codec, length, crc, t0, t1 = _FRAME_HEADER.unpack(hdr)
                end = i + _FRAME_HEADER.size + length
                if ftype in (FRAME_META, FRAME_CHUNK, FRAME_END) and codec in (CODEC_JSON, CODEC_ZLIB) \
                        and end <= len(data):
                    payload = data[i + _FRAME_HEADER.size:end]
                    if zlib.crc32(struct.pack("<dd", t0, t1) + payload) == crc:
                        return True
            i = data.find(FRAME_MARK, i + 1)
        return False

    @staticmethod
    def _check_crc(payload: bytes, crc: int, t0: float, t1: float, where: str) -> None:
        if zlib.crc32(struct.pack("<dd", t0, t1) + payload) != crc:
            raise RecordingError(f"{where} fails its checksum; the file is corrupted")

    def read_chunk(self, ref: ChunkRef) -> list[Sample]:
        return samples_of(self.read_series(ref))

    def read_series(self, ref: ChunkRef) -> list[Series]:
        """One chunk, validated, in its columnar form (cheap to aggregate without Samples)."""
        self._f.seek(ref.offset)
        hdr = self._f.read(_FRAME_HEADER.size)
        _, _, codec, length, crc, t0, t1 = _FRAME_HEADER.unpack(hdr)
        payload = self._f.read(length)
        where = f"{self.path}: chunk at byte {ref.offset}"
        if len(payload) != length:
            raise RecordingError(f"{where} is cut short; the file is corrupted")
        self._check_crc(payload, crc, t0, t1, where)
        return validate_chunk(_decode_payload(codec, payload, where), where)

    def chunks_between(self, t_from: float, t_to: float) -> list[ChunkRef]:
        chunks = self.index.chunks
        if len(self._t0s) != len(chunks):
            self._t0s = [c.t0 for c in chunks]
        # Chunks are in time order, give or take samples that arrived a little late, so a binary
        # search with a few seconds of slack finds the candidates without a scan of a long file.
        lo = bisect.bisect_left(self._t0s, t_from - CHUNK_SLACK_S)
        hi = bisect.bisect_right(self._t0s, t_to)
        return [c for c in chunks[lo:hi] if c.t1 >= t_from]

    def samples(self, t_from: float = -math.inf, t_to: float = math.inf) -> Iterator[Sample]:
        """Samples with t_from <= t <= t_to, in time order (chunks may overlap slightly)."""
        refs = self.chunks_between(t_from, t_to)
        # Chunks are written in time order but a late sample may land one chunk later; merge a
        # small look-behind so consumers always see time order.
        pending: list[Sample] = []
        for ref in refs:
            got = [s for s in self.read_chunk(ref) if t_from <= s.t <= t_to]
            pending.extend(got)
            pending.sort(key=lambda s: s.t)
            cut = ref.t0  # nothing later in the file is older than this chunk's t0 minus the slack
            i = 0
            while i < len(pending) and pending[i].t < cut - CHUNK_SLACK_S:
                i += 1
            yield from pending[:i]
            pending = pending[i:]
        yield from pending

    def all_samples(self) -> list[Sample]:
        return list(self.samples())
