"""Hostile recordings (issue 13): what a file can cost is bounded, and it ends in one line.

Each file is built here, well-formed where it matters (valid frames and checksums) so the bounds,
not the checksum, are what is tested. Reports run in a child process under a memory limit
(RLIMIT_AS) and a timeout: a hostile file must end in one line or a report, quickly.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import zlib


from gputop.model import Sample
from gputop.session.recording import (
    FRAME_CHUNK, MAX_SAMPLES_PER_CHUNK, RecordingReader, RecordingWriter,
)
from gputop.session.recording_format import CODEC_ZLIB, frame_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_LIMIT = 2 << 30   # the report of a small file must fit well inside this


def _honest(path, seconds=3) -> RecordingWriter:
    w = RecordingWriter(str(path), {"gputop_version": "x", "target": {"pid": 1}})
    for sec in range(seconds):
        w.write_samples([Sample(sec + i / 10, "gpu", "0", {"util_gpu": 50.0}) for i in range(10)])
    return w


def _chunk(text: bytes, t0: float, t1: float) -> bytes:
    return frame_bytes(FRAME_CHUNK, zlib.compress(text, 9), CODEC_ZLIB, t0, t1)


def _report_in_child(path, timeout=30, extra="") -> subprocess.CompletedProcess:
    code = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT}))\n"
            f"{extra}\nimport sys; from gputop.cli import main; sys.exit(main(['report', {str(path)!r}]))")
    env = dict(os.environ, PYTHONPATH=ROOT)
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    p.seconds = time.monotonic() - started
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.returncode in (0, 1), p.stderr
    if p.returncode == 1:
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p


def test_a_bomb_of_empty_lists_is_skipped_cheaply(tmp_path):
    path = tmp_path / "bomb.gtrec"
    w = _honest(path)
    w._f.write(_chunk(b'{"series":[["gpu","0",[3.0],{"x":[' + b"[]," * 30_000_000 + b'[]]}]]}', 3.0, 3.0))
    w.close()
    assert path.stat().st_size < 200_000  # 90 MB of JSON in a few hundred KB
    p = _report_in_child(path)
    assert p.returncode == 0 and "1 chunk damaged at byte" in p.stdout and "skipped" in p.stdout
    assert p.seconds < 10


def test_frames_of_millions_of_samples_are_refused_per_chunk(tmp_path):
    path = tmp_path / "many.gtrec"
    w = _honest(path)
    n = MAX_SAMPLES_PER_CHUNK + 1
    ts = ",".join(["3.0"] * n).encode()
    for _ in range(4):
        w._f.write(_chunk(b'{"series":[["gpu","0",[' + ts + b'],{}]]}', 3.0, 3.0))
    w.close()
    p = _report_in_child(path)
    assert p.returncode == 0 and "4 parts damaged" in p.stdout
    assert p.seconds < 10
    with RecordingReader(str(path)) as r:
        r.all_samples()
        assert len(r.index.damaged) == 4 and len(r.all_samples()) == 30
        assert all(d.reason.startswith(("holds ", "inflates past")) for d in r.index.damaged)


def test_too_many_frames_end_in_one_line(tmp_path):
    """2M tiny chunks, scaled down: the limit is set to 2000 in the child, the file has 3000."""
    path = tmp_path / "tiny.gtrec"
    w = _honest(path, seconds=0)
    for i in range(3000):
        w._f.write(_chunk(json.dumps({"series": [["gpu", "0", [i * 0.001], {}]]}).encode(), i * 0.001, i * 0.001))
    w.close()
    p = _report_in_child(path, extra="import gputop.session.recording_reader as m; m.MAX_FRAMES_PER_FILE = 2000")
    assert p.returncode == 1 and "more than 2000 frames" in p.stderr


def test_header_times_that_lie_cost_nothing(tmp_path):
    """A 356-byte-like file whose chunk claims t1 = 1e9: skipped at once; times that jump by a
    billion seconds between honest chunks are jumped over, not played."""
    liar = tmp_path / "liar.gtrec"
    w = _honest(liar)
    w._f.write(_chunk(b'{"series":[["gpu","0",[3.0],{"util_gpu":[1]}]]}', 3.0, 1e9))
    w._f.write(_chunk(b'{"series":[["gpu","0",[4.0],{"util_gpu":[1]}]]}', -1e9, -1e9))
    w._f.write(_chunk(b'{"series":[["gpu","0",[5.0],{"util_gpu":[1]}]]}', 1e9, 1e9 + 1))  # times not its samples'
    w.close()
    p = _report_in_child(liar)
    assert p.returncode == 0 and "3 parts damaged" in p.stdout and p.seconds < 10
    with RecordingReader(str(liar)) as r:
        assert r.index.t_end < 10 or r.all_samples() and r.index.t_end < 10
        assert {d.reason for d in r.index.damaged} == {
            "claims to span 1e+09 s", "is out of time order", "its header times do not match its samples"}

    jump = tmp_path / "jump.gtrec"
    w = _honest(jump)
    w.write_samples([Sample(1e9 + i / 10, "gpu", "0", {"util_gpu": 60.0}) for i in range(10)])
    w.close()
    assert jump.stat().st_size < 1000
    p = _report_in_child(jump)
    assert p.returncode == 0 and p.seconds < 10


def test_deep_values_long_strings_and_huge_ints_lose_their_chunk(tmp_path):
    path = tmp_path / "odd.gtrec"
    w = _honest(path)
    noise = os.urandom(100_000).hex().encode()  # does not compress: the string bound, not the bomb bound
    digits = str(int.from_bytes(os.urandom(1700), "big")).encode()[:4000]
    for value in (b"[" * 50 + b"1" + b"]" * 50, b'"' + noise + b'"', b"1" + digits):
        w._f.write(_chunk(b'{"series":[["gpu","0",[3.5],{"v":[' + value + b"]}]]}", 3.5, 3.5))
    w.close()
    with RecordingReader(str(path)) as r:
        assert len(r.all_samples()) == 30
        assert [d.reason for d in r.index.damaged] == ["a value is too long or too deeply nested"] * 3


def test_a_file_of_fake_frame_headers_is_bounded(tmp_path):
    """Damage followed by thousands of frame markers claiming big frames: resynchronising is
    bounded per file, not a checksum of megabytes per marker."""
    path = tmp_path / "fake.gtrec"
    w = _honest(path)
    fake = struct.pack("<2sccIIdd", b"GF", b"C", b"\x01", 4_000_000, 0, 0.0, 0.0)
    w._f.write(b"X" * 30 + (fake + b"\0" * 100) * 40_000)
    w.write_samples([Sample(9.0, "gpu", "0", {"util_gpu": 1.0})])
    w.close()
    p = _report_in_child(path)
    assert p.seconds < 10


def test_limits_leave_room_for_every_committed_recording():
    import glob
    for f in glob.glob(os.path.join(ROOT, "tests", "data", "**", "*.gtrec"), recursive=True):
        with RecordingReader(f) as r:
            r.all_samples()
            assert not r.index.damaged, f
