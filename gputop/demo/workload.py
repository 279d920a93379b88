"""The bundled demo workloads: small training loops, each with one known bottleneck.

Run as a child process by ``gputop demo`` (``python -m gputop.demo.workload --scenario NAME``).
It imports only the standard library and, when installed, torch — like a user's script would.
Scenarios use the GPU when torch sees one; those whose bottleneck only exists on a GPU refuse
to run without one (``gputop demo`` says so before starting them).

Every workload prints ``rate <steps_per_s> <total_steps>`` to stdout every ``--report-every``
seconds: its own measured throughput, so benchmarks can compare gputop's numbers with it.
Sizes are chosen to make the bottleneck unmistakable on an H200 and to stay small on a laptop.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from gputop.demo import real_loops


@dataclass(frozen=True)
class Scenario:
    name: str
    expect: str          # the verdict id gputop should name
    needs_gpu: bool
    about: str
    run: Callable
    needs: tuple[str, ...] = ()   # modules besides torch it imports (a framework)


class Meter:
    """Counts steps and prints the workload's own rate."""

    def __init__(self, every: float, duration: float):
        self.every, self.duration = every, duration
        self.t0 = self.last_t = time.perf_counter()
        self.steps = self.last_steps = 0

    def step(self) -> bool:
        """Count a step; False once the duration is over."""
        self.steps += 1
        now = time.perf_counter()
        if now - self.last_t >= self.every:
            print(f"rate {(self.steps - self.last_steps) / (now - self.last_t):.3f} {self.steps}", flush=True)
            self.last_t, self.last_steps = now, self.steps
        return now - self.t0 < self.duration


def _torch():
    import torch

    return torch


def _device(torch):
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _mlp(torch, width: int, depth: int, device, dtype=None):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype)


