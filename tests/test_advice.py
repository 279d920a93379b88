"""The advice follows the DataLoader workers' state (gputop/verdicts/workers.py): workers short
of CPU are never told "storage is slow", a loop that waits for data is never told "fewer
workers", a loader with workers is never told "num_workers=4 or more". Data: real recordings
(tests/data/cpu_oversubscribed.gtrec: the input-bound demo on a busy 2-core machine, its
workers waiting for a core ~70% of the time; tests/data/h200/input_bound.gtrec: workers at 100%
CPU on a 16-core host; tests/data/h200/probe/probe_input_bound_cuda.gtrec: a probe-only session
of a loader with num_workers=4)."""

from __future__ import annotations

import pathlib

import pytest

from gputop.session.whole_replay import replay_whole
from gputop.verdicts import default_processors, rules
from gputop.verdicts.engine import VerdictEngine
from gputop.verdicts.workers import WORKERS_CPU_BOUND, WORKERS_CPU_STARVED, worker_state

DATA = pathlib.Path(__file__).resolve().parent / "data"
OVERSUBSCRIBED = DATA / "cpu_oversubscribed.gtrec"
INPUT_BOUND = DATA / "h200" / "input_bound.gtrec"
PROBE_INPUT_BOUND = DATA / "h200" / "probe" / "probe_input_bound_cuda.gtrec"


def _verdicts(path, vid):
    got = replay_whole(str(path), default_processors())
    return [s for s in got.samples if s.kind == "verdict" and s.key == vid and s.get("active")]


def _last_signals(path):
    """The signals the engine judged last in a whole replay of ``path``."""
    procs = default_processors()
    replay_whole(str(path), procs)
    return next(p for p in procs if isinstance(p, VerdictEngine)).last_signals


def test_cpu_starved_workers_are_not_told_to_be_fewer():
    got = _verdicts(OVERSUBSCRIBED, "cpu_oversubscribed")
    assert got
    for v in got:
        ev, advice = v.get("evidence"), v.get("advice")
        assert "num_threads" in advice
        if ev["workers_state"] == WORKERS_CPU_STARVED or (ev["data_wait_share_pct"] or 0) >= 20:
            assert "fewer DataLoader workers" not in advice, advice
    last = got[-1]
    assert last.get("evidence")["workers_state"] == WORKERS_CPU_STARVED
    assert last.get("evidence")["worker_cpu_wait_pct_mean"] > 50
    assert "wait for a core too" in last.get("advice") and "more cores" in last.get("advice")


def test_the_recordings_worker_signals():
    sig = _last_signals(OVERSUBSCRIBED)
    assert sig.get("proc.workers.count") == 2
    assert sig.get("proc.workers.cpu_wait_pct_mean") > 50      # schedstat of the worker processes
    assert sig.get("proc.workers.io_share") is not None and sig.get("proc.workers.io_share") < 0.1
    assert worker_state(sig) == WORKERS_CPU_STARVED


def test_when_both_hold_the_two_verdicts_agree():
    """The combination of the issue: the loop waits for data while its workers wait for a core.
    The recording's last signals, with the loop's data wait raised to what such a loop shows."""
    sig = _last_signals(OVERSUBSCRIBED)
    sig.set("probe.data_wait_share", 0.6)
    inp, over = rules.input_bound(sig), rules.cpu_oversubscribed(sig)
    assert inp.level >= 1 and over.level >= 1
    assert "short of CPU, not of storage" in inp.advice and "storage or network" not in inp.advice
    assert "fewer workers would starve the loop" in inp.advice
    assert "fewer DataLoader workers" not in over.advice
    assert "keep the DataLoader workers" in over.advice and "num_threads" in over.advice
    assert "num_threads" in inp.advice    # the same remedy named by both


def test_cpu_bound_workers_with_free_cores_are_told_to_add_workers():
    got = _verdicts(INPUT_BOUND, "input_bound")
    assert got
    for v in got:
        assert "storage" not in v.get("advice")
    last = got[-1]
    assert last.get("evidence")["workers_state"] == WORKERS_CPU_BOUND
    assert last.get("advice").startswith("all 2 DataLoader workers are ~100% busy: raise num_workers "
                                         "(the machine has 16 cores)")
    # the probe's loader settings are read (they sit under "loaders"): pin_memory=False on a GPU job
    assert last.get("evidence")["num_workers"] == 2 and "pin_memory=True" in last.get("advice")


def test_cpu_bound_workers_without_a_free_core_are_not_told_to_add_workers():
    sig = _last_signals(INPUT_BOUND)
    sig.set("host.cpu_pct", 99.0)     # the same workers on a host with no idle core
    advice = rules.input_bound(sig).advice
    assert "no core is free" in advice and "raise num_workers" not in advice


def test_a_loader_with_four_workers_is_not_told_to_use_four():
    got = _verdicts(PROBE_INPUT_BOUND, "input_bound")
    assert got
    for v in got:
        assert "num_workers=4 or more" not in v.get("advice"), v.get("advice")
        assert "storage" not in v.get("advice")   # the workers were not watched: no guess
    last = got[-1]
    assert last.get("evidence")["num_workers"] == 4
    assert last.get("advice").startswith("the 4 DataLoader workers cannot keep up")


@pytest.mark.parametrize("cfg, want", [
    ({"loaders": [{"num_workers": 0, "iterators": 1}]}, "num_workers=4 or more"),
    ({"loaders": [{"num_workers": 8, "iterators": 0}, {"num_workers": 0, "iterators": 3}]}, "num_workers=4 or more"),
    ({"loaders": [{"num_workers": "4", "iterators": 1}]}, "cannot keep up"),   # not a number: unknown
    ({"num_workers": 0}, "cannot keep up"),       # no "loaders": the probe saw no loader
])
def test_the_training_loader_is_the_one_iterated_most(cfg, want):
    sig = _last_signals(PROBE_INPUT_BOUND)
    sig.facts["probe_config"] = cfg
    assert want in rules.input_bound(sig).advice


def test_workers_blocked_reading_are_told_about_storage():
    sig = _last_signals(INPUT_BOUND)
    sig.set("proc.workers.busy", 0)
    sig.set("proc.workers.cpu_pct_mean", 20.0)
    sig.set("proc.workers.io_share", 0.7)
    advice = rules.input_bound(sig).advice
    assert "blocked reading 70%" in advice and "storage or network" in advice
    sig.set("proc.workers.io_share", 0.0)
    advice = rules.input_bound(sig).advice
    assert "neither busy on the CPU (20% each) nor waiting for a core" in advice
