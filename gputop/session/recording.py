"""The recording file: an append-only sequence of checksummed frames.

Why this format (docs/architecture.md has the longer story):
- **Crash-safe by construction.** Frames are only ever appended; the recorder writes one chunk
  frame per second and flushes it, so ``kill -9`` of gputop loses at most the last second. A
  frame cut short by the kill is detected (length + CRC) and dropped by the reader.
- **One file.** Nothing beside it (no journal, no WAL) to forget when handing it to a colleague.
- **Readable while written.** A reader scans frames up to the last complete one and can look
  again later for more (``RecordingReader.refresh``).
- **Safe to open.** Data is zlib-compressed JSON, decoded with ``json.loads`` and validated;
  nothing in a file is ever executed. What a file can cost is bounded before anything is
  allocated (recording_format.py: frame and inflated sizes, values, samples, depth, strings,
  frames per file), so a hostile file costs a small multiple of its size and ends in one line.
- **Damage costs only what is damaged.** A frame that fails its checksum or cannot be decoded is
  skipped: the reader resynchronises on the next intact frame and lists the loss (byte offset,
  length, time span) in ``RecordingIndex.damaged``.
- **Seekable.** Each chunk frame carries its first and last sample time in its header, so an
  index of a one-hour file is built by hopping from header to header without decompressing.

Layout::

    file   := MAGIC(8) major(u16) minor(u16) reserved(u32)  frame*
    frame  := b"GF" type(1) codec(1) length(u32) crc32(u32) t0(f64) t1(f64)  payload[length]
    type   := b"M" metadata (JSON object; later M frames add/override keys)
            | b"C" chunk of samples (JSON, columnar per series)
            | b"S" summary of the chunks since the previous S (format 1.1; JSON object:
                  verdicts/recording_summary.py; a 1.0 reader skips it)
            | b"E" end of session (JSON object; written on a clean stop)
    codec  := 0 plain JSON | 1 zlib-compressed JSON
    crc32  := zlib.crc32 over t0, t1 and the payload
    t0, t1 := a chunk's first and last sample time (checked against its samples when read);
              0, 0 for M, S and E frames

Chunk payload::

    {"series": [[kind, key, [t, ...], {field: [value, ...], ...}], ...]}

All integers little-endian. Major version bumps when an old reader could not read new files.
"""

from __future__ import annotations

# The format, the reader and the writer live in three modules; this one is the public face.
from gputop.session.recorder import (  # noqa: F401
    CHUNK_SAMPLES, MAX_QUEUED_SAMPLES, Recorder, RecordingWriter,
)
from gputop.session.recording_format import (  # noqa: F401
    _FILE_HEADER, _FRAME_HEADER, CHUNK_SLACK_S, CODEC_JSON, CODEC_ZLIB, FORMAT_MAJOR, FORMAT_MINOR, FRAME_CHUNK,
    FRAME_END, FRAME_MARK, FRAME_META, MAGIC, MAX_CHUNK_SPAN_S, MAX_DECODED_BYTES, MAX_DEPTH, MAX_FRAME_BYTES,
    MAX_FRAMES_PER_FILE, MAX_SAMPLES_PER_CHUNK, MAX_STRING, MAX_VALUES_PER_CHUNK, ChunkRef, Damage, RecordingError,
    RecordingIndex, Series, samples_of, validate_chunk,
)
from gputop.session.recording_reader import RecordingReader, damage_line  # noqa: F401
