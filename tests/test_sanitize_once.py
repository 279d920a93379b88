"""The recorder's summaries check a chunk's values once (sanitize.clean_chunk) for both the
statistics and the incremental replay; the replay must still get exactly what the whole-file
replay's ``clean_samples(samples_of(series))`` gives, bad values, times and keys included."""

from __future__ import annotations

import glob
import os

from gputop.session.recording_format import samples_of
from gputop.session.recording_reader import RecordingReader
from gputop.session.sanitize import MAX_KEY, MAX_STRING, BadValues, clean_chunk, clean_samples, clean_series

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
        # lists and objects (py-spy's threads, a verdict's evidence) with one bad value deep inside:
        # both checks (clean_chunk by column, clean_samples by value) must find each
        ("stacks", "7", [2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6],
         {"threads": [[{"tid": 1, "frames": [[0, 3, 2 ** 70]]}], [{"tid": 2, "n": float("nan")}],
                      [{"name": "x" * (MAX_STRING + 1)}], [{"k" * (MAX_KEY + 1): 1}], [[[[[[[[[[0]]]]]]]]]],
                      {"not": "a list"}, [{"tid": 3, "frames": [[0, 1, 5]], "n": 4, "ok": True, "s": None}]],
          "code": [{"a": [1, -1e19]}, None, {"b": {"c": "d"}}, [1], {"e": [1.5, "f"]}, {}, {"g": float("inf")}]}),
        ("budget", "window", [3.0, 3.1], {"changes": [[1, [2, 3]], "no"], "shares": [{"cpu": 0.5}, {"cpu": 1e30}]}),
    ]
    _check(series)
    bad = BadValues()
    stats, replay = clean_chunk(series, bad)
    assert len(bad.counts) >= 10   # the chunk is as bad as meant
    # each bad nested value found, the good ones kept as they are
    (threads,) = [s[3]["threads"] for s in replay if s[0] == "stacks"]
    assert threads[0] != series[-2][3]["threads"][0] and threads[-1] is series[-2][3]["threads"][-1]
    assert threads[5] is None
    assert [s[0] for s in replay].count(long) == 1 and all(s[0] != long for s in stats)
    assert all(s[1] != long for s in replay)
