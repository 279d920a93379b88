"""The signals of another process on the job's GPU (gpu_procs.others, issue 30 item 1) against
what a damaged or hostile recording may hold, and the session's gain from the mean lost share.

No GPU here: what the shared GPU itself does is measured on the H200 (tests/test_nvml_source.py's
driver test, benchmarks/corpus/gpu_shared_second_job.py). These feed the pure functions values
no NVML reading gives (strings, sums over 100%) and check they are refused or bounded.
"""

from __future__ import annotations

from gputop.model import Sample
from gputop.session.store import SampleStore
from gputop.verdicts.causal import fix_gain
from gputop.verdicts.rules import gpu_shared
from gputop.verdicts.signals import build_signals
from gputop.verdicts.summary import summarize_verdicts


def _store(others: dict, other_count: int = 1, mine_sm=40.0) -> SampleStore:
    store = SampleStore()
    for i in range(10):
        t = float(i)
        store.on_samples([Sample(t, "gpu", "0", {"util_gpu": 90.0, "sm_active": 60.0}),
                          Sample(t, "gpu_procs", "0", {"procs": {"100": {"mem": 1, "sm_pct": mine_sm}},
                                                       "other_count": other_count, "other_mem": 1, "sm_na": None,
                                                       **({"others": others} if others is not None else {})})])
    return store


def test_hostile_values_of_other_processes_are_refused_not_raised():
    store = _store({"7": {"sm_pct": "lots", "name": {"a": 1}, "user": 3, "mem": [1]},
                    "8": {"sm_pct": 30.0, "name": "python3", "user": "bob", "mem": 5}})
    sig = build_signals(store, 9.5)
    assert sig.get("gpu.others_sm_pct") == 30.0
    bad = next(o for o in sig.facts["gpu_others"] if o["pid"] == "7")
    assert bad["sm_pct"] is None and bad["name"] is None and bad["user"] is None and bad["mem"] is None
    f = gpu_shared(sig)
    assert f is not None and "PID 8 (bob, python3) 30%" in f.summary


def test_shares_over_the_gpus_time_are_bounded():
    store = _store({str(p): {"sm_pct": 80.0, "name": "x", "user": "u", "mem": 1} for p in range(3)})
    sig = build_signals(store, 9.5)
    assert sig.get("gpu.others_sm_pct") == 100.0 and sig.get("gpu.target_sm_pct") == 0.0
    assert 0.0 <= gpu_shared(sig).lost_share <= 1.0


def test_a_file_from_before_others_were_named_is_unknown_not_zero():
    sig = build_signals(_store(None, other_count=1), 9.5)
    assert sig.get("gpu.others_sm_pct") is None and gpu_shared(sig) is None
    sig = build_signals(_store(None, other_count=0), 9.5)
    assert sig.get("gpu.others_sm_pct") == 0.0 and gpu_shared(sig).level == 0.0


def test_the_sessions_gain_is_that_of_its_mean_lost_share():
    """Two seconds near the 95% cap and two at 10%: the session loses 52.5% of its time, so a
    fix gives 2.1x; the mean of each second's gain (19x, 19x, 1.11x, 1.11x) said 10.6x."""
    samples = []
    for i, loss in enumerate((0.95, 0.95, 0.1, 0.1)):
        ev = {"fix_gain_pct": round(fix_gain(loss) * 100.0, 1)}
        samples += [Sample(float(i), "verdict", "input_bound", {"active": True, "lost_share": loss, "evidence": ev,
                                                                "title": "t", "severity": "warning"}),
                    Sample(float(i), "verdict_primary", "main", {"id": "input_bound", "phase": "training"})]
    rep = summarize_verdicts(samples, 0.0, 4.0)
    assert rep["primary_verdict"]["gain_pct"] == round(fix_gain(0.525) * 100.0, 1) == 110.5
    assert rep["verdicts"]["input_bound"]["evidence"]["fix_gain_pct"] == 110.5
