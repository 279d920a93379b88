"""One watched job: a headless live session on one process tree, at the agent's rates.

The agent's rates are lower than the interactive UI's, so that it costs about 1% of a core per job
(benchmarks/agent_cost.py, which prints the parts): GPU counters at 1 Hz (UI: 10 Hz), the host
every 2 s (1 s), py-spy at 2 samples/s (20/s) in 20 s windows (2 s, then 5 s), children in one 20 s window
every 400 s (a 2 s one every 10 s), the kernel's wait sampler at 5 Hz per thread (25 Hz), the time budget, the
stall detector and the verdicts every 4 s (1 s), thread states every 4 s (2 s), new probes
looked for every 3 s (1 s).

Why 20 s windows: py-spy has no streaming mode, so each window is a fresh ``py-spy record``
whose start-up (attach, read the interpreter's and libtorch's symbols) costs ~20 ms of CPU on a
torch job, about what 40 samples cost; fewer windows halve that. A ``--subprocesses`` window
(DataLoader workers) costs ~25 ms per second it runs, whatever its rate (py-spy follows the
process tree), so children are sampled 5% of the time; the verdicts read the workers' state
from the host and kernel samplers, not from their stacks.

What accuracy needs: the stacks of a window arrive when it ends, up to one window late. The
time budget is kept over ``stack_window_s + 10 + derive_every_s`` s (UI: 20 s) and thread states over
``stack_window_s + 5`` s (UI: 10 s), so the budget always holds >= 10 s of stacks (20 samples
at 2/s, as with 10 s windows over the UI's 20 s) and each thread state at least one whole
window (40 samples): enough to see a state that holds >= 20% of the time (the verdicts'
thresholds), not to split small shares; the kernel's samples (each second) still make up most
of a thread state. tests/test_agent_stacks.py checks that a job without a probe is judged
input-bound from its stacks at these rates, tests/test_agent_prometheus.py that the alert
fires. The verdicts' hysteresis is in seconds, not runs (on after 1.5 s, off after 5 s), so run
every 4 s a verdict turns on at its second run that holds (4 s) and off after two that fail (8 s);
the budget and the verdicts run in the same tick, so the budget they read is never stale; new
stacks come every 20 s anyway.

Everything a job does is caught here: a job that cannot start, or whose session fails to stop,
is logged and forgotten; the agent goes on.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass

from gputop.agent.discover import Found
from gputop.agent.state import RollingRecorder
from gputop.derive.stacks_window import BUDGET_STACKS_S, THREADS_SLACK_S

log = logging.getLogger("gputop.agent")


@dataclass(frozen=True)
class Rates:
    gpu_interval_s: float = 1.0
    host_interval_s: float = 2.0
    stack_rate_hz: int = 2
    stack_window_s: int = 20
    subprocess_every: int = 20
    kernel_rate_hz: float = 5.0
    derive_every_s: float = 4.0      # the time budget, the stall detector and the verdicts
    thread_states_every_s: float = 4.0
    probe_scan_s: float = 3.0          # new probes looked for (a connected one pushes its data)
    stacks: bool = True


CLUSTER_ENV = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "JOB_ID")
_LABEL_SAFE = re.compile(r"[^A-Za-z0-9_.:-]+")


def job_label(found: Found, env: dict | None) -> tuple[str, str]:
    """(job, cluster_job): ``job`` names this watched tree uniquely on the node (``<name>-<pid>``,
    the name being the script or program); ``cluster_job`` the scheduler's id when its
    environment has one (SLURM_JOB_ID, TorchElastic's run id), else ""."""
    words = found.command.split()
    script = next((w for w in words[1:] if w.endswith(".py")), None)
    if script is None and len(words) > 2 and words[1] == "-m":
        script = words[2]
    name = os.path.basename(script or (words[0] if words else "job"))[:40]
    cluster = ""
    for k in CLUSTER_ENV:
        v = (env or {}).get(k)
        if v and v != "none":
            cluster = _LABEL_SAFE.sub("_", v)[:64]
            break
    return f"{_LABEL_SAFE.sub('_', name)}-{found.pid}", cluster


def read_environ(pid: int) -> dict | None:
    """A process's environment (needs ptrace rights: None without them)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    out = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def widen_windows(p, stack_window_s: float, derive_every_s: float = 0.0) -> None:
    """The budget's and the thread states' windows, widened so that they always hold stacks
    although a py-spy window's samples arrive only when it ends (module docstring), and the
    budget only at its next run, up to ``derive_every_s`` later still."""
    if p.name == "budget":
        p.window_s = max(p.window_s, stack_window_s + BUDGET_STACKS_S + derive_every_s)
    elif p.name == "threads":
        p.horizon_s = max(p.horizon_s, stack_window_s + THREADS_SLACK_S)


class Job:
    """A started session on ``found``'s tree; ``stop()`` ends it. Raises TargetError (or anything
    else a broken process can make happen) from the constructor: the agent catches it."""

    def __init__(self, found: Found, rates: Rates, state=None, argv: list[str] | None = None) -> None:
        from gputop.session.session import LiveSession, SessionClock, base_meta
        from gputop.sources.host import HostSource
        from gputop.sources.nvml import NvmlSource
        from gputop.sources.probe_client import ProbeClientSource
        from gputop.sources.target import Target
        from gputop.verdicts import default_processors

        self.found = found
        self.target = Target(found.pid)
        env = read_environ(found.pid)
        self.label, self.cluster_job = job_label(found, env)
        clock = SessionClock()
        sources = [NvmlSource(clock, self.target, interval_s=rates.gpu_interval_s),
                   HostSource(clock, self.target, interval_s=rates.host_interval_s)]
        if rates.stacks:
            from gputop.sources.stacks import StackSource

            sources.append(StackSource(clock, self.target, rate_hz=rates.stack_rate_hz,
                                       window_s=rates.stack_window_s, kernel_rate_hz=rates.kernel_rate_hz,
                                       subprocess_every=rates.subprocess_every))
        sources.append(ProbeClientSource(clock, self.target, scan_interval_s=rates.probe_scan_s))
        meta = base_meta(clock, argv)
        meta["target"] = self.target.describe()
        meta["agent"] = {"job": self.label, "cluster_job": self.cluster_job, "found_by": found.why}
        processors = default_processors()
        for p in processors:
            p.interval_s = rates.thread_states_every_s if p.name == "threads" else max(p.interval_s,
                                                                                         rates.derive_every_s)
            if rates.stacks:
                # (a --stack-window under the source's steady window grows to it after the warm-up)
                from gputop.sources.stacks import STEADY_WINDOW_S

                widen_windows(p, max(rates.stack_window_s, STEADY_WINDOW_S), rates.derive_every_s)
        self.session = LiveSession(sources, clock, meta, processors=processors)
        # how often the derived series are refreshed: the exporter serves them that much longer
        self.derive_every_s = max(rates.derive_every_s, rates.thread_states_every_s)
        self.recorder: RollingRecorder | None = None
        if state is not None:
            # a subscriber of its own, so a new file can replace a full one while the session runs
            self.recorder = RollingRecorder(state, self.label, meta, seed=self._facts)
            self.session.bus.subscribe(self.recorder)
        self.started_at = time.monotonic()
        self.ended_at: float | None = None
        try:
            self.session.start()
        except BaseException:
            # a job that fails to start leaves nothing behind: no py-spy, threads or open segment
            try:
                self.session.stop({"stopped_by": "agent", "failed_to_start": True})
            finally:
                if self.recorder is not None:
                    self.recorder.close({"stopped_by": "agent", "failed_to_start": True})
            raise
        if self.target.ptrace_denied:
            log.info("job %s: %s; watched without its stacks", self.label, self.target.ptrace_denied)

    def _facts(self) -> list:
        """The newest sample of each kind sent only at start or on change, stamped now: what a
        new segment needs to stand alone (its GPUs' names, the processes' roles, the ranks)."""
        from gputop.catalogue import KIND_GPU_INFO, KIND_PROBE_CONFIG, KIND_PROC_INFO, KIND_RANK, KIND_TARGET
        from gputop.model import Sample

        now = self.session.now()
        store = self.session.store
        return [Sample(now, kind, key, s.data)
                for kind in (KIND_GPU_INFO, KIND_PROC_INFO, KIND_RANK, KIND_TARGET, KIND_PROBE_CONFIG)
                for key, s in store.latest_of_kind(kind).items()]

    def alive(self) -> bool:
        try:
            return self.target.alive()
        except Exception:
            return False

    def stop(self) -> None:
        try:
            self.session.stop({"stopped_by": "agent"})
        except Exception as e:
            log.warning("job %s: stopping its session failed: %s: %s", self.label, type(e).__name__, e)
        if self.recorder is not None:
            self.recorder.close({"stopped_by": "agent"})