def _train_step(torch, model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


# ---------------------------------------------------------------------------------------------
# Scenarios


def pure_python(m: Meter) -> None:
    """No torch needed: a CPU-bound Python loop."""
    while True:
        acc = 0
        for i in range(20000):
            acc += i * i % 7
        if not m.step():
            return


def python_gil(m: Meter) -> None:
    """No torch needed: a pure-Python "training step" beside a pure-Python metrics thread that
    spins: the main thread waits for the GIL about half the time. What the plain ``gputop demo``
    runs where torch is not installed, so a newcomer still sees a verdict with its evidence."""

    def busy():
        x = 0
        while True:
            for i in range(1000):
                x = (x + i * i) % 1000003

    threading.Thread(target=busy, name="metrics-0", daemon=True).start()
    # The probe, when gputop started this process with it, counts these steps; it is not
    # imported here (a process started without gputop has none, and steps are simply not marked).
    probe = sys.modules.get("gputop.probe")
    while True:
        acc = 0
        for i in range(20000):
            acc += i * i % 7
        if probe is not None:
            probe.step()
        if not m.step():
            return


def input_bound(m: Meter, sample_ms: float = 4.0, workers: int = 2, batch: int = 32) -> None:
    """The model is small; each sample costs ``sample_ms`` of CPU in a DataLoader worker, so the
    training loop waits for data (the classic too-few-workers / heavy-augmentation job)."""
    torch = _torch()
    from torch.utils.data import DataLoader, Dataset

    device = _device(torch)
    width = 512

    class SlowDataset(Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            end = time.thread_time() + sample_ms / 1000.0
            acc = 0
            while time.thread_time() < end:  # CPU work standing in for decoding + augmentation
                acc += 1
            return torch.full((width,), float(i % 7)), i % 10

    model = _mlp(torch, width, 2, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(SlowDataset(), batch_size=batch, num_workers=workers, persistent_workers=True)
    for x, y in loader:
        _train_step(torch, model, opt, x.to(device), y.to(device))
        if not m.step():
            return


def default(m: Meter) -> None:
    """The plain ``gputop demo``: a small MLP fed by a DataLoader that cannot keep up — the most
    common reason a real job is slow, and it shows every panel (GPU, workers, threads, probe)."""
    input_bound(m, sample_ms=2.0, workers=2, batch=64)


def gpu_bound(m: Meter) -> None:
    """Large bf16 matmuls: the tensor cores are busy; the healthy outcome."""
    torch = _torch()
    device = _device(torch)
    n = 8192
    model = _mlp(torch, n, 3, device, dtype=torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    y = torch.randint(0, 10, (n,), device=device)
    while True:
        _train_step(torch, model, opt, x, y)
        if not m.step():
            return


def h2d_copy_bound(m: Meter) -> None:
    """Each step copies a large batch from pageable host memory and then uses only a little of
    it (think: full-resolution images downsampled on the GPU): the copy dominates the step."""
    torch = _torch()
    device = _device(torch)
    host_batch = torch.randn(64, 1024, 1024)  # 256 MiB, pageable (not pinned)
    model = _mlp(torch, 1024, 2, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    y = torch.randint(0, 10, (4096,), device=device)
    while True:
        x = host_batch.to(device).view(-1, 1024)[::16]  # 4096 of the 65536 rows
        _train_step(torch, model, opt, x, y)
        if not m.step():
            return


def launch_bound(m: Meter) -> None:
    """Hundreds of tiny kernels per step: Python and kernel-launch overhead dominate."""
    torch = _torch()
    device = _device(torch)
    params = [torch.randn(64, device=device, requires_grad=True) for _ in range(64)]
    opt = torch.optim.SGD(params, lr=1e-3, foreach=False)
    while True:
        loss = sum((p * p).sum() for p in params)
        for _ in range(4):
            loss = loss + sum((p.sin() * 1.0001).mean() for p in params[:16])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not m.step():
            return


def gil_contention(m: Meter) -> None:
    """A training loop beside two pure-Python threads (think: a metrics/logging thread gone
    wrong): the main thread waits for the GIL between every op."""
    torch = _torch()
    device = _device(torch)

    def busy():
        x = 0
        while True:
            for i in range(1000):
                x = (x + i * i) % 1000003

    model = _mlp(torch, 1024, 4, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    y = torch.randint(0, 10, (256,), device=device)
    _train_step(torch, model, opt, x, y)  # set-up done before the threads start competing
    for i in range(2):
        threading.Thread(target=busy, name=f"metrics-{i}", daemon=True).start()
    while True:
        _train_step(torch, model, opt, x, y)
        if not m.step():
            return


def sync_stall(m: Meter) -> None:
    """The loop reads ``.item()`` after every layer: the CPU waits for the GPU, then the GPU
    waits for the CPU's next launch, over and over."""
    torch = _torch()
    device = _device(torch)
    n = 4096
    layers = torch.nn.ModuleList(torch.nn.Linear(n, n) for _ in range(8)).to(device)
    opt = torch.optim.SGD(layers.parameters(), lr=1e-4)
    x = torch.randn(2048, n, device=device)
    while True:
        h = x
        for layer in layers:
            h = torch.relu(layer(h))
            if h.mean().item() > 1e9:  # a "harmless" logging check that syncs every layer
                print("diverged")
            _cpu_bookkeeping(2.0)
        loss = h.square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not m.step():
            return


def _cpu_bookkeeping(ms: float) -> None:
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


def memory_bound(m: Meter) -> None:
    """Elementwise work on large fp32 tensors: DRAM bandwidth is the limit, tensor cores idle."""
    torch = _torch()
    device = _device(torch)
    n = (1 << 30) // 4 if device.type == "cuda" else (1 << 24)  # 1 GiB of fp32 on a GPU
    a = torch.randn(n, device=device)
    b = torch.randn(n, device=device)
    while True:
        for _ in range(8):
            a.mul_(0.999).add_(b)
        if not m.step():
            return


def gpu_idle(m: Meter) -> None:
    """The job holds a GPU (a CUDA context and memory) but does its work on the CPU."""
    torch = _torch()
    device = _device(torch)
    keep = torch.empty(1 << 28, dtype=torch.uint8, device=device)  # 256 MiB held, never used
    x = torch.randn(256, 256)
    while True:
        for _ in range(20):
            x = torch.tanh(x @ x.T / 256.0)
        if not m.step():
            del keep
            return


def host_memory_pressure(m: Meter, data_mib: int = 1024, headroom_mib: int = 256) -> None:
    """Training data that no longer fits in the memory the job may use: each step reads the
    next slice of a 1 GiB data file, but the process has confined itself to a memory cgroup
    with only ``headroom_mib`` above its own footprint, so the page cache cannot keep the file
    and the kernel reclaims and re-reads it all the time (memory-pressure stalls, refaults).
    Bounded and safe: the limit applies to this process alone, and page cache is always
    reclaimable, so nothing else on the machine is squeezed. Where cgroups are not writable,
    it says so on stderr and runs unconfined (then there is no pressure to see)."""
    import atexit
    import signal
    import tempfile

    torch = _torch()
    device = _device(torch)
    model = _mlp(torch, 512, 2, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    _train_step(torch, model, opt, x, y)  # warm up first: the limit is set above the footprint
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run atexit on gputop's terminate()
    where = _confine_memory(headroom_mib)
    if where is None:
        print("host_memory_pressure: cannot create a memory cgroup here; running unconfined", file=sys.stderr, flush=True)
    # Written after confinement, so its page cache is charged to (and squeezed by) our cgroup.
    fd, path = tempfile.mkstemp(prefix="gputop-demo-data-")
    atexit.register(os.unlink, path)
    block = os.urandom(1 << 20)
    for _ in range(data_mib):
        os.write(fd, block)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # start cold
    import mmap
    import random

    data = mmap.mmap(fd, data_mib << 20, prot=mmap.PROT_READ)
    pages = (data_mib << 20) // 4096
    rng = random.Random(0)
    while True:
        # A "shuffled dataset" read through mmap: random pages, most of them evicted already,
        # so each touch is a major page fault that stalls the training thread.
        acc = 0
        for _ in range(100):
            acc += data[rng.randrange(pages) * 4096]
        _train_step(torch, model, opt, x, y)
        if not m.step():
            return


def _confine_memory(headroom_mib: int) -> str | None:
    """Move this process into a new memory cgroup that lets it grow by only ``headroom_mib``.
    Memory charged before the move stays with the old cgroup (cgroups do not migrate charges),
    so the limit is set after the move from the new cgroup's own usage: whatever the process
    already holds (CUDA mappings, torch) cannot be squeezed, only what it touches from now on.
    On cgroup v2 the limit is memory.high, which throttles and reclaims but never kills; on v1
    it is the hard limit_in_bytes, above anything the steady-state loop allocates.
    Returns the cgroup's path, or None when no writable memory cgroup exists (nothing changed).
    The process moves back and the cgroup is removed at exit."""
    import atexit

    lines = open("/proc/self/cgroup").read().splitlines()
    candidates = []  # (where to create it, limit file, usage file, where to return to)
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # cgroup v2, unified at the root
        rel = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        if rel is not None:
            own = "/sys/fs/cgroup" + rel.rstrip("/")
            # A child of our own cgroup works where that cgroup delegates the memory controller;
            # v2 forbids it where our cgroup holds processes itself ("no internal processes"),
            # so also try a cgroup beside the others at the root, where that rule does not apply
            # (only where the root already enables the memory controller: we change no setting).
            candidates.append((own, "memory.high", "memory.current", own))
            try:
                with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
                    if "memory" in f.read().split():
                        candidates.append(("/sys/fs/cgroup", "memory.high", "memory.current", own))
            except OSError:
                pass
    for ln in lines:  # cgroup v1 memory controller
        bits = ln.split(":", 2)
        if len(bits) == 3 and "memory" in bits[1].split(","):
            base = "/sys/fs/cgroup/memory" + bits[2].rstrip("/")
            candidates.append((base, "memory.limit_in_bytes", "memory.usage_in_bytes", base))
    for base, limit_file, usage_file, home in candidates:
        path = os.path.join(base, f"gputop-demo-{os.getpid()}")
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            with open(os.path.join(path, usage_file)) as f:
                used = int(f.read())
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(used + (headroom_mib << 20)))
        except (OSError, ValueError):
            _leave_cgroup(path, home)
            continue
        atexit.register(_leave_cgroup, path, home)
        return path
    return None


def _leave_cgroup(path: str, home: str) -> None:
    try:
        with open(os.path.join(home, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass
    try:
        os.rmdir(path)
    except OSError:
        pass


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("default", "input_bound", False, "a small MLP fed by a DataLoader that cannot keep up (the plain `gputop demo`)", default),
    Scenario("gpu_bound", "gpu_bound", True, "large bf16 matmuls: the GPU is busy (the healthy case)", gpu_bound),
    Scenario("input_bound", "input_bound", False, "2 DataLoader workers spending 4 ms of CPU per sample", input_bound),
    Scenario("h2d_copy_bound", "h2d_copy_bound", True, "a 256 MiB batch copied from pageable host memory every step", h2d_copy_bound),
    Scenario("launch_bound", "launch_bound", True, "hundreds of tiny kernels per step", launch_bound),
    Scenario("gil_contention", "gil_contention", False, "training beside two pure-Python threads", gil_contention),
    Scenario("sync_stall", "sync_stall", True, "`.item()` after every layer", sync_stall),
    Scenario("memory_bound", "memory_bound", True, "elementwise work on 1 GiB fp32 tensors", memory_bound),
    Scenario("host_memory_pressure", "host_memory_pressure", False, "reads a 1 GiB data file while confined to 256 MiB more memory than it holds", host_memory_pressure),
    Scenario("gpu_idle", "gpu_idle", True, "holds a GPU but computes on the CPU", gpu_idle),
    # real training code: frameworks and plain loops with what jobs do besides training
    Scenario("hf_trainer", "host_bound", False, "Hugging Face Trainer on a GPT-2 config, bf16, 2 DataLoader workers",
             real_loops.hf_trainer, ("transformers", "accelerate")),
    Scenario("lightning", "host_bound", False, "Lightning on a small MLP, batch 64: the framework's per-step Python",
             real_loops.lightning_mlp, ("lightning",)),
    Scenario("checkpoint_stall", "io_stall", False, "a GPU-bound loop saving a checkpoint with torch.save every 4 s",
             real_loops.checkpoint_stall),
    Scenario("cpu_work", "host_bound", False, "~30 ms of CPU tensor work on the main thread each step",
             real_loops.cpu_work),
    Scenario("eval_phase", "gpu_bound", False, "trains 8 s, evaluates batch by batch 4 s, over and over",
             real_loops.eval_phase),
    Scenario("slow_startup", "gpu_bound", False, "~10 s building a model and loading weights, then GPU-bound training",
             real_loops.slow_startup),
    Scenario("periodic_stall", "loop_blocked", False, "a GPU-bound loop that blocks 1.5 s every 3 s in a synchronous call",
             real_loops.periodic_stall),
    Scenario("python", "", False, "a pure-Python CPU loop (no torch needed)", pure_python),
    Scenario("python_gil", "gil_contention", False, "a pure-Python loop beside a spinning metrics thread "
             "(no torch needed; the plain `gputop demo` without torch)", python_gil),
]}

NO_TORCH = ("python", "python_gil")  # the scenarios that run without torch
# The README's install line for torch: the CPU-only build, a few hundred MB instead of the
# multi-GB CUDA build a plain `pip install torch` fetches on Linux.
TORCH_CPU_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
# What `gputop demo` says when it runs python_gil because torch is not installed (gputop/cli.py).
NO_TORCH_HINT = ("torch is not installed, so the demo runs a pure-Python job with a GIL-hogging thread "
                 f"(scenario python_gil); for the DataLoader demo install torch's CPU build: {TORCH_CPU_INSTALL}")


def needs_torch(scenario: str) -> str:
    """The line for a scenario that needs torch where it is not installed."""
    return (f"scenario {scenario} needs torch, which is not installed here: {TORCH_CPU_INSTALL} "
            f"(the CPU build), or try one of {', '.join(NO_TORCH)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gputop.demo.workload")
    p.add_argument("--scenario", default="default", choices=sorted(SCENARIOS))
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--report-every", type=float, default=1.0)
    a = p.parse_args(argv)
    scenario = SCENARIOS[a.scenario]
    m = Meter(a.report_every, a.duration)
    try:
        if scenario.name not in NO_TORCH:
            try:
                import torch
            except ImportError:  # `gputop demo` checks first; this is for direct runs
                print(needs_torch(scenario.name), file=sys.stderr, flush=True)
                return 3
            for mod in scenario.needs:
                try:
                    __import__(mod)
                except ImportError:
                    print(f"scenario {scenario.name} needs {mod}, which is not installed (pip install {mod})",
                          file=sys.stderr, flush=True)
                    return 3
            if scenario.needs_gpu and not torch.cuda.is_available():
                print(f"scenario {scenario.name} needs a CUDA GPU", file=sys.stderr, flush=True)
                return 3
        scenario.run(m)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        os._exit(0)  # gputop went away: stop quietly
    return 0


if __name__ == "__main__":
    sys.exit(main())
