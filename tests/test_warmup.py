"""The warm-up phase (derive/phases.py) and the engine's causal machinery (verdicts/causal.py,
verdicts/engine.py): a job's first stretch is not judged until its step time settles, a cause
costs what the GPU idled for it, its fix's gain follows from that, and the live primary holds
still. The phase tracker and the engine are driven directly here; the corpus recordings
(tests/test_corpus.py) prove the same on real jobs."""

from __future__ import annotations

import pathlib
import sys
from collections import Counter

from gputop.derive import frame_rules as fr
from gputop.derive import phases as ph
from gputop.report import build_report
from gputop.session.store import SampleStore
from gputop.verdicts.causal import MAX_LOSS, fix_gain, gain_text
from gputop.verdicts.engine import PRIMARY_SWITCH_S, VerdictEngine
from gputop.verdicts.finding import SEVERITY_WARNING, Finding

ROOT = pathlib.Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "data" / "h200" / "real"
TRAIN = Counter({fr.TRAIN: 10})


def _train(tracker, steps_ms: list[float], t0: float = 10.0) -> list[tuple[float, str]]:
    """One 1 s training span per step-time reading (the probe's median step of a window)."""
    seen = []
    for i, ms in enumerate(steps_ms):
        a = t0 + i
        tracker.window(a, a + 1.0, TRAIN, 40, 0.025, 10, readings=[(a + 1.0, "step", ms)])
        seen.append((a + 1.0, tracker.phase))
    return seen


def test_training_starts_once_the_step_time_has_settled():
    t = ph.PhaseTracker()
    seen = _train(t, [400, 250, 160, 120, 100, 101, 99, 100, 100])
    phases = [p for _, p in seen]
    assert phases[:5] == [ph.WARMUP] * 5        # still speeding up: 400 -> 100 ms
    assert ph.TRAINING in phases
    # the judged stretch starts at the first reading that said it had settled, not later
    settled_at = seen[phases.index(ph.TRAINING)][0]
    assert t.training_since < settled_at and t.training_since >= 14.0
    assert [p for _, p in t.changes] == [ph.WARMUP, ph.TRAINING]


def test_a_jittery_but_level_loop_settles():
    """A GIL-bound loop's step time jitters +-30% window to window (the H200 scenario): the
    medians of successive readings agree, so it is training after a few of them."""
    t = ph.PhaseTracker()
    seen = _train(t, [595, 866, 445, 599, 605, 456, 617, 501])
    assert seen[-1][1] == ph.TRAINING


