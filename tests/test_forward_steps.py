"""Steps of a job that steps no optimizer: the model's calls (gputop/probe/forward_steps.py).

In-process checks on real torch modules (how the model is found, what the probe leaves on the
job's objects: nothing that deepcopy or torch.save would carry), then an inference job end to
end under `gputop run`'s probe with a real monitor, against the job's own count.
"""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputop.derive.steps import pool_steps
from gputop.probe.core import Probe
from gputop.probe.forward_steps import ARM_AFTER_S, ENGAGE_S, LEARN_MAX_S, ForwardSteps
from gputop.session.launch import launch_with_probe
from gputop.sources.probe_client import KIND_PROBE_CONFIG, KIND_PROBE_STEP
from tests.test_probe import env_with_dir, finish, start_client, wait_for

ROOT = Path(__file__).resolve().parents[1]
INFER = str(ROOT / "tests" / "workloads" / "probe_infer.py")


class Block(torch.nn.Module):
    """One ReLU instance called four times per call, as torchvision's Bottleneck calls its one
    ReLU three times: looking that starts inside a Block sees it called at no depth it knows."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.relu = torch.nn.ReLU()
        self.on_call = None        # called inside forward (looking starts mid-call), then cleared

    def forward(self, x):
        x = self.relu(self.a(x))
        if self.on_call is not None:
            fn, self.on_call = self.on_call, None
            fn()
        x = self.relu(self.b(x))
        return self.relu(self.relu(x))


class Net(torch.nn.Module):
    def __init__(self, on_call=None) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.blocks[0].on_call = on_call

    def forward(self, x, fail: bool = False):
        for b in self.blocks:
            x = b(x)
            if fail:
                raise ValueError("a batch the model rejects")
        return x


def _armed(clock=None) -> tuple[Probe, ForwardSteps]:
    p = Probe(dormant=False, origin="install")
    p.torch = torch
    p.monitoring = True
    fs = ForwardSteps(p, torch)
    fs.t_torch -= ARM_AFTER_S + 1   # torch came in long enough ago
    return p, fs


def _global_hooks() -> int:
    m = torch.nn.modules.module
    return len(m._global_forward_hooks) + len(m._global_forward_pre_hooks)


def test_the_model_is_found_even_when_looking_starts_inside_a_nested_call_and_nothing_stays_on_it():
    p, fs = _armed()
    x = torch.randn(2, 8)
    net = Net(on_call=lambda: fs.tick(p_now()))   # the probe thread's tick lands inside a Block's call
    other = Net()                                 # another instance of the class: never a step
    before = _global_hooks()
    try:
        with torch.inference_mode():
            net(x)                    # learning starts inside its first Block (3 ReLU calls to come)
            assert fs.state == "learning"
            with pytest.raises(ValueError):
                net(x, fail=True)     # an exception inside a call changes nothing
            net(x)
            net(x)                    # the third top-level call of the same module: found
        assert fs.state == "on" and fs.model_ref() is net, (fs.state, fs.why)
        assert fs.model_name.endswith(".Net"), fs.model_name
        assert _global_hooks() == before, "the learning hooks must go once the model is known"
        # Nothing on the instance: a deep copy and torch.save carry no probe function.
        assert not net._forward_hooks and not net._forward_pre_hooks
        twin = copy.deepcopy(net)
        buf = io.BytesIO()
        torch.save(net, buf)
        assert buf.tell() > 0
        fs.first_call_t = p_now() - ENGAGE_S - 1      # engaged: calls are steps from now on
        n0 = p.step_total
        with torch.inference_mode():
            for _ in range(5):
                net(x)
                other(x)
                twin(x)
        assert p.step_total - n0 == 5, "only the model's own calls are steps (not a copy, not a twin)"
        assert p.step_source == "forward"
        # An optimizer step seen later: the probe's class __call__ goes, the class is torch's again.
        p.step_source = "optimizer"
        fs.tick(p_now())
        assert fs.state == "off" and "optimizer" in fs.why
        assert "__call__" not in Net.__dict__
        n1 = p.step_total
        with torch.inference_mode():
            net(x)
        assert p.step_total == n1
    finally:
        fs.stop("test over")
    assert "__call__" not in Net.__dict__ and _global_hooks() == before


def test_calls_before_engaging_and_during_a_training_job_are_not_steps():
    p, fs = _armed()
    net, x = Net(), torch.randn(2, 8)
    try:
        fs.tick(p_now())
        with torch.no_grad():
            for _ in range(6):
                net(x)
        assert fs.state == "on"
        assert p.step_total == 0, "calls in the first ENGAGE_S seconds are not steps (a training job's first forwards)"
    finally:
        fs.stop("test over")
    # A job that steps an optimizer never arms: no global hooks, ever.
    p2, fs2 = _armed()
    p2.step_source = "optimizer"
    before = _global_hooks()
    fs2.tick(p_now())
    assert fs2.state == "off" and _global_hooks() == before
    assert p2.hooks["forward_steps"][0] == "off" and "optimizer" in p2.hooks["forward_steps"][1]


class Counted(torch.nn.Module):
    """A base class with a __call__ of its own (as some libraries wrap calls): the probe's
    __call__ on a subclass must go through it, and leave it as it was."""

    def __call__(self, *args, **kwargs):
        self.seen = getattr(self, "seen", 0) + 1
        return super().__call__(*args, **kwargs)


class Sub(Counted):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)


def test_a_base_classs_own_call_still_runs_and_is_left_as_it_was():
    p, fs = _armed()
    m, x = Sub(), torch.randn(2, 8)
    base_call = Counted.__dict__["__call__"]
    try:
        fs.tick(p_now())
        with torch.no_grad():
            for _ in range(5):
                m(x)
        assert fs.state == "on" and fs.model_ref() is m
        assert m.seen == 5, "every call still goes through the base class's __call__"
    finally:
        fs.stop("test over")
    assert "__call__" not in Sub.__dict__ and Counted.__dict__["__call__"] is base_call


class Normalize(torch.nn.Module):
    """A transform: an nn.Module without parameters, called per sample by a Dataset."""

    def forward(self, x):
        return (x - x.mean()) / (x.std() + 1e-6)


def test_a_transform_called_per_sample_in_the_loops_thread_is_not_the_model():
    p, fs = _armed()
    norm, net = Normalize(), Net()
    try:
        fs.tick(p_now())
        with torch.no_grad():
            for _ in range(4):                                          # four batches of eight samples
                batch = torch.stack([norm(torch.randn(8)) for _ in range(8)])  # (num_workers=0)
                net(batch)
        assert fs.state == "on" and fs.model_ref() is net, fs.model_name
    finally:
        fs.stop("test over")


def test_a_freed_model_is_looked_for_again_and_a_slow_load_does_not_give_up():
    import gc
    p, fs = _armed()
    x = torch.randn(2, 8)
    try:
        t = p_now()
        fs.tick(t)
        assert fs.state == "learning"
        fs.tick(t + LEARN_MAX_S * 3)        # nothing called yet (a model still loading): still looking
        assert fs.state == "learning"
        first = Sub()
        with torch.no_grad():
            for _ in range(3):
                first(x)
        assert fs.state == "on" and fs.model_ref() is first
        del first
        gc.collect()
        fs.tick(p_now())                     # the next checkpoint: the old model is gone
        assert fs.state == "waiting" and "__call__" not in Sub.__dict__
        fs.tick(p_now())
        second = Sub()
        with torch.no_grad():
            for _ in range(3):
                second(x)
        assert fs.state == "on" and fs.model_ref() is second
    finally:
        fs.stop("test over")
    # looking gives up LEARN_MAX_S after the first top-level call, not after arming
    p2, fs2 = _armed()
    fs2.tick(p_now())
    with torch.no_grad():
        Normalize()(x)                       # one call: no model (no parameters)
    fs2.tick(p_now() + LEARN_MAX_S + 1)
    assert fs2.state == "off" and _global_hooks() == 0 or fs2.state == "off"


def test_torch_compile_of_the_found_model_traces_nothing_of_the_probe():
    """HF's static-cache generate compiles ``model.__call__``: the probe's ``__call__`` is then in
    what dynamo traces. It must add no guard on the probe's state (a recompile when the probe
    stops) and no graph break (fullgraph=True would raise in the job)."""
    import torch._dynamo
    import torch._dynamo.utils as du
    p, fs = _armed()
    net, x = Normalize(), torch.randn(2, 8)
    net.fc = torch.nn.Linear(8, 8)     # (parameters: a model; Sub's base class counts calls in an attribute)
    torch._dynamo.reset()
    try:
        fs.tick(p_now())
        with torch.no_grad():
            for _ in range(4):
                net(x)
        assert fs.state == "on"
        fs.first_call_t = p_now() - ENGAGE_S - 1
        compiled = torch.compile(net.__call__, backend="eager", fullgraph=True)
        with torch.no_grad():
            for _ in range(3):
                compiled(x)
            graphs = du.counters["stats"]["unique_graphs"]
            fs.stop("torch.compile is in use")    # what the probe thread's next tick does
            for _ in range(3):
                compiled(x)
        assert graphs >= 1 and du.counters["stats"]["unique_graphs"] == graphs, dict(du.counters["stats"])
        assert not du.counters["graph_break"], dict(du.counters["graph_break"])
    finally:
        fs.stop("test over")
        torch._dynamo.reset()


def test_a_forked_child_turns_it_off():
    """A DataLoader worker forked while the probe looks inherits the hook and the class's
    __call__ but not the probe thread that would take them out."""
    p, fs = _armed()
    net, x = Sub(), torch.randn(2, 8)
    before = _global_hooks()
    try:
        fs.tick(p_now())
        assert _global_hooks() == before + 1
        fs.after_fork_in_child()           # what the probe's at-fork handler calls in the child
        assert fs.state == "off" and _global_hooks() == before
        with torch.no_grad():
            for _ in range(4):
                net(x)
        assert "__call__" not in Sub.__dict__ and p.step_total == 0
    finally:
        fs.stop("test over")


def p_now() -> float:
    import time
    return time.monotonic()


@pytest.mark.timeout(180)
def test_an_inference_loop_gets_the_models_calls_as_steps(tmp_path):
    """A CPU inference job under the probe `gputop run` loads: no optimizer, a DataLoader, the
    model and a second instance of its class called per batch. The probe's steps are the
    model's calls (not the twin's), timed as the job times them, and the job's deepcopy and
    torch.save of the model still work."""
    d, hold, out = tmp_path / "sock", tmp_path / "hold", tmp_path / "out.json"
    seconds = 26.0
    log = open(tmp_path / "job.log", "w")
    job = launch_with_probe([sys.executable, INFER, "--seconds", str(seconds), "--wait-monitor", "90",
                             "--hold-file", str(hold), "--out", str(out)],
                            env=env_with_dir(d), stdout=log, stderr=subprocess.STDOUT)
    src = None
    try:
        src, col = start_client(job.pid)
        wait_for(out.exists, 150, "the job to finish its loop", job=job)
        own = json.loads(out.read_text())

        def settled():   # two windows in a row with the same step total: the job's last step is in
            tot = [s.get("step_total") for s in col.of(KIND_PROBE_STEP)][-2:]
            return len(tot) == 2 and tot[0] == tot[1] and (tot[0] or 0) > 0

        wait_for(settled, 20, "the probe's last windows", job=job)
        cfg = col.last(KIND_PROBE_CONFIG)
        windows = col.of(KIND_PROBE_STEP)
        assert finish(job, hold) == 0
    finally:
        if src is not None:
            src.stop()
        if job.poll() is None:
            job.kill()
            job.wait()
        log.close()
    log_text = (tmp_path / "job.log").read_text()
    assert "Traceback" not in log_text, log_text[-2000:]
    assert cfg.get("step_source") == "forward"
    state, why = cfg.get("hooks")["forward_steps"]
    assert state == "on" and "Classifier" in why, (state, why)
    calls = own["calls"]
    total = windows[-1].get("step_total")
    # Steps start once looking began (ARM_AFTER_S after torch came in) and the model had been
    # called for ENGAGE_S, and every call of the model from then on is one: the job's last
    # `total` calls. Counting the twin's calls too would make twice as many.
    assert 0 < total <= len(calls), (total, len(calls))
    assert total >= 0.1 * len(calls), (total, len(calls))
    pool = pool_steps(windows)
    own_s = calls[-1] - calls[-total]
    assert pool.timed_steps == total - 1, (pool.timed_steps, total)
    # the same calls, timed by the probe at the end of each and by the job just after
    assert abs(pool.step_s_sum - own_s) <= 0.02 * own_s + 0.05, (pool.step_s_sum, own_s)
    assert own["hooks_on_model"] == 0 and own["twin_ok"] and own["saved_bytes"] > 0


def test_the_steps_view_of_a_traced_inference_loop():
    """The H100 recording of the ResNet-50 batch-1 inference loop (seventh session of 2026-12-06,
    GPUTOP_KERNEL_SAMPLE=1): at 80 columns the Steps view says where its steps come from, shows the
    traced kernels beside the GPU's span, and says it saw no DataLoader rather than "0 batches/s"
    (which would read as a stalled input pipeline)."""
    from gputop.session.recording import RecordingReader
    from tests.replay_view import view_text

    rec = (ROOT / "benchmarks" / "results" / "h100-forward-steps-1206k" / "traced" / "corpus"
           / "tv_resnet_batch1_infer-as_is.gtrec")
    traced = [s for s in RecordingReader(str(rec)).all_samples()
              if s.kind == "probe_step" and s.get("kernel_ms_per_step") and s.get("steps")]
    assert traced
    w = traced[len(traced) // 2]
    text = view_text(str(rec), w.t + 0.01, "steps", (80, 24))
    assert "(model calls: no optimizer step)" in text, text
    assert f"(kernels {w.get('kernel_ms_per_step'):.2f} ms)" in text, text
    assert "batches n/a (no DataLoader seen)" in text and "0 batch/step" not in text, text
