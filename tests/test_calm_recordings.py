"""Real training code recorded on the H200 with calm sampling (`bash benchmarks/h200.sh real`): a
Hugging Face Trainer and a Lightning loop, each calm from ~80 s on (a minute after their verdict
turned on). tests/data/h200/calm/ (REAL_SECS=140, run 11): the half rates of then, py-spy windows
at 10 Hz and GPU samples at 5 Hz, recorded before the stack source wrote a calm window's
``calm_factor`` (replayed, their calm windows count as full-rate ones, which is what their
verdicts held on); tests/data/h200/calm4/ (REAL_SECS=150, run 13): today's rates, py-spy at 5 Hz
in 20 s windows, the kernel sampler at 12.5 Hz, GPU samples at 2.5 Hz, each with its factor. The
verdict holds through the calm part, judged again with today's rules, and the time budget still
sums to 100%."""

from __future__ import annotations

import functools
import pathlib
from collections import Counter

import pytest

from gputop.catalogue import KIND_GPU, KIND_HEALTH
from gputop.demo.workload import SCENARIOS
from gputop.derive.budget import CATEGORIES
from gputop.derive.stacks_window import CALM_STRETCH
from gputop.session.recording_reader import RecordingReader
from gputop.session.whole_replay import replay_whole
from gputop.sources.calm import CALM_FACTOR
from gputop.sources.stacks import KIND_STACKS
from gputop.verdicts import default_processors

DATA = pathlib.Path(__file__).resolve().parent / "data" / "h200"
RECORDINGS = sorted(f"{d}/{p.name}" for d in ("calm", "calm4") for p in (DATA / d).glob("*.gtrec"))


@functools.lru_cache(maxsize=None)
def _samples(name: str) -> list:
    return RecordingReader(str(DATA / name)).all_samples()


@functools.lru_cache(maxsize=None)
def _replay(name: str):
    return replay_whole(str(DATA / name), default_processors(), kinds={"budget", "verdict_primary"})


def _factor(name: str) -> int:
    """The calm factor of the code that recorded it (its header: run 11's said it another way)."""
    calm = RecordingReader(str(DATA / name)).meta["sources"]["calm"]
    return calm.get("factor") or calm["gpu_interval_factor"]


def _scenario(name: str) -> str:
    return pathlib.Path(name).stem.split("-")[0]


def _calm_since(name: str) -> float:
    said = [(s.t, s.get("calm")) for s in _samples(name) if s.kind == KIND_HEALTH and s.key == "stacks"
            and s.get("calm") is not None]
    first = next(t for t, c in said if c)
    assert all(c for t, c in said if t >= first), "calm once, calm to the end (nothing changed)"
    return first


def test_the_files_were_recorded_calm():
    assert RECORDINGS == ["calm/hf_trainer-pid.gtrec", "calm/lightning-pid.gtrec",
                          "calm4/hf_trainer-pid.gtrec", "calm4/lightning-pid.gtrec"]
    assert [_factor(n) for n in RECORDINGS] == [2, 2, CALM_FACTOR, CALM_FACTOR]
    for name in RECORDINGS:
        factor = _factor(name)
        since = _calm_since(name)
        start = min(s.t for s in _samples(name))
        end = max(s.t for s in _samples(name))
        assert 70 <= since - start <= 100 and end - since >= 40, (name, since, end)
        main = [s for s in _samples(name) if s.kind == KIND_STACKS and s.get("main")]
        calm = [s for s in main if s.get("t0") >= since + 1]
        assert len(calm) >= 4 and all(abs(s.get("rate_hz") - 20 // factor) <= 1 for s in calm), name
        before = [s for s in main if s.t < since - 5]
        assert all(s.get("rate_hz") >= 18 for s in before), name
        gpu = [s.t for s in _samples(name) if s.kind == KIND_GPU and s.t >= since + 2]
        rate = (len(gpu) - 1) / (gpu[-1] - gpu[0])
        assert 0.75 * 10 / factor <= rate <= 1.25 * 10 / factor, (name, rate)


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_verdict_holds_through_the_calm_part(name):
    expect = SCENARIOS[_scenario(name)].expect
    since = _calm_since(name)
    primary = [s for s in _replay(name).samples if s.kind == "verdict_primary" and s.t >= since]
    assert len(primary) >= 40
    right = sum(s.get("id") == expect for s in primary)
    assert right == len(primary), [(s.t, s.get("id")) for s in primary if s.get("id") != expect]
    windows = [s for s in _replay(name).samples if s.kind == "budget" and s.key == "window" and s.t >= since]
    # while calm the budget works every CALM_STRETCH seconds (derive/stacks_window.works_now)
    assert len(windows) >= 40 // CALM_STRETCH
    assert all(b.t - a.t <= CALM_STRETCH + 1e-6 for a, b in zip(windows, windows[1:]))
    for s in windows:
        shares = s.get("shares")
        assert set(shares) == set(CATEGORIES)
        assert abs(sum(v for v in shares.values() if v is not None) - 1.0) <= 0.02, (s.t, shares)


def test_a_calm_windows_samples_count_calm_factor_times_where_samples_are_counted():
    """Hot frames and thread states count samples: a calm window's (a quarter of the rate) stand
    for CALM_FACTOR as many of the full rate, so a calm second weighs what a full-rate second does in a
    share over a span that mixes both (the report's stacks section over a long recording)."""
    from dataclasses import replace

    from gputop.derive.hot_frames import HotCounts
    from gputop.derive.thread_samples import _classify_sample

    name = RECORDINGS[0]
    # (these files were recorded before the stack source wrote its calm windows' factor)
    since = _calm_since(name)
    plain = next(s for s in _samples(name) if s.kind == KIND_STACKS and s.get("main") and s.get("t0") > since)
    calm = replace(plain, data={**plain.data, "calm_factor": CALM_FACTOR})
    a, b = HotCounts(), HotCounts()
    a.add_sample(calm)
    b.add_sample(plain)
    assert a.n_all == CALM_FACTOR * b.n_all > 0
    assert a.self_n == Counter({k: CALM_FACTOR * v for k, v in b.self_n.items()})
    weighted, unweighted = _classify_sample(calm), _classify_sample(plain)
    assert set(weighted) == set(unweighted)
    for tid, (_name, n, cats, _leaf, _worker) in weighted.items():
        assert n == CALM_FACTOR * unweighted[tid][1] and \
            cats == Counter({k: CALM_FACTOR * v for k, v in unweighted[tid][2].items()})