def test_a_bursty_loop_settles_on_its_pooled_step_time():
    """Two DataLoader workers feeding a timm ViT on the H200 (corpus job timm_vit_few_workers):
    steps of ~89 ms while batches are ready and ~325 ms while both workers are busy, ~5 a second
    (its report: p50 88.8, p90 325.5, mean 172.8 ms). A window's median flips between the two
    modes, and the warm-up never settled within the 12 s the job trained; its pooled step time
    (the windows' steps' time over their steps) is level, so it settles. The probe's windows go
    through the budget's own reading of them (_step_readings)."""
    from gputop.derive.budget_processor import _step_readings
    from gputop.model import Sample

    t = ph.PhaseTracker()
    # (fast, slow) steps a window: the median flips between the modes in runs of three windows,
    # so no two pairs of window medians agree (the rule before never settled on these)
    windows = [(4, 1), (4, 1), (4, 1), (1, 3), (1, 3), (1, 3), (4, 1), (4, 1), (4, 1), (1, 3)]
    for i, (fast, slow) in enumerate(windows):
        n = fast + slow
        steps = sorted([89.0] * fast + [325.0] * slow)
        w = Sample(11.0 + i, "probe_step", "1", {"step_n": n, "step_ms_p50": steps[n // 2],
                                                 "step_ms_mean": sum(steps) / n})
        t.window(10.0 + i, 11.0 + i, TRAIN, 40, 0.025, n, readings=_step_readings([w], []))
    assert t.phase == ph.TRAINING and t.training_since <= 16.0


def test_a_loop_that_slows_down_is_not_warming_up():
    t = ph.PhaseTracker()
    seen = _train(t, [100, 100, 125, 140, 150])
    assert seen[3][1] == ph.TRAINING      # slower, not faster: settled at the fourth reading


def test_nothing_settles_while_the_first_step_is_pending():
    """A ResNet's first backward autotuned cuDNN for 7 s on the H200 (corpus job
    tv_resnet_workers0): the GPU's busy seconds were level meanwhile and ended the warm-up before
    any step had ended. While the probe sees the loop inside its first step, nothing settles."""
    t = ph.PhaseTracker()
    for i in range(12):
        t.window(10.0 + i, 11.0 + i, TRAIN, 40, 0.025, 0, readings=[(11.0 + i, "busy", 0.3)],
                 first_step_pending=True)
        assert t.phase == ph.WARMUP
    seen = _train(t, [7000, 186, 185, 187, 186], t0=22.0)
    assert seen[-1][1] == ph.TRAINING and t.training_since >= 23.0


def test_training_after_running_warms_up_only_for_a_pending_first_step():
    """Training recognised after a "running" stretch warms up while the probe sees its first step
    pending (the job's start-up ended in code the tables do not know: its "running" budget is
    start-up's); a job attached mid-training whose first windows showed no step goes straight to
    training when its steps show."""
    from collections import Counter
    idle = Counter()
    # start-up, then "running" (no frames the tables know), then the first training frames
    t = ph.PhaseTracker()
    t.window(0.0, 1.0, Counter({fr.IMPORT: 40}), 40, 0.025, 0)
    for i in range(1, 12):
        t.window(float(i), i + 1.0, idle, 40, 0.025, 0, readings=[(i + 1.0, "busy", 0.0)])
    assert t.phase == ph.RUNNING and not t.running_was_startup
    t.window(12.0, 13.0, TRAIN, 40, 0.025, 0, first_step_pending=True)
    assert t.phase == ph.WARMUP and t.running_was_startup and t.startup_s == 12.0
    # attached mid-training: the first windows show no step, then steps without a pending first step
    t = ph.PhaseTracker()
    for i in range(8):
        t.window(float(i), i + 1.0, idle, 40, 0.025, 0, readings=[(i + 1.0, "busy", 0.9)])
    assert t.phase == ph.RUNNING
    t.window(8.0, 9.0, TRAIN, 40, 0.025, 3, readings=[(9.0, "step", 0.1, 3)])
    assert t.phase == ph.TRAINING and not t.running_was_startup


def test_a_first_step_is_waited_for_from_the_first_batch_not_from_the_probes_look_back():
    """The budget processor hands _first_step_pending the probe windows of the last 30 s only; a
    loop whose steps the probe never counts (a custom optimizer) with 2 s batches, 200 s in, must
    not look like a first step again (its first batch came long before that look-back)."""
    from gputop.derive.budget_processor import _first_step_pending
    from gputop.model import Sample

    def win(t, batches, rate):
        return Sample(t, "probe_step", "1", {"step_total": 0, "batch_total": batches, "batches_per_s": rate})
    look_back = [win(170.0 + k, 85 + k // 2, 0.5 if k % 2 else 0.0) for k in range(28)]
    newest = [win(199.5, 100, 0.0)]
    assert _first_step_pending(newest, look_back)              # the look-back alone cannot tell
    assert not _first_step_pending(newest, look_back, first_batch_t=2.0)
    assert _first_step_pending([win(12.0, 1, 0.0)], [win(2.0, 1, 1.0)], first_batch_t=2.0)


def test_the_first_step_is_pending_while_the_loop_took_a_batch_and_ended_no_step():
    from gputop.derive.budget_processor import _first_step_pending
    from gputop.model import Sample

    def win(steps, batches, rate):
        return Sample(1.0, "probe_step", "1", {"step_total": steps, "batch_total": batches, "batches_per_s": rate})
    assert _first_step_pending([win(0, 1, 0.0)])
    assert not _first_step_pending([win(1, 2, 0.0)])          # a step has ended
    assert not _first_step_pending([win(0, 40, 8.0)])         # batches flow without steps: an inference loop
    assert not _first_step_pending([win(0, 0, 0.0)])          # no batch yet: start-up, or no DataLoader
    # no DataLoader, and the stacks inside a backward pass or an optimizer step: the first step
    assert _first_step_pending([win(0, 0, 0.0)], in_step=True)
    assert not _first_step_pending([win(1, 0, 0.0)], in_step=True)   # a step has ended
    assert not _first_step_pending([win(0, 40, 8.0)], in_step=True)  # batches flow: the DataLoader rule holds
    assert _first_step_pending([win(0, None, None)], in_step=True)   # a probe that counts no batches at all
    # GradScaler skipped a step (counted in an earlier window): a step ended, with no optimizer step
    scaled = Sample(0.5, "probe_step", "1", {"step_total": 0, "batch_total": 0, "scaler_steps": 3})
    assert not _first_step_pending([win(0, 0, 0.0)], [scaled], in_step=True)
    assert not _first_step_pending([])
    # a first batch over FIRST_STEP_MAX_S before, and still no step: a loop whose steps the probe
    # does not see (a custom optimizer), not a first step to wait for
    first = Sample(0.0, "probe_step", "1", {"step_total": 0, "batch_total": 1, "batches_per_s": 1.0})
    late = Sample(35.0, "probe_step", "1", {"step_total": 0, "batch_total": 9, "batches_per_s": 0.0})
    assert not _first_step_pending([late], [first])
    # a ResNet-50's first step with cudnn.benchmark on an H100 (bf16, channels_last, batch 128):
    # 17.5 s from its first batch (the unseen corpus's tv_jpeg_decode_few_workers)
    assert _first_step_pending([Sample(17.5, "probe_step", "1", dict(late.data))], [first])


UNSEEN = ROOT / "benchmarks" / "results" / "h100-unseen-1207" / "corpus-unseen1207"


def _first_step_s(job: str, rep: dict) -> float:
    """The job's own first step (its log's ``first_step`` wall time), in the report's seconds."""
    log = (UNSEEN / f"{job}-as_is.log").read_text()
    wall = float(next(line.split()[1] for line in log.splitlines() if line.startswith("first_step ")))
    return wall - rep["session"]["start_wall"]


def test_a_loop_without_a_dataloader_is_in_warm_up_until_its_first_step_ends():
    """A MobileNet trained from batches already on the GPU (no DataLoader: the probe sees no batch)
    sat 12 s in its first backward, loading cuDNN with the GPU idle (an H100, the unseen corpus).
    Those idle seconds were level, so they settled the warm-up and were judged: host_bound for most
    of the run, where the loop is launch-bound once it steps. The first step is pending while its
    stacks are in a backward pass and the probe has ended no step: training is judged from after it."""
    rep = build_report(str(UNSEEN / "tv_mobilenet_graph-as_is.gtrec"))
    training = [p["t"] for p in rep["phases"] if p["phase"] == ph.TRAINING]
    assert training and training[0] > _first_step_s("tv_mobilenet_graph", rep), rep["phases"]
    assert (rep["primary_verdict"] or {}).get("id") == "launch_bound", rep["verdict_timeline"]
    assert "host_bound" not in [v["id"] for v in rep["verdict_timeline"]], rep["verdict_timeline"]


UNSEEN_B = ROOT / "benchmarks" / "results" / "h100-unseen-1207b" / "corpus-unseen1207"


def test_training_after_a_running_start_up_warms_up_until_its_first_step_ends():
    """A torchvision ResNet-50 loop that encodes its JPEGs in the main thread before training
    (frames the tables do not know: "running") took its first batch, then sat 17.5 s in its first
    forward and backward (cudnn.benchmark autotuning, bf16, channels_last, an H100; the unseen
    corpus). Training was judged from its first backward frame, so those seconds were host_bound
    for most of the run, where the loop waits for its two workers once it steps. Training that
    starts after "running" while the probe sees the first step pending warms up like any other;
    a first step is waited for up to WARMUP_MAX_S (it was 15 s)."""
    rep = build_report(str(UNSEEN_B / "tv_jpeg_decode_few_workers-as_is.gtrec"))
    log = (UNSEEN_B / "tv_jpeg_decode_few_workers-as_is.log").read_text()
    wall = float(next(line.split()[1] for line in log.splitlines() if line.startswith("first_step ")))
    first_step = wall - rep["session"]["start_wall"]
    phases = [p["phase"] for p in rep["phases"]]
    assert phases[-2:] == [ph.WARMUP, ph.TRAINING] and ph.RUNNING in phases, rep["phases"]
    training = [p["t"] for p in rep["phases"] if p["phase"] == ph.TRAINING]
    assert training[0] > first_step, (rep["phases"], first_step)
    assert (rep["primary_verdict"] or {}).get("id") == "input_bound", rep["verdict_timeline"]
    # (host_bound holds live while the main thread encodes the JPEGs with the GPU idle, before
    # training: never once training is judged)
    assert not [v for v in rep["verdict_timeline"] if v["id"] == "host_bound" and v["active"]
                and v["t"] >= training[0]], rep["verdict_timeline"]


def test_only_the_first_warm_up_waits_for_a_first_step_without_a_dataloader():
    """A loop whose steps the probe never counts (a hand-written update under torch.compile) shows
    a backward pass with no step ended for ever: after its first judged stretch, an evaluation's
    warm-up must settle on its readings as any other, not wait WARMUP_MAX_S again."""
    from gputop.derive.budget_processor import BudgetProcessor
    from gputop.model import Sample

    probe = [Sample(float(t), "probe_step", "1", {"step_total": 0, "batch_total": 0}) for t in range(0, 60)]
    proc = BudgetProcessor()
    pending = [_pending_span(proc, a, probe) for a in range(10, 20)]
    assert all(pending), pending                       # the first warm-up: inside the first step
    proc.tracker.training_since = 5.0                  # once judged, a later warm-up does not wait
    assert not any(_pending_span(proc, a, probe) for a in range(30, 35))


def _pending_span(proc, a: int, probe: list) -> bool:
    """Whether the budget processor's span [a, a+1] of backward-pass moments is judged inside the first step."""
    from gputop.derive.budget import Moment, Naming

    seen = []
    real = proc._judge_span
    proc._judge_span = lambda *args, **kw: seen.append(args[-1] if len(args) >= 7 else kw.get("first_step_pending"))
    try:
        backward = Naming(cat="python", frame="train (job.py:9)", path="job.py", leaf_owner="user", hint=fr.TRAIN)
        ms = [Moment(t=a + (i + 0.5) * 0.05, dt=0.05, busy=0.5, naming=backward) for i in range(20)]
        proc._judge_moments(ms, a + 1.0, [p for p in probe if p.t <= a + 1.0])
    finally:
        proc._judge_span = real
    return bool(seen and seen[-1])


def test_the_thread_states_look_starts_where_the_judged_stretch_does():
    """The rules read the main thread's states beside the budget, whose window never reaches
    before the phase; the states did (their 10 s horizon): 4 s into a Lightning job's training
    its share waiting on the GPU read 12% (its warm-up in the look), 27% once training filled it.
    Now the look starts at the judged stretch (phases.look_start), in warm-up at the warm-up's start."""
    from gputop.catalogue import KIND_PHASE
    from gputop.derive.threads import ThreadStateProcessor
    from gputop.model import Sample

    proc, store = ThreadStateProcessor(), SampleStore()
    store.on_samples([Sample(100.0, KIND_PHASE, "main", {"phase": ph.TRAINING, "since": 101.0,
                                                          "training_since": 100.5})])
    assert proc.look_since(store, 104.0) == 100.5           # the judged stretch's start
    assert proc.look_since(store, 130.0) == 120.0           # its horizon, once the stretch is longer
    store.on_samples([Sample(131.0, KIND_PHASE, "main", {"phase": ph.WARMUP, "since": 129.0, "training_since": None})])
    assert proc.look_since(store, 133.0) == 129.0           # the warm-up's own seconds
    store.on_samples([Sample(140.0, KIND_PHASE, "main", {"phase": ph.ENDED, "since": 139.0, "training_since": 110.0})])
    assert proc.look_since(store, 141.0) == 131.0           # ended: the horizon (py-spy's final window in it)
    assert ph.look_start(None, 1.0, 2.0) is None


def test_warm_up_never_lasts_longer_than_its_ceiling():
    t = ph.PhaseTracker()
    seen = _train(t, [1000 * 0.93 ** i for i in range(40)])   # 7% faster each second: never levels off
    first = next(tt for tt, p in seen if p == ph.TRAINING)
    assert abs(first - (10.0 + ph.WARMUP_MAX_S)) <= 1.0


def test_after_an_evaluation_training_at_its_old_step_time_is_judged_at_once():
    t = ph.PhaseTracker()
    _train(t, [300, 150, 100, 100, 100, 100, 100])
    assert t.phase == ph.TRAINING
    t.window(20.0, 24.0, Counter({fr.EVAL: 30}), 40, 0.1, 0)
    assert t.phase == ph.EVALUATION
    seen = _train(t, [101, 99, 100], t0=24.0)
    assert [p for _, p in seen] == [ph.WARMUP, ph.TRAINING, ph.TRAINING]


def test_without_a_probe_a_periodic_stall_is_not_a_warm_up():
    """A loop that checkpoints every 4 s: its GPU busy share per second drops in every save, but
    its busier seconds are level, so it settles (it waited 30 s when single seconds decided)."""
    t = ph.PhaseTracker()
    busy = [1.0, 1.0, 0.1, 1.0, 1.0, 1.0, 0.1, 1.0, 1.0, 0.1]
    for i, b in enumerate(busy):
        t.window(10.0 + i, 11.0 + i, TRAIN, 40, 0.025, 0, readings=[(11.0 + i, "busy", b)])
    assert t.phase == ph.TRAINING and t.training_since - 10.0 < 10.0


def test_a_job_attached_late_gets_the_primary_it_got_watched_from_its_start(tmp_path):
    """HF Trainer on GPT-2, recorded on the H200 from its start: the report of the same file cut
    5 s into training, with the state a fresh attach reads, names the same primary."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from corpus_score import crop

    src = REAL / "hf_trainer-run.gtrec"
    full = build_report(str(src))
    start = next(p["t"] for p in full["phases"] if p["phase"] == ph.WARMUP)
    late = tmp_path / "late.gtrec"
    crop(str(src), str(late), start + 5.0)
    rep = build_report(str(late))
    assert full["primary_verdict"]["id"] == rep["primary_verdict"]["id"] == "host_bound"
    assert rep["phases"][0]["phase"] == ph.WARMUP     # it does not know the job settled before


def test_the_gain_of_a_fix():
    assert abs(fix_gain(0.2) - 0.25) < 1e-9          # a step 20% shorter: 1.25x the steps/s
    assert fix_gain(0.0) == 0.0
    assert fix_gain(2.0) == fix_gain(MAX_LOSS) == fix_gain(0.99)   # bounded: 100x at most
    assert gain_text(0.25) == "fixing this: up to +25% steps/s"
    assert gain_text(2.0) == "fixing this: up to 3.0x steps/s"


# -- the engine: the live primary holds still -------------------------------------------------

class Cause:
    def __init__(self, vid: str, loss: float):
        self.vid, self.loss, self.level = vid, loss, 1.5
        self.__name__ = vid

    def __call__(self, sig):
        return Finding(id=self.vid, title=self.vid, severity=SEVERITY_WARNING, level=self.level,
                       lost_share=self.loss, confidence=1.0, evidence={}, advice="", summary=self.vid)


def _primaries(engine, store, seconds: int, t0: int = 0, each=None) -> list:
    out = []
    for t in range(t0, t0 + seconds):
        if each:
            each(t)
        got = [s for s in engine.process(store, float(t)) if s.kind == "verdict_primary"]
        out.append(got[-1].get("id"))
    return out


def test_the_live_primary_changes_only_after_a_challenger_led_long_enough():
    a, b = Cause("input_bound", 0.30), Cause("host_bound", 0.20)
    engine = VerdictEngine(rules=[a, b])
    store = SampleStore()
    got = _primaries(engine, store, 40)
    assert set(got[5:]) == {"input_bound"}
    b.loss = 0.40                         # host_bound leads now, by 10 points
    got = _primaries(engine, store, int(PRIMARY_SWITCH_S) + 5, t0=40)
    switched = got.index("host_bound")
    assert PRIMARY_SWITCH_S - 1 <= switched <= PRIMARY_SWITCH_S + 1, got
    b.loss = 0.32                         # a lead of 2 points: never enough
    a.loss = 0.30
    engine2 = VerdictEngine(rules=[a, Cause("host_bound", 0.20)])
    _primaries(engine2, store, 40)
    engine2.rules[1].loss = 0.32
    assert set(_primaries(engine2, store, 60, t0=40)) == {"input_bound"}


def test_a_primary_that_ends_is_replaced_at_once():
    a, b = Cause("input_bound", 0.30), Cause("host_bound", 0.20)
    engine = VerdictEngine(rules=[a, b])
    store = SampleStore()
    _primaries(engine, store, 40)
    a.level = 0.0                          # its rule stops holding: off after LEAVE_S
    got = _primaries(engine, store, 12, t0=40)
    assert got[-1] == "host_bound" and got.index("host_bound") <= 7


def test_the_gpu_idle_fallback_gives_way_at_once_when_a_cause_explains_the_idle():
    """gpu_idle is "nothing explains the idle"; once a cause that explains it is on (a recompile on
    the H200's compile_varlen, 4 s after gpu_idle came on), it leaves in the same evaluation instead
    of after LEAVE_S, so the cause is the primary as soon as it is on, with no "none" between
    (there: 8.9 s after the warm-up, was 11.9 s). With no cause it still leaves only after LEAVE_S
    (its own signal's hysteresis)."""
    from gputop.verdicts.engine import ENTER_S, LEAVE_S

    idle = Cause("gpu_idle", 1.0)
    cause = Cause("recompilation", 0.9)
    cause.level = 0.0
    engine = VerdictEngine(rules=[cause, idle])
    store = SampleStore()
    assert _primaries(engine, store, 10)[-1] == "gpu_idle"
    cause.level = 1.5
    got = _primaries(engine, store, 6, t0=10)
    assert got.index("recompilation") <= ENTER_S + 1, got
    assert None not in got, got            # straight from the fallback to the cause
    assert not engine.states["gpu_idle"].active
    cause.level, idle.level = 0.0, 0.0     # nothing holds: the fallback's own hysteresis again
    engine2 = VerdictEngine(rules=[Cause("gpu_idle", 1.0)])
    _primaries(engine2, store, 10)
    engine2.rules[0].level = 0.0
    got = _primaries(engine2, store, int(LEAVE_S) + 2, t0=10)
    assert got[int(LEAVE_S) - 2] == "gpu_idle" and got[-1] is None, got


def test_the_probe_join_keeps_each_windows_idle_time():
    """derive/moments._calibrate moves the GPU's idle time between the moments in next(DataLoader)
    and the others within a probe window, without changing its total where the counters gave it at
    least the probe's idle before the batches (as in these cases; where they gave less, the next
    test): both when the data wait gets more of it and when it gets less. The samples in the wait
    are the probe's share of the window here (6 of 20 for a 0.3 wait), so no weight moves them."""
    from gputop.derive.budget import DATA, Moment, Naming
    from gputop.derive.moments import _calibrate
    from gputop.model import Sample

    data, cpu = Naming(DATA, None, None, "user", None), Naming("python", None, None, "user", None)

    def window(pre_batch_share):
        # 10 steps of 100 ms whose GPU span is (1 - share) of each: share idle before each batch
        return Sample(1.0, "probe_step", "1", {"step_n": 10, "step_s_sum": 1.0, "gpu_n": 10,
                                                "gpu_s_sum": 1.0 - pre_batch_share, "data_wait_s_sum": 0.3,
                                                "window_s": 1.0})

    for busy_data, busy_rest, share in ((0.9, 0.2, 0.6), (0.1, 0.9, 0.05), (0.5, 0.0, 0.1)):
        ms = [Moment(0.05 * i + 0.025, 0.05, busy_data if i < 6 else busy_rest, data if i < 6 else cpu)
              for i in range(20)]
        before = sum((1 - m.busy) * m.dt for m in ms)
        _calibrate(ms, [window(share)])
        after = sum((1 - m.busy) * m.dt for m in ms)
        assert abs(before - after) < 1e-9, (busy_data, busy_rest, share)
        assert all(0.0 <= m.busy <= 1.0 for m in ms)
        data_idle = sum((1 - m.busy) * m.dt for m in ms if m.naming.cat == DATA)
        want = min(share * 1.0, 0.3)
        assert before >= want
        if before - want > 0.7:      # more idle than the other moments (0.7 s) can hold: the join stays
            assert abs(data_idle - 6 * 0.05 * (1 - busy_data)) < 1e-9
        else:
            assert abs(data_idle - want) < 1e-9


def test_the_probe_join_trusts_the_probes_data_wait_over_the_samples_and_the_counters():
    """Where py-spy's samples in next(DataLoader) are fewer than the probe's timed wait (a handful a
    window), they stand for the probe's share of the window (weights), so the data wait's idle is
    the probe's; where the counters' smeared average gave the window less idle than the probe timed
    on the GPU before the batches, the window gets the probe's; the budget still sums to 1."""
    from gputop.derive.budget import DATA, Budget, Moment, Naming
    from gputop.derive.moments import _calibrate
    from gputop.model import Sample

    data, cpu = Naming(DATA, None, None, "user", None), Naming("python", None, None, "user", None)
    # the probe: 30% of the step time in the data wait, 30% of the window idle before the batches
    w = Sample(1.0, "probe_step", "1", {"step_n": 10, "step_s_sum": 1.0, "gpu_n": 10, "gpu_s_sum": 0.7,
                                        "data_wait_s_sum": 0.3, "window_s": 1.0})
    # py-spy caught 2 of 20 samples in the wait (10%), and the counters say 25% idle
    ms = [Moment(0.05 * i + 0.025, 0.05, 0.0 if i < 2 else 1.0 - 0.15 / 0.9, data if i < 2 else cpu)
          for i in range(20)]
    _calibrate(ms, [w])
    b = Budget()
    for m in ms:
        b.add(m)
    assert abs(b.seconds[DATA] - 0.3) < 1e-9            # the probe's, not 2 samples' 0.1 s
    assert abs(b.total_s - 1.0) < 1e-9 and all(0.0 <= m.busy <= 1.0 for m in ms)
    assert abs(sum(b.seconds.values()) - b.total_s) < 1e-9


def test_after_a_sync_the_waits_that_follow_get_the_idle_and_the_window_keeps_it():
    """derive/moments._drain_waits: a sync empties the GPU's queue, so a sleep, lock or file
    wait right after it keeps the GPU idle; a named blocking wait (sleep, lock, select, a child
    process) launches nothing, so it gets the idle wherever it falls; a file wait after Python
    code does not (a checkpoint's writes interleave with its serialising). The idle comes from the
    syncs first, then the others; the window's idle is kept."""
    from gputop.derive.budget import BLOCKED, IO, SYNC, Moment, Naming
    from gputop.derive.moments import _drain_waits

    def nm(cat):
        return Naming(cat, None, None, "user", None)
    sync, blocked, io, cpu = nm(SYNC), nm(BLOCKED), nm(IO), nm("python")
    # cpu, sync, sync, blocked, io, cpu, io, blocked: the second io follows Python code
    cats = [cpu, sync, sync, blocked, io, cpu, io, blocked]
    busy = [0.6, 0.5, 0.5, 0.5, 0.5, 0.9, 0.5, 0.5]
    ms = [Moment(0.1 * i, 0.1, b, c) for i, (b, c) in enumerate(zip(busy, cats))]
    before = sum((1 - m.busy) * m.dt for m in ms)
    _drain_waits(ms)
    assert abs(sum((1 - m.busy) * m.dt for m in ms) - before) < 1e-12
    # drained: the waits after the syncs and the last blocked wait (need 0.15 s of idle)
    assert ms[3].busy == 0.0 and ms[4].busy == 0.0 and ms[7].busy == 0.0
    assert ms[1].busy == 1.0 and ms[2].busy == 1.0          # a thread waiting on the GPU: busy (0.1 s)
    # the other 0.05 s from the others' 0.1 s of idle: each keeps half of its idle
    assert [round(ms[i].busy, 9) for i in (0, 5, 6)] == [0.8, 0.95, 0.75]
    # the syncs' idle runs out: the rest comes from the other moments, and the window keeps its idle
    ms = [Moment(0.1 * i, 0.1, b, c) for i, (b, c) in enumerate(zip([0.2, 0.9, 0.9, 0.9], [cpu, sync, blocked, io]))]
    before = sum((1 - m.busy) * m.dt for m in ms)
    _drain_waits(ms)
    assert abs(sum((1 - m.busy) * m.dt for m in ms) - before) < 1e-12
    assert ms[1].busy == 1.0 and ms[0].busy > 0.2 and all(0.0 <= m.busy <= 1.0 for m in ms)
    assert ms[2].busy < 0.9 and ms[3].busy < 0.9


def test_a_line_where_the_probe_counted_syncs_is_a_sync_for_the_waits_after_it():
    """A copy of a pageable batch (Accelerate's send_to_device) waits for the GPU's previous step
    while CUDA spins on the CPU: py-spy and the kernel see Python code. The probe counted a device
    sync at that line, so the file write after it is drained like one after .item(): the GPU had
    nothing queued. The line keeps its category (a pageable copy is also host-side transfer work,
    host_bound's and h2d_copy_bound's to weigh), and a line the probe did not count is not a sync.
    The lock wait between them (a metrics client's log()) is drained either way."""
    from gputop.derive.budget import BLOCKED, IO, Moment, Naming
    from gputop.derive.moments import _drain_waits, sync_sites

    site = "/x/accelerate/utils/operations.py:160"
    copy = Naming("python", "send_to_device (operations.py:160)", "/x/accelerate/utils/operations.py", "library",
                  None, site=site)
    lock = Naming(BLOCKED, "MetricsClient.log (job.py:31)", "/x/job.py", "user", None, site="/x/job.py:31")
    write = Naming(IO, "write_log (job.py:40)", "/x/job.py", "user", None, site="/x/job.py:40")
    sites = sync_sites({"total": 268, "lines": [[site, 268], ["bad"], [3, 4], ["/x/other.py:1", 0]]})
    assert sites == frozenset({site})

    def window():
        return [Moment(0.1 * i, 0.1, 0.5, c) for i, c in enumerate([copy, copy, lock, write])]
    ms = window()
    _drain_waits(ms, sites)
    assert [m.busy for m in ms] == [1.0, 1.0, 0.0, 0.0]
    assert all(m.naming.cat == c for m, c in zip(ms, ("python", "python", BLOCKED, IO)))
    ms = window()
    _drain_waits(ms)          # no probe: nothing says the copy waited on the GPU; the lock still launches nothing
    assert ms[2].busy == 0.0 and [round(ms[i].busy, 9) for i in (0, 1, 3)] == [round(1 - 0.5 * 2 / 3, 9)] * 3


def test_a_sample_on_a_with_lock_line_is_a_wait_for_the_lock():
    """``with self.lock:`` acquires in C, so py-spy's innermost frame is that line: an uncontended
    acquire takes nanoseconds, a sample there is a wait. Names that merely contain "lock" are not."""
    from gputop.derive import frame_rules as fr

    frames, stack = [["MetricsClient.log", "/x/job.py", 31]], [0]
    for line in ("with self.lock:", "    with self._lock:", "with LOCK:", "with self.buffer_lock, other:",
                 "with mutex as m:", "with self._rlock:", "with self.db_lock.read():"):
        assert fr.classify(frames, stack, line)[0] == fr.IDLE, line
    for line in ("with self.block:", "with clock:", "with torch.no_grad():", "with threading.Lock():",
                 "with self.lock_file(path):", "x = lock_count + 1"):
        assert fr.classify(frames, stack, line)[0] == fr.PYTHON, line
    # select: the select module's call waits; a tensor's select() indexes (a blocking wait is now
    # given the GPU's idle wherever it falls, so a tensor line must not read as one)
    for line in ("r, _, _ = select.select([fd], [], [], 1.0)", "ready = select(rlist, [], [])"):
        assert fr.classify(frames, stack, line)[0] == fr.IDLE, line
    for line in ("row = x.select(0, i)", "h = torch.select(h, 1, -1)", "y = preselect(x)"):
        assert fr.classify(frames, stack, line)[0] == fr.PYTHON, line


def test_recompile_cost_is_the_recompiling_steps_excess_where_dynamos_clock_explains_it():
    """derive/steps.py, StepPool.recompile_cost_share: 10 steps of 10 ms and one of 10 s in a
    minute: the median step is one whose guard held, and the excess over it (99%) is the cost
    where dynamo's clock explains at least half of it; a slow step dynamo did not see (a
    checkpoint) is not a recompile's, and without steps or without dynamo's record nothing moves."""
    from gputop.derive.steps import StepPool
    from gputop.probe import wire

    hist = {wire.hist_bucket(0.010): 10, wire.hist_bucket(10.0): 1}

    def pool(recompile_s, compile_s=None, steps=11, step_s=10.1):
        return StepPool(timed_steps=steps, step_s_sum=step_s, step_hist=hist if steps else {},
                        compile_s=compile_s if compile_s is not None else recompile_s,
                        recompile_s=recompile_s, compile_observed_s=step_s)

    excess = (10.1 - 11 * pool(8.0).step_ms_percentile(50) / 1000.0) / 10.1   # seconds beyond a typical step
    assert excess > 0.98
    assert abs(pool(8.0).recompile_cost_share - max(8.0 / 10.1, excess)) < 1e-12   # dynamo: 79%, the steps: 99%
    assert pool(1.0).recompile_cost_share == 1.0 / 10.1                 # dynamo explains < half: its own
    # dynamo's seconds, not its share of a longer watched time (a first compile's stretch without
    # steps), are what explain the excess: 6 s of 10 s recompiling over 40 s watched still do
    far = StepPool(timed_steps=11, step_s_sum=10.1, step_hist=hist, compile_s=6.0, recompile_s=6.0,
                   compile_observed_s=40.0)
    assert far.recompile_cost_share > 0.98
    assert pool(0.0, compile_s=0.0).recompile_cost_share == 0.0
    assert StepPool().recompile_cost_share is None                      # no dynamo record
    assert pool(5.0, steps=0, step_s=0.0).recompile_cost_share is None   # (share over no watched time)


def test_the_reports_session_gain_of_a_budget_cause_is_its_training_budget_share():
    """verdicts/causal.py session_loss and report._session_gain: the primary's gain for a cause the
    time budget measures is the training budget's share of its category (capped by the GPU's idle
    share); a cause the probe times (input_bound) or the GPU's own view measures keeps its own."""
    from gputop.report import _session_gain
    from gputop.verdicts.causal import fix_gain, session_basis, session_loss

    shares = {"gpu_busy": 0.36, "io": 0.53, "cpu": 0.05, "data": 0.2}
    assert session_loss("io_stall", shares) == 0.53
    assert session_loss("input_bound", shares) is None and session_loss("launch_bound", shares) is None
    assert session_loss("io_stall", {"gpu_busy": 0.6, "io": 0.53}) == 0.4     # never above the idle
    assert session_loss("io_stall", {}) is None
    out = {"verdicts": {"io_stall": {"evidence": {"fix_gain_pct": 135.0}},
                        "launch_bound": {"evidence": {"fix_gain_pct": 50.0}}},
           "primary_verdict": {"id": "io_stall", "gain_pct": 135.0, "gain_from": "held"},
           "budget": {"training": {"shares": shares}},
           "probe": {"ranks": [{"pid": "7", "slow_step_excess": 0.41}], "summary": {"slowest": {"pid": "7"}}}}
    _session_gain(out)
    want = round(fix_gain(0.53) * 100.0, 1)
    assert out["primary_verdict"]["gain_pct"] == out["verdicts"]["io_stall"]["evidence"]["fix_gain_pct"] == want
    assert out["primary_verdict"]["gain_from"] == "budget"
    assert out["verdicts"]["launch_bound"]["evidence"]["fix_gain_pct"] == 50.0
    # a cost on some steps only: the steps' excess over the median step, where it is larger than
    # the budget's file I/O share (a debug dump's copies and relaunch are not file I/O), never
    # above the idle; other causes never take it
    assert session_loss("io_stall", shares, 0.60) == 0.60
    assert abs(session_loss("io_stall", shares, 0.70) - 0.64) < 1e-9
    assert session_loss("io_stall", shares, 0.41) == 0.53
    assert session_loss("loop_blocked", {"gpu_busy": 0.36, "blocked": 0.2}, 0.6) == 0.2
    # slow steps the file I/O does not explain (an evaluation, a recompile between two steps) are
    # not the writes': 6% of file I/O never takes an excess of 56%
    assert session_loss("io_stall", {"gpu_busy": 0.3, "io": 0.06}, 0.56) == 0.06
    # without GPU counters there is no idle share to cap it: the budget's share stands
    assert session_loss("io_stall", {"io": 0.2}, 0.5) == 0.2
    assert session_basis("io_stall", shares, 0.70) == "idle" and session_basis("io_stall", shares, 0.41) == "budget"
    out["probe"]["ranks"][0]["slow_step_excess"] = 0.60
    _session_gain(out)
    assert out["primary_verdict"]["gain_pct"] == round(fix_gain(0.60) * 100.0, 1)
    assert out["primary_verdict"]["gain_from"] == "steps"


def test_the_report_counts_the_live_primary_changing_in_judged_time_only():
    """verdicts/summary.py: ``primary_changes`` counts the live primary going from one verdict to
    another while the job was judged (training): X, none, X is no change; X, none, Y is one; a
    change during an evaluation or the start-up is not counted."""
    from gputop.model import Sample
    from gputop.verdicts.summary import summarize_verdicts

    def prim(t, vid, phase="training"):
        return Sample(float(t), "verdict_primary", "main", {"id": vid, "phase": phase})

    ids = ["a", "a", None, "a", "b", None, "c", "c"]
    samples = [prim(t, v) for t, v in enumerate(ids)] + [prim(8, "d", "evaluation"), prim(9, "c")]
    out = summarize_verdicts(samples, 0.0, 10.0)
    assert out["primary_changes"] == 2 and out["judged_s"] == 9.0, out     # a -> b, b -> c
