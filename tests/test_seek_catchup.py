"""A replay's far seek (a jump, back or forward) shows what playing the file from its start shows
at that time, on real H200 recordings: the time budget's window, the thread states, the verdicts
and the primary one. And the stack naming the catch-up after a jump leans on: each distinct stack
is named once, whichever window it came from, exactly as ``name_stack`` names it."""

from __future__ import annotations

import json
import pathlib

import pytest

from gputop.derive import moments as M
from gputop.derive.budget import name_stack
from gputop.session.recording import RecordingReader
from gputop.session.replay import PLAY_THROUGH_S, SEEK_WARMUP_S, ReplaySession
from gputop.session.sanitize import clean_samples
from gputop.verdicts import default_processors

REAL = pathlib.Path(__file__).resolve().parent / "data" / "h200" / "real"
# three that a jump landing off the processors' grid showed differently (the budget window of
# another instant, up to a second away): a Trainer run, a periodic checkpoint, a periodic block;
# and a Trainer run that is calm from ~80 s (its budget and thread states work every other
# second then, on a grid of session time: derive/stacks_window.works_now)
JUMPED = ("hf_trainer-run.gtrec", "checkpoint_stall-pid.gtrec", "periodic_stall-pid.gtrec",
          "../calm4/hf_trainer-pid.gtrec")


def _shown(s: ReplaySession) -> dict:
    """What the views show of the processors' output. A verdict's ``since`` is left out: one that
    entered before the jump's landing (SEEK_WARMUP_S before the target) starts there."""
    st = s.store
    out = {f"thread_state/{k}": (x.t, x.data) for k, x in st.latest_of_kind("thread_state").items()}
    b = st.latest("budget", "window")
    out["budget"] = (b.t, b.data) if b is not None else None
    for k, v in st.latest_of_kind("verdict").items():
        out[f"verdict/{k}"] = (v.t, v.data.get("active"), v.data.get("severity"), v.data.get("level"),
                               json.dumps(v.data.get("evidence"), sort_keys=True, default=str))
    p = st.latest("verdict_primary", "primary")
    out["primary"] = p.data.get("id") if p is not None else None
    ph = st.latest("phase", "main")
    out["phase"] = ph.data.get("phase") if ph is not None else None
    return out


@pytest.mark.parametrize("name", JUMPED)
def test_a_far_seek_shows_what_playing_from_the_start_shows(name):
    path = str(REAL / name)
    ref = ReplaySession(path, processors=default_processors(), start_playing=False)
    back = ReplaySession(path, processors=default_processors(), start_playing=False)
    span = ref.t_end - ref.t_start
    # both targets are jumps (not played through), the last one landing after the file's start
    assert 0.6 * span > PLAY_THROUGH_S and 0.99 * span > SEEK_WARMUP_S + 2.0
    for frac in (0.6, 0.99):
        t = ref.t_start + frac * span
        ref.play_to(t)
        back.seek(back.t_end)
        back.seek(t)                        # a jump back
        fwd = ReplaySession(path, processors=default_processors(), start_playing=False)
        fwd.seek(t)                         # a jump forward from the start
        want = _shown(ref)
        assert want["budget"] is not None and any(k.startswith("verdict/") for k in want)
        for got in (back, fwd):
            assert got.position == pytest.approx(t)
            assert _shown(got) == want, f"{name} at {frac:.0%}"
        fwd.stop()
    ref.stop()
    back.stop()


def _windows(name: str) -> list:
    with RecordingReader(str(REAL / name)) as r:
        out = []
        for ref in r.index.chunks:
            out.extend(s for s in clean_samples(r.read_chunk(ref)) if s.kind == "stacks")
    return out


def test_each_distinct_stack_is_named_once_and_as_name_stack_names_it():
    windows = _windows("hf_trainer-run.gtrec")
    assert len(windows) > 10
    M._named.cache_clear()
    n = 0
    for s in windows:
        frames, code = s.data["frames"], s.data.get("code") or {}
        table = [(f[0], f[1], f[2]) for f in frames]
        for th in s.data["threads"]:
            for _count, stack in th["stacks"]:
                if stack:
                    leaf = code.get(str(stack[-1]))
                    assert M.naming_of(table, stack, code) == name_stack(frames, stack, leaf)
                    n += 1
    info = M._named.cache_info()
    # every window has its own frame table (its indices differ), yet a training loop repeats
    # its stacks: many lookups find one named in an earlier window (43 % of this 50 s file,
    # start-up included)
    assert info.hits + info.misses == n and info.hits > 0.3 * n


def test_a_stack_naming_keeps_bad_indices_and_odd_lines_in_place():
    """A damaged window: an index outside the frame table stays at its place (the innermost
    frame is still the innermost), and a line that is not an int is written as name_stack
    writes it."""
    frames = [["main", "/job/train.py", 10], ["step", "/job/train.py", "12x"],
              ["sleep", "/usr/lib/python3.11/threading.py", 3.0], ["wait", "/usr/lib/python3.11/threading.py", 5]]
    table = [(f[0], f[1], f[2] if type(f[2]) is int else f"{f[2]}") for f in frames]
    for stack in ([0, 1, 3], [0, 1, 99], [0, -4, 1], [0, 1, 2], [7]):
        for code in ({}, {str(stack[-1]): "time.sleep(1)"}):
            leaf = code.get(str(stack[-1]))
            assert M.naming_of(table, stack, code) == name_stack(frames, stack, leaf), (stack, code)


def test_a_looped_rerecording_shifts_the_times_inside_the_samples(tmp_path):
    """The long test files loop a real recording: a py-spy window's and a kernel second's start
    (``t0``) move with their sample, or every loop after the first has no moment in its windows."""
    from gputop.session.rerecord import rerecord

    src = REAL / "periodic_stall-pid.gtrec"
    with RecordingReader(str(src)) as r:
        span = r.index.t_end - r.index.t_start
    dst = tmp_path / "looped.gtrec"
    rec = rerecord(str(src), str(dst), None, span_s=2.5 * span)
    assert rec.error is None
    with RecordingReader(str(dst)) as r:
        late = [s for ref in r.index.chunks for s in r.read_chunk(ref)
                if s.kind in ("stacks", "thread_kernel") and s.t > r.index.t_start + 1.5 * span]
    assert {s.kind for s in late} == {"stacks", "thread_kernel"}
    for s in late:
        assert s.t - 30.0 < s.data["t0"] <= s.t, (s.kind, s.t, s.data["t0"])
