"""The probe's counters of torch's own records (issue 30): dynamo's compilations (probe/compiles.py)
and GradScaler's skipped steps (probe/amp_scaler.py), in this process with real torch (CPU) and
the real hooks installed, then removed. The one stand-in is a scaler whose loss scale lives on a
GPU (none here): the scale is then followed without a read, as torch moves it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gputop.probe import core  # noqa: E402
from gputop.probe.amp_scaler import ScalerWatch  # noqa: E402
from gputop.probe.compiles import CompileWatch  # noqa: E402
from gputop.probe.torch_hooks import TorchHooks  # noqa: E402


@pytest.fixture
def hooks():
    p = core.Probe(dormant=True, origin="test")
    h = TorchHooks(p, torch)
    p.torch, p.torch_hooks = torch, h
    h.install()
    try:
        yield h
    finally:
        h.uninstall()


def _metrics():
    import torch._dynamo.utils as du
    return du.get_compilation_metrics()


def test_a_compiled_optimizer_step_is_not_recompiled_by_the_probes_count(hooks):
    """torch.compile traces through the global optimizer hooks: the probe's counter, touched
    while dynamo traced, became a guard on its value and the step recompiled every step up to
    the recompile limit, then ran uncompiled (found by a review; torch 2.13)."""
    torch._dynamo.reset()
    m = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    step = torch.compile(opt.step, backend="eager")
    for _ in range(10):
        m(torch.randn(4, 16)).sum().backward()
        step()
        opt.zero_grad()
    reasons = [e.recompile_reason for e in _metrics() if e.recompile_reason]
    assert not any("optimizer_calls" in r or "gputop" in r for r in reasons), reasons
    assert not reasons, reasons


def test_compiles_before_a_monitor_came_are_not_a_windows_and_a_limit_keeps_its_function():
    torch._dynamo.reset()
    watch = CompileWatch()

    def shaped(x):
        return (x * 2).sin().sum()

    f = torch.compile(shaped, backend="eager", dynamic=False)
    for n in range(1, 5):            # before any monitor: a first compile and 3 recompiles
        f(torch.randn(n))
    watch.baseline()                  # a monitor comes
    first = watch.window()
    assert first["n"] == 0 and first["recompiles"] == 0 and first["s"] == 0.0, first
    old = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 6
    try:
        for n in range(5, 12):        # 2 more recompiles, then the limit
            f(torch.randn(n))
    finally:
        torch._dynamo.config.recompile_limit = old
    w = watch.window()
    assert w["recompiles"] == 2 and w["limit_hits"] >= 1, w
    assert 0 < w["rs"] <= w["s"], w   # the recompiles' own seconds
    assert w["top"]["function"] == "shaped" and "size mismatch" in w["top"]["reason"], w["top"]
    later = watch.window()            # nothing new: the limit's function is still known
    assert later["n"] == 0 and later["limit_hits_total"] >= 1 and later["limit_top"]["function"] == "shaped"


def test_a_recompiles_backward_graph_is_part_of_what_the_recompile_cost():
    """A new input shape recompiles the forward, and its first backward compiles a new backward
    graph: dynamo records that as a second entry under the same compile id, without a reason
    (aot_eager: AOTAutograd's real forward/backward split, fast on a CPU)."""
    torch._dynamo.reset()
    watch = CompileWatch()
    watch.window()
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    f = torch.compile(m, backend="aot_eager", dynamic=False)
    f(torch.randn(8, 16)).sum().backward()
    first = watch.window()
    assert first["recompiles"] == 0 and first["rs"] == 0.0 and first["s"] > 0, first
    f(torch.randn(9, 16)).sum()        # the forward recompiles (a size guard) ...
    fwd = watch.window()
    assert fwd["recompiles"] == 1 and fwd["rs"] > 0, fwd
    f(torch.randn(9, 16)).sum().backward()   # ... and its backward is compiled at the first backward
    bwd = watch.window()
    entries = [e for e in _metrics() if getattr(e, "is_forward", None) is False]
    assert len(entries) == 2, [(e.compile_id, e.is_forward) for e in _metrics()]
    assert bwd["recompiles"] == 0 and bwd["n"] == 1, bwd   # not another recompile ...
    assert bwd["rs"] == bwd["s"] > 0, bwd                  # ... but its seconds are the recompile's
    f(torch.randn(10, 16)).sum().backward()   # forward and backward in one window
    both = watch.window()
    assert both["recompiles"] == 1 and both["n"] == 2 and both["rs"] == both["s"], both


def _overflowing_step(scaler, opt, model, big: bool):
    x = torch.randn(8, 16) * (1e6 if big else 1.0)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def test_skips_are_counted_and_a_step_the_hook_cannot_see_is_not_a_skip(hooks):
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for big in (True, True, False, False, True):
        _overflowing_step(scaler, opt, model, big)
    t = hooks.scaler.totals()
    assert (t["steps"], t["skipped"], t["unknown"]) == (5, 3, 0), t
    assert t["scale_read"] and t["scale"] == scaler.get_scale(), t

    class Handmade:   # an optimizer that is not a torch.optim.Optimizer: torch's hook never fires
        def __init__(self, params):
            self.param_groups = [{"params": list(params)}]
            self.state = {}

        def step(self):
            for p in self.param_groups[0]["params"]:
                p.data.add_(p.grad, alpha=-1e-3)

        def zero_grad(self):
            for p in self.param_groups[0]["params"]:
                p.grad = None

    hand = Handmade(model.parameters())
    for big in (False, False, True):
        _overflowing_step(scaler, hand, model, big)
    t = hooks.scaler.totals()
    # its first good step is read from the scaler's found_inf (not a skip), then it is known to
    # step unseen and every later call is "unknown" -- never a false skip
    assert (t["steps"], t["skipped"], t["unknown"]) == (8, 3, 3), t


class _GpuScale:
    class device:
        type = "cuda"


class _GpuScaler:
    """A GradScaler's settings with its scale on a GPU (none on CI): what ScalerWatch reads."""
    _scale = _GpuScale()
    _init_scale, _backoff_factor, _growth_factor, _growth_interval = 1024.0, 0.5, 2.0, 3


def test_the_scale_on_a_gpu_is_followed_as_torch_moves_it():
    w = ScalerWatch(hooks=None)
    s = _GpuScaler()

    def iteration(*skips):
        w._since_update = list(skips)
        w._updated(s, None)
        return w.scale

    assert iteration(True) == 512.0                      # an inf: x0.5
    assert iteration(False, True) == 256.0               # any optimizer's inf backs off
    assert [iteration(False) for _ in range(3)] == [256.0, 256.0, 512.0]   # growth after 3 good ones
    w._since_update = [False]
    w._updated(s, 8.0)                                   # update(new_scale) sets it
    assert w.scale == 8.0
    for _ in range(200):
        iteration(True)
    assert w.scale == 0.0                                # float32 underflows to 0, as torch's does
    assert iteration(None) is None and iteration(False) is None   # a skip not seen: unknown from then on
