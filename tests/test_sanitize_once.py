"""The recorder's summaries check a chunk's values once (sanitize.clean_chunk) for both the
statistics and the incremental replay; the replay must still get exactly what the whole-file
replay's ``clean_samples(samples_of(series))`` gives, bad values, times and keys included."""

from __future__ import annotations

import glob
import os

from gputop.session.recording_format import samples_of
from gputop.session.recording_reader import RecordingReader
from gputop.session.sanitize import MAX_KEY, BadValues, clean_chunk, clean_samples, clean_series

DATA = os.path.join(os.path.dirname(__file__), "data", "h200")


def _check(series) -> None:
    want_bad, got_bad = BadValues(), BadValues()
    want_stats = [g for g in (clean_series(*s, want_bad) for s in series) if g is not None]
    stats, replay = clean_chunk(series, got_bad)
    assert repr(stats) == repr(want_stats)
    assert (got_bad.counts, got_bad.reasons) == (want_bad.counts, want_bad.reasons)
    assert repr(samples_of(replay)) == repr(clean_samples(samples_of(series)))


def test_real_chunks_are_checked_alike():
    files = sorted(glob.glob(os.path.join(DATA, "**", "*.gtrec"), recursive=True))
    assert len(files) >= 20
    for path in files:
        with RecordingReader(path) as r:
            for ref in r.index.good_chunks()[:20]:
                _check(r.read_series(ref))


def test_bad_values_times_and_keys_are_checked_alike():
    long = "k" * (MAX_KEY + 1)
    series = [
        ("gpu", "0", [1.0, 2.0, 3e10], {"util_gpu": [50.0, 1e30, 7], "name": [3, "x", None]}),
        ("health", "nvml", [1.5], {"state": ["weird"], "message": [["not", "a", "string"]]}),
        ("thread", "12", [1.1, 1.2], {"state": [True, "R"], "cpu_pct": ["high", 2 ** 70]}),
        (long, "0", [1.0], {"v": [1.0]}),      # a kind too long: the stats drop it, the replay keeps it
        ("gpu", long, [1.0], {"v": [1.0]}),    # a key too long: both drop it
        ("verdict", "x", [0.5, 0.7], {"evidence": [{"a": [[[[[[[[[[1]]]]]]]]]]}, "no"], "active": [1, False]}),
    ]
    _check(series)
    bad = BadValues()
    stats, replay = clean_chunk(series, bad)
    assert len(bad.counts) >= 6   # the chunk is as bad as meant
    assert [s[0] for s in replay].count(long) == 1 and all(s[0] != long for s in stats)
    assert all(s[1] != long for s in replay)
