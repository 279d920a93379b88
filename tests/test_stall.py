"""The stall snapshot on a real CPU job (tests/workloads/stall_train.py, launched with the probe
as `gputop run` does; plain Python steps marked with ``gputop.probe.step()``, no torch): the
main thread sleeps in a function, then waits on a threading.Lock
another thread holds. Each is named `stalled` within the stated time, the snapshot names the
right file:line of every thread, the job is never paused while it is dumped (its ticker thread
keeps counting), the verdict clears when steps resume, and it is not named during start-up or
after the job's normal end. The recording round-trips the snapshot, the report prints it and the
Stall view shows it.

The detector's floor is a parameter (``StallDetector(min_s=2.0)``; the default is 10 s) so the
test stays short; nothing else is faked.
"""

from __future__ import annotations

import pytest

from gputop.catalogue import KIND_STALL, KIND_STALL_SNAPSHOT
from gputop.derive.stall import describe_snapshot, snapshot_lines
from gputop.session.recording import RecordingReader
from stall_helpers import MIN_S, marker_line, of_kind, scene, stall_job

# the stated time: the threshold, plus up to one probe window (~1 s) before the last step is
# known, one detector interval, the engine's ENTER_S (1.5 s) and its interval; slack for a
# loaded 2-core machine
NAMED_WITHIN_S = MIN_S + 1.0 + 1.0 + 1.5 + 1.0 + 2.5
CLEARS_WITHIN_S = 1.0 + 1.0 + 5.0 + 1.0 + 2.5       # a window, the detector, LEAVE_S, the engine, slack


# no torch in these two (--plain: marker steps); the training before the stop only has to give
# the detector a median step time. They run beside the other stall tests' jobs (stall_helpers).
# (the training after the stop outlasts CLEARS_WITHIN_S: with 7 s of it, a loaded box's session
# ended with the job before the verdict's LEAVE_S had run out, and no "off" was ever seen)
STALL_JOBS = {name: {"args": ["--plain", "--scenes", name, "--stall-s", "7", "--first-train-s", "3",
                              "--train-s", "12", "--startup-s", "1.5"]} for name in ("sleep", "lock")}


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    return {name: stall_job(request, tmp_path_factory, name) for name in STALL_JOBS}


def changes(job, vid="stalled"):
    return [(s.t, s.get("active")) for s in of_kind(job["samples"], "verdict_change", vid)]


def snapshot_in(job, start, end):
    shots = [s for s in of_kind(job["samples"], KIND_STALL_SNAPSHOT) if start <= s.t <= end]
    assert len(shots) == 1, [s.t for s in of_kind(job["samples"], KIND_STALL_SNAPSHOT)]
    return shots[0]


@pytest.mark.parametrize("name", ["sleep", "lock"])
def test_each_stop_is_named_stalled_in_time_and_clears_when_steps_resume(jobs, name):
    job = jobs[name]
    start, end = scene(job, name)
    on = [t for t, active in changes(job) if active and start <= t <= end + 1.0]
    assert on, (name, changes(job), start, end)
    assert on[0] - start <= NAMED_WITHIN_S, (name, on[0] - start)
    off = [t for t, active in changes(job) if not active and t > on[0]]
    assert off and end < off[0] <= end + CLEARS_WITHIN_S, (name, off, end)
    # the detector itself says stalled during the scene and not once steps came back (the
    # probe's window of the first step closes <= 1 s after it, the detector runs each second,
    # and a loaded machine adds a little to both)
    states = [s for s in of_kind(job["samples"], KIND_STALL, "job") if end + 3.5 <= s.t <= end + 7.0]
    assert states and not any(s.get("stalled") for s in states)


@pytest.mark.parametrize("name", ["sleep", "lock"])
def test_not_stalled_in_start_up_nor_after_a_normal_end(jobs, name):
    job = jobs[name]
    first = min(e["t"] for e in job["events"] if e.get("scene") == "training")
    before = [s for s in of_kind(job["samples"], KIND_STALL, "job") if s.t < first + 0.5]
    assert before and not any(s.get("stalled") for s in before)   # 2 s of start-up, no step yet
    done = max(e["t"] for e in job["events"] if e.get("scene") == "done")
    after = [s for s in of_kind(job["samples"], KIND_STALL, "job") if s.t > done]
    assert after and not any(s.get("stalled") for s in after)
    assert not any(active for t, active in changes(job) if t > done)


