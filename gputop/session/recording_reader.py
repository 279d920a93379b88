"""Reading a recording: an index built from frame headers, chunks read and checked on demand.

A damaged part (a flipped or lost byte, a frame that fails its checksum or cannot be decoded) is
skipped: the reader resynchronises on the next intact frame, lists what it lost in
``index.damaged`` and goes on. Damage at the very end is truncation (a kill, or a file still
being written). Only a file that is not a recording at all, is from a newer major version, or
exceeds the per-file bounds raises RecordingError — always one line.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
from typing import Iterator

from gputop.model import Sample
from gputop.session.recording_format import (
    _FILE_HEADER, _FRAME_HEADER, CHUNK_SLACK_S, CODECS, FORMAT_MAJOR, FORMAT_MINOR, FRAME_CHUNK, FRAME_END,
    FRAME_MARK, FRAME_META, FRAME_SUMMARY, FRAME_TYPES, MAGIC, MAX_CHUNK_SPAN_S, MAX_DAMAGED_PARTS, MAX_FRAME_BYTES,
    MAX_FRAMES_PER_FILE, MAX_VALUES_PER_FILE_BYTE, MIN_VALUES_PER_FILE, ChunkRef, Damage, FrameDamaged,
    RecordingError, RecordingIndex, Series, check_meta, check_summary, crc_ok, decode_payload, samples_of,
    validate_chunk,
)

_HDR = _FRAME_HEADER.size
_WINDOW = 1 << 20          # bytes read at once while scanning
_WHAT = {FRAME_META: "metadata", FRAME_CHUNK: "chunk", FRAME_END: "end", FRAME_SUMMARY: "summary"}


def _magic_nearly(head: bytes) -> bool:
    """The magic with one byte damaged (a flip): still our file if an intact frame follows."""
    return len(head) >= 8 and sum(a != b for a, b in zip(head[:8], MAGIC)) == 1


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
        self._frames = 0
        self._max_t1 = -math.inf      # of the chunks indexed so far: a later one may not start much before
        self._values = 0              # JSON values decoded so far (each chunk counted once)
        self._counted: set[int] = set()
        self._resync_bytes = 0
        self._tail_seen: tuple[int, int] | None = None   # (scanned_to, size) when the end was unreadable
        head = self._f.read(_FILE_HEADER.size)
        if len(head) < _FILE_HEADER.size or (head[:8] != MAGIC and not _magic_nearly(head)):
            self._f.close()
            if len(head) == 0:
                raise RecordingError(f"{path} is empty: not a gputop recording")
            raise RecordingError(f"{path} is not a gputop recording (no gputop header)")
        _, major, minor, _ = _FILE_HEADER.unpack(head)
        self.format_version = (major, minor)
        self.index.scanned_to = _FILE_HEADER.size
        if major > FORMAT_MAJOR and not self._version_damaged(major, minor):
            self._f.close()
            raise RecordingError(
                f"{path} uses recording format {major}.{minor}, newer than this gputop reads "
                f"({FORMAT_MAJOR}.x): upgrade gputop (pip install -U gputop-triage)")
        try:
            self.refresh()
        except RecordingError:
            self._f.close()
            raise
        idx = self.index
        if head[:8] != MAGIC:
            if not idx.has_meta and not idx.chunks:
                self._f.close()
                raise RecordingError(f"{path} is not a gputop recording (no gputop header)")
            idx.damaged.insert(0, Damage(0, 8, "file header", "its magic number is damaged"))
        if not idx.has_meta:
            if not idx.chunks:
                self._f.close()
                if idx.truncated or idx.damaged:
                    raise RecordingError(f"{path} has no readable metadata (cut off or damaged after its header): "
                                         "nothing to read")
                raise RecordingError(f"{path} has no metadata frame: not a complete gputop recording")
            first = next((i for i, d in enumerate(idx.damaged) if d.what != "file header"), None)
            if first is not None and idx.damaged[first].offset <= _FILE_HEADER.size:
                # The writer's first frame is always the metadata: that is what this damage cost.
                idx.damaged[first] = dataclasses.replace(idx.damaged[first], what="metadata")
            elif not any(d.what == "metadata" for d in idx.damaged):
                # Its M frame was damaged in a way that made it look like another frame.
                idx.damaged.insert(0, Damage(_FILE_HEADER.size, 0, "metadata", "missing"))

    def _version_damaged(self, major: int, minor: int) -> bool:
        """The header's version says newer, but the frames after it are ones this gputop reads
        and its metadata names a format it reads: one damaged byte in the header, not a newer
        file (frames of a newer major format do not parse). Keeps the file, names the damage."""
        try:
            self.refresh()
        except RecordingError:
            return False
        fmt = self.index.meta.get("format") if self.index.has_meta else None
        try:
            meta_major = int(str(fmt).split(".", 1)[0])
        except ValueError:
            return False
        if not 0 < meta_major <= FORMAT_MAJOR:
            return False
        self.format_version = (meta_major, minor)
        self.index.damaged.insert(0, Damage(8, 2, "file header",
                                            f"its format version reads {major}.{minor}; the metadata says {fmt}"))
        return True

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def meta(self) -> dict:
        return self.index.meta

    # -- scanning ---------------------------------------------------------------------------
    def _read_at(self, at: int, n: int) -> bytes:
        """``n`` bytes at ``at`` through a window, so scanning many small frames is cheap."""
        w_at, w = self._win
        if not (w_at <= at and at + n <= w_at + len(w)):
            self._f.seek(at)
            w = self._f.read(max(n, _WINDOW))
            self._win = (at, w)
            w_at = at
        return w[at - w_at:at - w_at + n]

    def refresh(self) -> bool:
        """Index frames appended since the last scan (a file still being written). True if new.

        Damage at the end of the file — a frame cut short, or garbage after the last good frame
        (a power loss can leave zeros there) — counts as truncation: everything before it is
        kept, and a later refresh looks there again. Damage with an intact frame after it is
        skipped and listed in ``index.damaged``."""
        idx = self.index
        pos = idx.scanned_to
        size = os.fstat(self._f.fileno()).st_size
        if idx.truncated and self._tail_seen == (pos, size):
            # nothing appended since the unreadable end was scanned: a replay that follows a file
            # refreshes every tick, and scanning 4 M unknown frames again each time took 64% of a core
            return False
        self._win = (0, b"")
        found = False
        idx.truncated, idx.tail = False, None
        while pos < size:
            if size - pos < _HDR:
                idx.truncated = True
                break
            mark, ftype, codec, length, crc, t0, t1 = _FRAME_HEADER.unpack(self._read_at(pos, _HDR))
            problem = None   # (what was lost, why)
            what = _WHAT.get(ftype, "frame")
            if mark != FRAME_MARK:
                problem = ("frame", "has no frame marker")
            elif length > MAX_FRAME_BYTES:
                problem = ("frame", f"claims {length} bytes")
            elif pos + _HDR + length > size:
                if self._next_good_frame(pos + 1, size) is None:
                    idx.truncated = True  # killed mid-write, or still being written
                    break
                problem = (what, "runs past the end of the file")
            elif not crc_ok(self._read_at(pos + _HDR, length), crc, t0, t1):
                problem = (what, "fails its checksum")
            elif ftype not in FRAME_TYPES:
                # Newer minor versions may add frames that old readers skip; in a file of a
                # minor version we know, an unknown type is a damaged type byte.
                if self.format_version[1] <= FORMAT_MINOR:
                    problem = ("frame", f"has an unknown type {ftype!r}")
            elif codec not in CODECS:
                problem = (what, "has an unknown codec")
            elif ftype == FRAME_CHUNK:
                problem = self._index_chunk(pos, length, t0, t1)
            elif t0 != 0.0 or t1 != 0.0:
                # The writer gives M and E frames no times (and times are checksummed): this is a
                # chunk whose type byte was damaged.
                problem = ("chunk", "has a damaged type byte")
            elif ftype == FRAME_SUMMARY:
                idx.summaries.append(ChunkRef(pos, length, 0.0, 0.0))  # decoded when read
            else:
                try:
                    obj = decode_payload(codec, self._read_at(pos + _HDR, length))
                    check_meta(obj)
                except FrameDamaged as e:
                    problem = (what, str(e))
                else:
                    if ftype == FRAME_META:
                        idx.meta.update(obj)
                        idx.has_meta = True
                    else:
                        idx.end = obj
            if problem is not None:
                nxt = self._next_good_frame(pos + 1 if pos > _FILE_HEADER.size else 8, size, pos + _HDR + length)
                if nxt == pos:
                    # the search from the file's start (for a header a byte short) found this
                    # very frame again, its checksum true and its content not: look after it,
                    # or this loop spins until the resync budget refuses the file (2-19 s for a
                    # 700-byte file, found by hypothesis)
                    nxt = self._next_good_frame(pos + 1, size)
                if nxt is None:
                    idx.truncated = True  # damage at the end only: keep everything before it
                    idx.tail = Damage(pos, size - pos, problem[0], problem[1],
                                      max((c.t1 for c in idx.chunks[-1:]), default=None))
                    break
                self._note_damage(pos, max(nxt - pos, 0), *problem)
                pos = nxt
                idx.scanned_to = pos
                continue
            self._frames += 1
            if self._frames > MAX_FRAMES_PER_FILE:
                raise RecordingError(f"{self.path} has more than {MAX_FRAMES_PER_FILE} frames: "
                                     "not a recording gputop writes; refusing")
            pos += _HDR + length
            idx.scanned_to = pos
            found = True
        self._win = (0, b"")
        self._tail_seen = (idx.scanned_to, size) if idx.truncated else None
        return found

    def _index_chunk(self, pos: int, length: int, t0: float, t1: float):
        if not (math.isfinite(t0) and math.isfinite(t1) and t0 <= t1):
            return ("chunk", "has impossible times")
        if t1 - t0 > MAX_CHUNK_SPAN_S:
            return ("chunk", f"claims to span {t1 - t0:.3g} s")
        if t0 < self._max_t1 - CHUNK_SLACK_S:
            return ("chunk", "is out of time order")
        idx = self.index
        idx.chunks.append(ChunkRef(pos, length, t0, t1))
        self._max_t1 = max(self._max_t1, t1)
        if idx.damaged and idx.damaged[-1].t1 is None:
            idx.damaged[-1] = dataclasses.replace(idx.damaged[-1], t1=t0)
        return None

    def _note_damage(self, offset: int, length: int, what: str, reason: str, t1: float | None = None) -> None:
        idx = self.index
        prev = idx.damaged[-1] if idx.damaged else None
        if prev is not None and prev.offset + prev.length == offset and prev.reason == reason and prev.what == what:
            idx.damaged[-1] = dataclasses.replace(prev, length=prev.length + length)  # one run of damage
            return
        if len(idx.damaged) >= MAX_DAMAGED_PARTS:
            raise RecordingError(f"{self.path} is damaged in more than {MAX_DAMAGED_PARTS} places: "
                                 "beyond repair")
        t0 = max((c.t1 for c in idx.chunks[-1:]), default=None)
        idx.damaged.append(Damage(offset, length, what, reason, t0, t1))

    def _next_good_frame(self, start: int, size: int, hint: int | None = None) -> int | None:
        """The offset of the first intact frame (marker, known type and codec, length inside the
        file, matching checksum) at or after ``start``, looking at most one maximal frame
        further; ``hint`` (where the damaged frame says it ends) is tried first, then only the
        bytes before it: the damaged part may be that frame's length, and an intact frame before
        where it says it ends comes first. Checksumming candidates is bounded per file, so a
        file of fake frame headers cannot take minutes."""
        if hint is not None and start <= hint < size and self._frame_ok_at(hint, size):
            early = self._scan_for_frame(start, size, until=hint)
            return early if early is not None else hint
        return self._scan_for_frame(start, size)

    def _scan_for_frame(self, start: int, size: int, until: int | None = None) -> int | None:
        """The first intact frame starting in [start, until) (until: one maximal frame on)."""
        self._f.seek(start)
        data = self._f.read(min(size - start, MAX_FRAME_BYTES + 2 * _HDR))
        i = data.find(FRAME_MARK)
        while i >= 0 and (until is None or start + i < until):
            hdr = data[i:i + _HDR]
            if len(hdr) == _HDR:
                _, ftype, codec, length, crc, t0, t1 = _FRAME_HEADER.unpack(hdr)
                end = i + _HDR + length
                if ftype in FRAME_TYPES and codec in CODECS and end <= len(data):
                    self._spend_resync(length)
                    if crc_ok(data[i + _HDR:end], crc, t0, t1):
                        return start + i
            i = data.find(FRAME_MARK, i + 1)
        return None

    def _frame_ok_at(self, at: int, size: int) -> bool:
        self._f.seek(at)
        hdr = self._f.read(_HDR)
        if len(hdr) < _HDR:
            return False
        mark, ftype, codec, length, crc, t0, t1 = _FRAME_HEADER.unpack(hdr)
        if mark != FRAME_MARK or ftype not in FRAME_TYPES or codec not in CODECS or at + _HDR + length > size:
            return False
        self._spend_resync(length)
        return crc_ok(self._f.read(length), crc, t0, t1)

    def _spend_resync(self, n: int) -> None:
        self._resync_bytes += n
        if self._resync_bytes > 8 * os.fstat(self._f.fileno()).st_size + (1 << 24):
            raise RecordingError(f"{self.path} is damaged beyond repair (no intact frames where expected)")

    # -- chunks -----------------------------------------------------------------------------
    def _read_frame(self, ref: ChunkRef) -> tuple[bytes, bytes, float, float]:
        """The frame at ``ref``: its codec, its checked payload and its time span; FrameDamaged
        if it is cut short or fails its checksum (chunks and summaries alike)."""
        self._f.seek(ref.offset)
        hdr = self._f.read(_HDR)
        if len(hdr) < _HDR:
            raise FrameDamaged("is cut short")
        _, _, codec, length, crc, t0, t1 = _FRAME_HEADER.unpack(hdr)
        payload = self._f.read(length)
        if len(payload) != length:
            raise FrameDamaged("is cut short")
        if not crc_ok(payload, crc, t0, t1):
            raise FrameDamaged("fails its checksum")
        return codec, payload, t0, t1

    def read_chunk(self, ref: ChunkRef) -> list[Sample]:
        return samples_of(self.read_series(ref))

    def read_series(self, ref: ChunkRef) -> list[Series]:
        """One chunk, validated, in its columnar form (cheap to aggregate without Samples).
        A chunk that cannot be used gives no series and is listed in ``index.damaged``."""
        if ref.offset in self.index.bad_chunks:
            return []
        try:
            codec, payload, t0, t1 = self._read_frame(ref)
            obj = decode_payload(codec, payload)
            if ref.offset not in self._counted:
                self._count_values(ref.offset, payload, obj)
            return validate_chunk(obj, t0, t1)
        except FrameDamaged as e:
            self._chunk_damaged(ref, str(e))
            return []

    def _count_values(self, offset: int, payload: bytes, obj) -> None:
        """Per file, chunks may hold only so many values for the file's size: what reading a
        file costs stays in proportion to its size, however its frames are cut."""
        self._counted.add(offset)
        series = obj.get("series") if isinstance(obj, dict) else None
        n = sum(len(e[2]) * (1 + len(e[3])) for e in series
                if isinstance(e, list) and len(e) == 4 and isinstance(e[2], list) and isinstance(e[3], dict)) \
            if isinstance(series, list) else 0
        self._values += n
        size = os.fstat(self._f.fileno()).st_size
        if self._values > MIN_VALUES_PER_FILE + MAX_VALUES_PER_FILE_BYTE * size:
            raise RecordingError(f"{self.path} holds more samples than a file of its size can: "
                                 "not a recording gputop writes; refusing")

    def _chunk_damaged(self, ref: ChunkRef, reason: str) -> None:
        idx = self.index
        idx.bad_chunks.add(ref.offset)
        good = idx.good_chunks()
        i = bisect.bisect_left([c.offset for c in good], ref.offset)
        t0 = good[i - 1].t1 if i > 0 else None
        t1 = good[i].t0 if i < len(good) else None
        if len(idx.damaged) >= MAX_DAMAGED_PARTS:
            raise RecordingError(f"{self.path} is damaged in more than {MAX_DAMAGED_PARTS} places: beyond repair")
        bisect.insort(idx.damaged, Damage(ref.offset, _HDR + ref.length, "chunk", reason, t0, t1),
                      key=lambda d: d.offset)

    def read_summary(self, ref: ChunkRef) -> dict | None:
        """One summary frame's payload, checked; None (and listed in ``index.damaged``) if it
        cannot be used: the report then reads the samples instead."""
        try:
            codec, payload, _, _ = self._read_frame(ref)
            return check_summary(decode_payload(codec, payload))
        except FrameDamaged as e:
            if len(self.index.damaged) < MAX_DAMAGED_PARTS:
                bisect.insort(self.index.damaged, Damage(ref.offset, _HDR + ref.length, "summary", str(e)),
                              key=lambda d: d.offset)
            return None

    def chunks_between(self, t_from: float, t_to: float) -> list[ChunkRef]:
        chunks = self.index.chunks
        if len(self._t0s) != len(chunks):
            self._t0s = [c.t0 for c in chunks]
        # Chunks are in time order, give or take samples that arrived a little late (the index
        # refuses chunks further out of order), so a binary search with a few seconds of slack
        # finds the candidates without a scan of a long file.
        lo = bisect.bisect_left(self._t0s, t_from - CHUNK_SLACK_S)
        hi = bisect.bisect_right(self._t0s, t_to)
        bad = self.index.bad_chunks
        return [c for c in chunks[lo:hi] if c.t1 >= t_from and c.offset not in bad]

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


def _mmss(t: float | None) -> str:
    if t is None or not math.isfinite(t):
        return "?"
    t = max(t, 0.0)
    if t < 3600:
        return f"{int(t // 60)}:{int(t % 60):02d}"
    return f"{int(t // 3600)}:{int(t % 3600 // 60):02d}:{int(t % 60):02d}"


def damage_line(index: RecordingIndex) -> str | None:
    """What the reader skipped, in one line (None when nothing was): for the report and replay."""
    parts = index.damaged
    tail = index.tail
    if not parts:
        return tail_line(index)
    d = parts[0]
    span = f" ({_mmss(d.t0)}-{_mmss(d.t1)})" if d.t0 is not None or d.t1 is not None else ""
    # (the metadata may be one of several damaged parts: a byte that breaks its frame can make the
    # next bytes read as a damaged chunk too)
    meta_lost = any(p.what in ("metadata", "file header") for p in parts) and not index.has_meta
    lost = ": target, host and sources unknown" if meta_lost else ""
    if len(parts) == 1:
        line = f"1 {d.what} damaged at byte {d.offset}{span}: skipped{lost}"
    else:
        total = sum(p.length for p in parts)
        line = f"{len(parts)} parts damaged ({total} bytes; the first at byte {d.offset}{span}): skipped{lost}"
    return line + (f"; {tail_line(index)}" if tail is not None else "")


def tail_line(index: RecordingIndex) -> str | None:
    """The unreadable end of a file in words (None: it has none, or it was cut inside a frame)."""
    t = index.tail
    if t is None:
        return None
    what = "its end frame" if t.what == "end" else f"the {t.length} bytes after its last good frame"
    return f"{what} at byte {t.offset} cannot be read ({t.what} {t.reason}): ignored"
