"""A damaged file header and an unreadable end (issue 32): one byte in the 16-byte header loses
nothing but is named; bytes after the last good frame that cannot be read are scanned once,
named, and never read as "gputop was killed"."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from gputop.session.recording_format import _FILE_HEADER, _FRAME_HEADER, frame_bytes
from gputop.session.recording_reader import RecordingReader

SRC = pathlib.Path(__file__).resolve().parent / "data" / "h200" / "input_bound.gtrec"


def _chunks(path) -> int:
    with RecordingReader(str(path)) as r:
        return len(r.index.good_chunks())


def test_any_single_byte_of_the_header_loses_nothing(tmp_path):
    data = SRC.read_bytes()
    want = _chunks(SRC)
    p = tmp_path / "h.gtrec"
    for off in range(_FILE_HEADER.size):
        for val in (0x00, 0xFF, data[off] ^ 0x40):
            if val == data[off]:
                continue
            d = bytearray(data)
            d[off] = val
            p.write_bytes(bytes(d))
            with RecordingReader(str(p)) as r:
                assert len(r.index.good_chunks()) == want, (off, val)
                if off in (8, 9) and val != 0 and d[8] | (d[9] << 8) > 1:   # the major version, now "newer"
                    assert r.index.damaged[0].what == "file header"
                    assert "metadata says" in r.index.damaged[0].reason


def test_a_newer_major_version_is_still_refused(tmp_path):
    """A file whose metadata says a newer format too is a newer file, not a damaged header."""
    import struct

    from gputop.session.recording_format import FORMAT_MAJOR, FRAME_META, MAGIC, json_frame

    p = tmp_path / "newer.gtrec"
    p.write_bytes(MAGIC + struct.pack("<HHI", FORMAT_MAJOR + 1, 0, 0)
                  + json_frame(FRAME_META, {"format": f"{FORMAT_MAJOR + 1}.0"}))
    out = subprocess.run([sys.executable, "-m", "gputop", "report", str(p)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "newer than this gputop reads" in out.stderr


def _count_scans(reader) -> list:
    calls = []
    orig = reader._next_good_frame

    def counting(*a, **kw):
        calls.append(a)
        return orig(*a, **kw)

    reader._next_good_frame = counting
    return calls


def test_an_unreadable_end_is_scanned_once_and_named(tmp_path):
    data = SRC.read_bytes()
    junk = tmp_path / "junk.gtrec"
    junk.write_bytes(data + frame_bytes(b"X", b"z" * 8) * 20000)   # frames of no known type
    with RecordingReader(str(junk)) as r:
        assert r.index.truncated and r.index.tail is not None and r.index.tail.offset == len(data)
        calls = _count_scans(r)
        for _ in range(5):       # a replay following the file refreshes every tick
            assert r.refresh() is False
        assert calls == []       # (it searched again each time: 64% of a core for 4 M frames)
        with open(junk, "ab") as f:
            f.write(os.urandom(100))
        r.refresh()              # the file grew: looked at again
        assert calls
    rep = json.loads(subprocess.run([sys.executable, "-m", "gputop", "report", str(junk), "--json"],
                                    capture_output=True, text=True, timeout=60).stdout)
    assert rep["session"]["unreadable_end"]["offset"] == len(data)
    assert "cannot be read" in rep["session"]["damage"]
    text = subprocess.run([sys.executable, "-m", "gputop", "report", str(junk)], capture_output=True, text=True,
                          timeout=60).stdout
    assert "gputop was killed" not in text and "cannot be read" in text


def test_a_damaged_end_frame_is_named(tmp_path):
    data = SRC.read_bytes()
    with RecordingReader(str(SRC)) as r:
        assert r.index.end is not None
    # the end frame is the file's last frame: hit a byte of its payload
    pos, last = _FILE_HEADER.size, None
    while pos < len(data):
        last = pos
        pos += _FRAME_HEADER.size + _FRAME_HEADER.unpack(data[pos:pos + _FRAME_HEADER.size])[3]
    d = bytearray(data)
    d[last + _FRAME_HEADER.size + 2] ^= 0xFF
    p = tmp_path / "end.gtrec"
    p.write_bytes(bytes(d))
    with RecordingReader(str(p)) as r:
        assert r.index.end is None and r.index.tail is not None and r.index.tail.what == "end"
    text = subprocess.run([sys.executable, "-m", "gputop", "report", str(p)], capture_output=True, text=True,
                          timeout=60).stdout
    assert "its end frame" in text and "gputop was killed" not in text