def test_the_sleep_snapshot_names_every_thread_at_its_line(jobs):
    job = jobs["sleep"]
    shot = snapshot_in(job, *scene(job, "sleep"))
    d = describe_snapshot(shot.data)
    (r,) = d["ranks"]
    assert r["error"] is None
    assert r["where"] == f"stuck_in_sleep (stall_train.py:{marker_line('STALL-SLEEP')})"
    by_name = {t["name"]: t for t in r["threads"]}
    assert by_name["MainThread"]["main"] and not by_name["MainThread"]["active"]
    assert by_name["ticker"]["where"].startswith("Ticker.run (stall_train.py:")
    assert shot.data["last_step_t"] is not None and shot.data["last_step_t"] <= shot.t


def test_the_lock_snapshot_names_the_waiter_and_the_holder(jobs):
    job = jobs["lock"]
    shot = snapshot_in(job, *scene(job, "lock"))
    (r,) = describe_snapshot(shot.data)["ranks"]
    by_name = {t["name"]: t for t in r["threads"]}
    assert by_name["MainThread"]["where"] == f"wait_for_lock (stall_train.py:{marker_line('STALL-LOCK')})"
    assert by_name["holder"]["where"] == f"hold_the_lock (stall_train.py:{marker_line('STALL-HOLDER')})"


@pytest.mark.parametrize("name", ["sleep", "lock"])
def test_the_job_is_never_paused_while_it_is_dumped(jobs, name):
    job = jobs[name]
    shot = snapshot_in(job, *scene(job, name))
    t0, t1 = shot.data["t"], shot.data["t"] + shot.data["dump_ms"] / 1000.0
    rows = [(t, n) for t, n in job["ticks"] if t0 - 0.5 <= t <= t1 + 0.5]
    during = [n for t, n in rows if t0 <= t <= t1]
    gaps = [b[0] - a[0] for a, b in zip(rows, rows[1:])]
    print(f"{name}: dump {shot.data['dump_ms']:.0f} ms, ticker lines during it {len(during)}, "
          f"longest gap around it {max(gaps) * 1000:.0f} ms")
    assert rows and max(gaps) < 0.25, gaps     # the ticker writes every 10 ms; a paused process would stop
    assert all(b[1] > a[1] for a, b in zip(rows, rows[1:]))


def test_the_recording_and_the_report_have_the_snapshot(jobs):
    from gputop.report import build_report, render_text

    job = jobs["sleep"]
    r = RecordingReader(str(job["recording"]))
    recorded = [s for ref in r.index.chunks for s in r.read_chunk(ref) if s.kind == KIND_STALL_SNAPSHOT]
    live = of_kind(job["samples"], KIND_STALL_SNAPSHOT)
    assert [s.data for s in recorded] == [s.data for s in live] and len(live) == 1
    report = build_report(str(job["recording"]))
    assert report["stall"]["count"] == len(live)
    text = render_text(report)
    assert f"stuck_in_sleep (stall_train.py:{marker_line('STALL-SLEEP')})" in text
    # the report judges again with the default floor (10 s): a 5 s stop is not a stall there
    assert "stalled" not in report["verdicts"]
    assert snapshot_lines(live[0].data)[0].startswith("stalled at")


def test_the_stall_view_is_reached_by_its_key_in_a_replay(jobs):
    job = jobs["lock"]
    import asyncio

    from gputop.session.replay import ReplaySession
    from gputop.ui.app import GputopApp

    start, end = scene(job, "lock")
    # (paused: a playing replay moved on while the app started, past the scene's end beside two
    # CPU hogs, where the view then said "progressing")
    session = ReplaySession(str(job["recording"]), start_playing=False)
    session.seek(end - 0.5)
    app = GputopApp(session)

    async def drive():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("s")
            await pilot.pause()
            app.tick()
            await pilot.pause()
            assert app.current_view == "stall"
            text = "\n".join(p.text.plain for p in app.panels["stall"])
            assert f"wait_for_lock (stall_train.py:{marker_line('STALL-LOCK')})" in text
            assert "STALLED now" in text
            hints = dict(app.hints())
            assert hints.get("s") == "stall"

    try:
        asyncio.run(drive())
    finally:
        session.stop()
