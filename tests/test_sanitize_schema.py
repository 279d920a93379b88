"""The sanitizer's SCHEMA says what type each recorded field has; a field it does not list is
taken for a number. A new non-numeric field (a dtype name, a dict of counts) that is not listed
there is silently turned into None on every replay and report — as happened to the FLOPs dtype
and the collective op names before this test. So: every value of every committed recording,
made by the recorder on the H200 or here, comes through the sanitizer unchanged."""

from __future__ import annotations

import pathlib

import pytest

from gputop.session.recording_reader import RecordingReader
from gputop.session.sanitize import BadValues, clean_samples

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORDINGS = sorted({*ROOT.glob("tests/data/**/*.gtrec"), *ROOT.glob("gputop/demo/recordings/*.gtrec")})


def test_there_are_recordings_of_the_new_fields():
    names = {p.name for p in RECORDINGS}
    assert "mfu_gpt_bf16.gtrec" in names and "stall_ranks.gtrec" in names


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recorded_value_survives_the_sanitizer(path):
    reader = RecordingReader(str(path))
    try:
        samples = list(reader.all_samples())
    finally:
        reader.close()
    bad = BadValues()
    cleaned = clean_samples(samples, bad)
    assert not bad, bad.summary()
    assert len(cleaned) == len(samples)
    assert all(a is b for a, b in zip(cleaned, samples))   # unchanged: the very same objects


def _frames(bad) -> dict:
    """A py-spy window's shape (frames, threads with stacks), with ``bad`` placed deep inside."""
    return {"frames": [["step", "/x/train.py", 12], ["fwd", "/x/m.py", 3]],
            "threads": [{"tid": 7, "name": "MainThread", "stacks": [[5, [0, 1]], [2, [0, bad]]]}]}


BAD_NUMBERS = [(float("nan"), "not finite"), (float("inf"), "not finite"), (-float("inf"), "not finite"),
               (10 ** 19, "beyond 1e18"), (-2e18, "beyond 1e18")]
BAD_VALUES = BAD_NUMBERS + [("x" * 20000, "characters"), ({"k" * 300: 1}, "a key of 300"),
                            ((1, 2), "not a JSON value"), (object(), "not a JSON value"),
                            ([[[[[[[[1]]]]]]]], "nested deeper")]


@pytest.mark.parametrize("bad, why", BAD_NUMBERS)
def test_a_non_finite_or_huge_number_anywhere_in_a_column_is_found(bad, why):
    """The whole-column check (min/max over the column) passes only what the value-by-value one
    passes: a NaN in the middle of a column, where min and max step over it, is still found."""
    from gputop.session.sanitize import clean_series

    for col in ([bad, 1.0, 2.0], [1.0, bad, 2.0], [1.0, None, bad]):
        b = BadValues()
        _kind, _key, _ts, cols = clean_series("gpu", "0", [1.0, 2.0, 3.0], {"util_gpu": col}, b)
        assert cols["util_gpu"][col.index(bad)] is None and b, (col, cols)


@pytest.mark.parametrize("bad, why", BAD_VALUES)
def test_a_bad_value_deep_inside_a_clean_looking_one_is_found(bad, why):
    """The one-walk check of a nested value (sanitize._within_bounds) passes only what the item-by-item
    walk passes: anything out of bounds, however deep, is still found and named."""
    from gputop.session.sanitize import clean_value

    good = _frames(1)
    assert clean_value(good) == (good, None) and clean_value(good)[0] is good
    got, reason = clean_value(_frames(bad))
    assert reason is not None and why in reason, reason
    assert got is None or got["threads"][0]["stacks"][1][1][1] != bad or why == "characters"
