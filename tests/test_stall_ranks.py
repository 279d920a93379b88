"""A blocked collective between two gloo ranks (torch.distributed, 2 processes launched side by
side under one launcher, the probe loaded as `gputop run` loads it): rank 1 sleeps in
``rank_elsewhere()`` and never joins the all_reduce that rank 0 waits in. The job is named
`stalled` within the stated time, the snapshot shows both ranks side by side (rank 0 in
all_reduce at its line since its last step, rank 1 at its sleep), neither rank is paused while
it is dumped (each one's ticker keeps counting), and the verdict clears when the ranks step again.
"""

from __future__ import annotations

import pytest

from gputop.catalogue import KIND_STALL_SNAPSHOT
from gputop.derive.stall import describe_snapshot, snapshot_lines
from stall_helpers import MIN_S, marker_line, of_kind, scene, stall_job

NAMED_WITHIN_S = MIN_S + 1.0 + 1.0 + 1.5 + 1.0 + 3.5   # as tests/test_stall.py, more slack for two ranks
CLEARS_WITHIN_S = 1.0 + 1.0 + 5.0 + 1.0 + 3.5


# 7 s of training before the blocked collective (with 3, one run had the job named stalled 0.4 s into
# training), 15 s after it: more than CLEARS_WITHIN_S (with 7, an idle CI run's session ended with
# the job before the verdict's LEAVE_S had run out and no "off" was seen, as in tests/test_stall.py)
STALL_JOBS = {"ranks": {"args": ["--launch-ranks", "2", "--scenes", "collective", "--stall-s", "8",
                                 "--first-train-s", "7", "--train-s", "15"]}}


@pytest.fixture(scope="module")
def job(request, tmp_path_factory):
    return stall_job(request, tmp_path_factory, "ranks")   # started beside the other stall jobs


def test_the_blocked_collective_is_named_stalled_and_clears(job):
    start, end = scene(job, "collective", rank=1)
    changes = [(s.t, s.get("active")) for s in of_kind(job["samples"], "verdict_change", "stalled")]
    on = [t for t, a in changes if a and start <= t <= end + 1.0]
    assert on and on[0] - start <= NAMED_WITHIN_S, (changes, start, end)
    off = [t for t, a in changes if not a and t > on[0]]
    assert off and end < off[0] <= end + CLEARS_WITHIN_S, (changes, end)
    verdict = [s for s in of_kind(job["samples"], "verdict", "stalled") if s.get("active")][-1]
    assert verdict.get("severity") == "critical"


def test_the_snapshot_shows_each_rank_where_it_is(job):
    start, end = scene(job, "collective", rank=1)
    (shot,) = [s for s in of_kind(job["samples"], KIND_STALL_SNAPSHOT) if start <= s.t <= end]
    ranks = {r["rank"]: r for r in describe_snapshot(shot.data)["ranks"]}
    assert set(ranks) == {0, 1}
    r0, r1 = ranks[0], ranks[1]
    assert r0["collective"] == "all_reduce", r0
    assert r0["where"] == f"main.<locals>.step (stall_train.py:{marker_line('STALL-ALLREDUCE')})"
    assert r1["collective"] is None
    assert r1["where"] == f"rank_elsewhere (stall_train.py:{marker_line('STALL-ELSEWHERE')})"
    # since when: each rank's last step, before the stop and not long before it
    for r in (r0, r1):
        assert r["since"] is not None and start - 2.5 <= r["since"] <= shot.t, (r, start)
    text = "\n".join(snapshot_lines(shot.data))
    assert "rank 0 (pid" in text and "in all_reduce() at main.<locals>.step" in text
    print(text)


def test_no_rank_is_paused_while_dumped(job):
    start, end = scene(job, "collective", rank=1)
    (shot,) = [s for s in of_kind(job["samples"], KIND_STALL_SNAPSHOT) if start <= s.t <= end]
    t0, t1 = shot.data["t"], shot.data["t"] + shot.data["dump_ms"] / 1000.0
    for rank in (0, 1):
        rows = [(t, n) for t, n in job["rank_ticks"][rank] if t0 - 0.5 <= t <= t1 + 0.5]
        gaps = [b[0] - a[0] for a, b in zip(rows, rows[1:])]
        print(f"rank {rank}: dump {shot.data['dump_ms']:.0f} ms, "
              f"longest ticker gap around it {max(gaps) * 1000:.0f} ms")
        assert rows and max(gaps) < 0.25 and all(b[1] > a[1] for a, b in zip(rows, rows[1:]))
