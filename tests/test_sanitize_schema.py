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
