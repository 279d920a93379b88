"""The stack source: what every thread of the target is doing, sampled from outside.

Two samplers run on one thread ("gputop-stacks"), neither pauses the target:

1. **py-spy** (the binary of the py-spy package, gputop/sources/pyspy.py) in rolling
   ``record`` windows (2 s for the first 20 s, then 5 s: ``STEADY_WINDOW_S``); each window's speedscope file (full file paths, one
   stack per sample) is folded (gputop/sources/speedscope.py) into one ``stacks`` sample per
   process: de-duplicated stacks with counts, a frame table, and the source text of the
   innermost line of each stack for the rules that need to see ``.item()`` or ``time.sleep(``.

2. **The kernel**, per thread, at ~25 Hz with jittered (Poisson) intervals
   (gputop/sources/kernel_wait.py): running, or blocked in which kind of wait -- the GIL, a
   lock, a sleep, poll, I/O -- plus exact on-CPU and run-queue time, published as one
   ``thread_kernel`` sample per process per second.

The classification into thread states happens later, in ``gputop.derive.threads`` (a
processor), so better rules improve old recordings on replay. docs/metrics.md ("Python stacks")
documents every field and what it costs.

Sources must not import gputop.session: the clock is duck-typed (``clock.now()``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import time

from gputop.model import KIND_HEALTH, MetricSpec, Sample, health_data
from gputop.sources.base import HEALTH_EVERY_S, Heartbeat, ThreadedSource, jittered
from gputop.sources.calm import CALM_FACTOR, CALM_KERNEL_FACTOR, CALM_WINDOW_S, WEIGHT_FIELD
from gputop.sources.files import FilesError, private_tempdir
# Re-exported: gputop.derive.threads, the UI, tests and benchmarks import these from here.
from gputop.sources.kernel_wait import (KERNEL_COLUMNS, KIND_THREAD_KERNEL, MAX_KERNEL_THREADS,  # noqa: F401
                                        WAIT_CLASSES, KernelSampler, SyscallTable, classify_syscall)
from gputop.sources.procfs import (ROLE_CHILD, PythonInfo, parse_python_name, read_small,  # noqa: F401
                                   role_by_name)
from gputop.sources.pyspy import (_BEHIND, _SAMPLES_LINE, BACKOFF_S, MIN_PYSPY, _Run, _vstr,  # noqa: F401
                                  diagnose_pyspy_error, find_pyspy, pyspy_version, record_command)
from gputop.sources.speedscope import (MAX_DEPTH, MAX_STACKS_PER_THREAD, SourceLines,  # noqa: F401
                                       fold_speedscope, run_lengths)
from gputop.sources.target import dies_with_parent

from gputop.catalogue import KIND_PHASE, KIND_STACKS, SOURCE_STACKS  # the kinds' home; KIND_STACKS importable here too

SOURCE_NAME = SOURCE_STACKS

# py-spy samples per second (benchmarks/stacks_overhead.py). Kept at 20 (issue 14 weighed 10, or
# 20 for the first 30 s then 10): py-spy's frames are the only source of the named waits (data,
# CUDA sync, collective) and of the time budget's moments, and those are judged as shares of
# short windows: thread states over 10 s, the budget over 20 s, a young phase over 3 s. A share
# p of n samples has binomial noise sqrt(p(1-p)/n): at 10 Hz over 10 s (n = 100) that is 4 points
# at the 20% thresholds (INPUT_BOUND_SHARE, SYNC_STALL_SHARE, COMM_BOUND_SHARE; 2.8 at 20 Hz), so
# a job truly 25% input-bound misses its verdict in ~12% of windows instead of ~5%; the 5% I/O
# stall share over 20 s has 1.5 points of noise on 5 (1.1 at 20 Hz); and the stall finder needs 3
# moments for a MIN_STALL_S = 0.25 s stall at 10 Hz (5 at 20 Hz), so a 0.3 s stall is found only
# when the sampling happens to straddle it. A ramp keeps first verdicts fast but has the same
# steady-state noise. The saving would be ~30% of py-spy's cost (docs/metrics.md: 4.9 -> 3.4% on
# the 2-core box), not enough alone for the 2% goal, so accuracy wins.
DEFAULT_RATE_HZ = 20
DEFAULT_WINDOW_S = 2          # seconds per py-spy run (py-spy takes whole seconds) while warming up
# After the warm-up (WARM_S, below), each window is STEADY_WINDOW_S long. py-spy has no streaming mode, so
# every window is a fresh `py-spy record` whose start-up (attach, read the interpreter's symbols)
# costs ~20 ms of CPU, what ~45 samples cost (2-core box: 21.7 ms a start, 0.45 ms a sample on a
# torch CPU job): at 2 s windows and 20 Hz half of py-spy's CPU is start-ups, at 5 s 30%, so
# py-spy costs a third less at the same rate and accuracy (H200: 1.73 -> 1.33% of a core,
# docs/benchmarks.md "H200 run 9"). What it
# costs: after the warm-up the stacks of a window arrive up to 5 s after they were sampled, not
# 2 s, so a change seen only in the stacks (a new wait, a stall of a job without the probe) is
# named up to 3 s later. The warm-up keeps 2 s windows, so the first look at a job is as quick
# as before. The windows still fit the processors': the budget's 20 s window holds >= 15 s of
# stacks, a thread state's 10 s horizon one whole window plus its fold (and both widen with a
# longer window in flight: gputop/derive/stacks_window.py; the agent's once at start,
# gputop/agent/job.py widen_windows; checked by tests/test_stacks_steady.py).
STEADY_WINDOW_S = 5
WARM_S = 20.0
# ...and, where the session judges phases (the budget processor's "phase" samples, heard in
# ``on_samples``), the short windows hold until the job has been training for WARM_S, however
# long its start-up takes: at 20 s from the attach alone, a Hugging Face Trainer job (23 s of
# start-up on the H200) had its first training seconds in 5 s windows and its first verdict 8.2 s
# after its first step (4.9 s with 2 s windows; docs/benchmarks.md "H200 run 10"). A job that
# never trains (a server, a script without a training loop) gets the steady windows after
# MAX_WARM_S.
MAX_WARM_S = 120.0
# /proc syscall reads per thread per second. 25, not 50: the wake-ups of this loop were 1.1% of
# a core on the H200 (benchmarks/cpu_profile.py), and what the rate buys is the GIL share of a
# thread's *off-CPU* time only (on-CPU and run-queue time are exact, from schedstat), so a thread
# that spins or computes is exact at any rate. For one that mixes sleeping and GIL waits, the share
# is off x (GIL samples / off-CPU samples): binomial noise of off x sqrt(q(1-q)/n_off), at worst
# (all off-CPU, q = 0.5) 1/(2 sqrt(250)) = 3.2 points at 25 Hz over the 10 s window (2.2 at 50 Hz),
# typically (off 0.9, q 0.15) 1.5 points. benchmarks/gil_accuracy.py (2-core box, load ~16, 3
# alternated runs each): worst |error| 3.6 points at 25 Hz, 6.4 at 50 Hz, 8.3 at 33 Hz -- load,
# not the rate, dominates; the goal is +-5.
DEFAULT_KERNEL_RATE_HZ = 25
DEFAULT_SUBPROCESS_EVERY = 5  # children (--subprocesses) in one first-length window every 5 such windows' time
KERNEL_EMIT_S = 1.0           # one thread_kernel sample per process per second
HEALTH_CHECK_S = 0.25         # how often the loop looks whether health has something new to say
PYSPY_EARLY_POLL_S = 0.25     # a window's py-spy is looked at this often before its end (a failure)

METRICS: list[MetricSpec] = [
    MetricSpec(KIND_STACKS, "threads", "", "stacks", "py-spy's de-duplicated stacks of one process over one window, per thread", False),
    MetricSpec(KIND_THREAD_KERNEL, "threads", "", "kernel waits", "per thread: counts of kernel wait states (run, GIL futex, lock, sleep, poll, I/O, other) and exact CPU/run-queue seconds", False),
]

_every_window: dict[tuple[int, bytes], bool] = {}


def _samples_every_window(pid: int) -> bool | None:
    """A child that py-spy samples in every window: a Python process that is neither a
    DataLoader worker nor one of multiprocessing's helpers (a rank under a launcher, a
    subprocess doing the real work). None: the process is gone. Cached per (PID, name)."""
    comm = read_small(f"/proc/{pid}/comm", 64)
    if comm is None:
        return None
    comm = comm.strip()
    key = (pid, comm)
    every = _every_window.get(key)
    if every is None:
        role = role_by_name(comm, b"")
        if role == ROLE_CHILD:   # a worker by its name needs no command line
            role = role_by_name(comm, read_small(f"/proc/{pid}/cmdline", 4096) or b"")
        # Not Python: py-spy skips it anyway.
        every = role == ROLE_CHILD and PythonInfo(pid).python
        if len(_every_window) > 4096:
            _every_window.clear()
        _every_window[key] = every
    return every


# ---------------------------------------------------------------------------------------------
# The source


class StackSource(ThreadedSource):
    name = SOURCE_NAME
    thread_name = "gputop-stacks"

    def __init__(self, clock, target, rate_hz: int = DEFAULT_RATE_HZ, window_s: int = DEFAULT_WINDOW_S,
                 kernel_rate_hz: float = DEFAULT_KERNEL_RATE_HZ,
                 subprocess_every: int = DEFAULT_SUBPROCESS_EVERY, pyspy: str | None = None,
                 steady_window_s: int = STEADY_WINDOW_S, warm_s: float = WARM_S, calm=None,
                 calm_window_s: int = CALM_WINDOW_S) -> None:
        if int(rate_hz) < 1 or int(window_s) < 1 or not kernel_rate_hz > 0:
            raise ValueError("rate_hz, window_s and kernel_rate_hz must be positive")
        self.clock = clock
        self.target = target
        self.rate_hz = int(rate_hz)
        # While the job is calm (gputop/sources/calm.py: a JobCalm, or None for always the full
        # rate), a steady window samples at 1/CALM_FACTOR of the rate (whole Hz: a rate the factor
        # does not divide is kept) and is CALM_WINDOW_S long: fewer samples and fewer start-ups.
        self.calm = calm
        self.calm_rate_hz = self.rate_hz // CALM_FACTOR if self.rate_hz % CALM_FACTOR == 0 else self.rate_hz
        self.window_rate_hz = self.rate_hz   # the rate asked of the window in flight (before the spread)
        # The window of the next py-spy run: window_s during the warm-up (``_warm``), then
        # steady_window_s (never shorter: the agent's 20 s windows stay 20 s).
        self.first_window_s = int(window_s)
        self.steady_window_s = max(self.first_window_s, int(steady_window_s))
        self.calm_window_s = max(self.steady_window_s, int(calm_window_s))   # while calm (sources/calm.py)
        self.warm_s = float(warm_s)
        self.window_s = self.first_window_s
        self._first_spawn: float | None = None
        self._phases_heard = False            # a "phase" sample came: the warm-up waits for training
        self._training_since: float | None = None   # session time the job's first judged stretch began
        self._warm_over = False
        self._preexec = dies_with_parent(signal.SIGKILL)  # py-spy never outlives gputop
        self.kernel_rate_hz = float(kernel_rate_hz)
        # py-spy's --subprocesses costs ~3x a main-process-only window (it samples every child
        # at the full rate and scans /proc for new ones): children get one first-length window
        # (2 s) every subprocess_every first-length windows' time (10 s; the agent: 20 s every
        # 400 s), whatever length the main process's windows have grown to: the thread states'
        # 10 s horizon then always holds one of the workers' windows (while calm, one after each
        # calm window, inside the 30 s horizon of then: _spawn).
        self.subprocess_every = max(0, int(subprocess_every))
        self._subs_at: float | None = None    # monotonic start of the last children's window
        self.has_children = False
        self.children_all_windows = False
        self.pyspy_path = pyspy
        self.pyspy_version: tuple | None = None
        self._rng = random.Random()
        self._init_thread()
        self.kernel = KernelSampler()
        self.lines = SourceLines()
        self._tmpdir: str | None = None
        self._run: _Run | None = None
        self._next_spawn = 0.0
        self._pyspy_poll_at = 0.0             # the loop looks at py-spy again at this monotonic time
        self._failures = 0
        # What health says (all read by benchmarks/stacks_overhead.py too).
        self.pyspy_state = "off"              # ok | degraded | failed | off
        self.pyspy_message = "starting"
        self.pyspy_ok = False                 # py-spy usable at all (found, new enough)
        self.restarts = 0
        self.windows = 0
        self.last_error: str | None = None
        self.rate_eff: float | None = None     # py-spy samples per thread per second, last window
        self.behind_s: float | None = None
        self.pyspy_cpu_s = 0.0                 # CPU of all py-spy children so far
        self.sampler_cpu_s = 0.0               # CPU of our own thread so far
        self.kernel_ticks = 0
        self._kernel_rate_from: tuple[float, int] | None = None   # (monotonic, ticks) the rate is over
        self.kernel_calm = False   # the kernel sampler at 1/CALM_KERNEL_FACTOR of its rate this second (sources/calm.py)
        self._kernel_t0: float | None = None
        self._heartbeat = Heartbeat(HEALTH_EVERY_S)
        self._cost_prev: tuple[float, float, float] | None = None  # (wall, pyspy cpu, own cpu)
        self.cost_pct: dict[str, float | None] = {"pyspy": None, "sampler": None}
        self._target_gone = False

    # -- Source protocol -----------------------------------------------------------------
    def stop(self) -> None:
        self._stop_thread(timeout=10)
        self._kill_run()
        self.kernel.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def describe(self) -> dict:
        return {
            "pyspy": self.pyspy_path, "pyspy_version": _vstr(self.pyspy_version) if self.pyspy_version else None,
            "rate_hz": self.rate_hz, "calm_rate_hz": self.calm_rate_hz if self.calm is not None else None,
            "window_s": self.first_window_s, "steady_window_s": self.steady_window_s,
            "calm_window_s": self.calm_window_s,
            "warm_s": self.warm_s, "subprocess_every": self.subprocess_every,
            "kernel_rate_hz": self.kernel_rate_hz, "kernel_arch": platform.machine(),
            "gil_method": "futex wait on the Python runtime's static data (/proc/PID/task/TID/syscall)",
            "nonblocking": True,
        }

    # -- Subscriber: the job's phase. Called on whichever thread publishes (every source's, the
    # derive thread's), so it only looks: one flag and one number, each written once. -------------
    def on_samples(self, samples: list[Sample]) -> None:
        if self._training_since is not None or self._warm_over:
            return
        for s in samples:
            if s.kind == KIND_PHASE and s.key == "main":
                self._phases_heard = True
                since = s.data.get("training_since")
                if isinstance(since, (int, float)) and not isinstance(since, bool) and math.isfinite(since):
                    self._training_since = float(since)

    def on_reset(self) -> None:
        """(A bus reset is a replay's seek; a live source's job goes on: nothing to forget.)"""

    def _warm(self, mono: float) -> bool:
        """Whether the next main-process window is a warm-up one (``first_window_s``): for
        ``warm_s`` after the first window began, and, where phases are judged, until the job has
        trained for ``warm_s`` (at most ``MAX_WARM_S`` after the first window)."""
        if self._warm_over:
            return False
        since_first = mono - self._first_spawn
        if since_first < self.warm_s:
            return True
        ts = self._training_since
        if not self._phases_heard or since_first >= MAX_WARM_S or (
                ts is not None and self.clock.now() - ts >= self.warm_s):
            self._warm_over = True
            return False
        return True

    # -- the loop --------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._prepare_pyspy()
        except Exception as e:  # never let a surprise kill the source silently
            self.pyspy_state, self.pyspy_message = "failed", f"py-spy check failed: {type(e).__name__}: {e}"
        next_emit = time.monotonic() + KERNEL_EMIT_S
        next_health = 0.0
        self._refresh_tree()
        c0 = time.thread_time()
        while not self._stop.is_set():
            try:
                self.kernel.tick()
                self.kernel_ticks += 1
                mono = time.monotonic()
                if mono >= next_emit:
                    next_emit = mono + KERNEL_EMIT_S
                    self._emit_kernel()
                    self._refresh_tree()
                    # the next second's rate: calm or full, one rate a whole harvest; calm only
                    # while the py-spy window in flight is a calm one (health says calm), when
                    # the thread states' horizon is 30 s (derive/stacks_window.py) and pools
                    # ~375 ticks at the calm rate (sources/calm.py)
                    self.kernel_calm = self.window_rate_hz < self.rate_hz and self.calm is not None \
                        and self.calm.calm()
                if mono >= self._pyspy_poll_at:
                    self._pyspy_step()
                if mono >= next_health:   # its state changes at most once a window
                    next_health = mono + HEALTH_CHECK_S
                    self._maybe_health()
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
            # Our own cost, waking up included (one clock read a tick).
            c1 = time.thread_time()
            self.sampler_cpu_s += c1 - c0
            c0 = c1
            # Poisson sampling: exponential gaps never lock onto a periodic step or the
            # GIL's 5 ms switch interval. Capped so a long gap cannot starve a window.
            mean = CALM_KERNEL_FACTOR / self.kernel_rate_hz if self.kernel_calm else 1.0 / self.kernel_rate_hz
            if self._nap(jittered(mean, self._rng, floor=0.0, cap=4.0)):
                break
        self._kill_run()

    def _refresh_tree(self) -> None:
        if self._target_gone:
            return
        try:
            pids = sorted(self.target.tree_pids(), key=lambda p: (p != self.target.pid, p))
        except Exception:
            pids = [self.target.pid]
        if self.target.pid not in pids or not os.path.exists(f"/proc/{self.target.pid}"):
            pids = [p for p in pids if p != self.target.pid]
            self._target_gone = not self.target.alive() if hasattr(self.target, "alive") else True
        now = self.clock.now()
        if self._kernel_t0 is None:
            self._kernel_t0 = now
        self.kernel.refresh(pids, now)
        self.has_children = len(pids) > 1
        # DataLoader workers are sampled in every Nth window; other Python children (ranks
        # under a launcher, a subprocess doing the real work) every window: they may be the
        # part the user is after.
        self.children_all_windows = any(_samples_every_window(p) for p in pids if p != self.target.pid)

    def _emit_kernel(self) -> None:
        now = self.clock.now()
        for pid, data in self.kernel.harvest(now, self.target.pid):
            if self.kernel_calm:   # its ticks at the calm rate: each counts for that many where counted
                data[WEIGHT_FIELD] = CALM_KERNEL_FACTOR
            self._emit(Sample(now, KIND_THREAD_KERNEL, str(pid), data))

    # -- py-spy ------------------------------------------------------------------------------
    def _prepare_pyspy(self) -> None:
        if self.pyspy_path and not os.access(self.pyspy_path, os.X_OK):
            self.pyspy_state = "failed"
            self.pyspy_message = (f"py-spy not found at {self.pyspy_path}: pip install py-spy; "
                                  f"Python stacks are off, thread CPU and GIL wait still work")
            return
        path = self.pyspy_path or find_pyspy()
        if not path:
            self.pyspy_state = "failed"
            self.pyspy_message = ("py-spy not found (next to this Python or on PATH): pip install py-spy; "
                                  "Python stacks are off, thread CPU and GIL wait still work")
            return
        self.pyspy_path = path
        self.pyspy_version = pyspy_version(path)
        if self.pyspy_version is None:
            self.pyspy_state, self.pyspy_message = "failed", f"{path} --version gave no version: reinstall py-spy"
            return
        if self.pyspy_version < MIN_PYSPY:
            self.pyspy_state = "failed"
            self.pyspy_message = (f"py-spy {_vstr(self.pyspy_version)} is too old (need >= {_vstr(MIN_PYSPY)}): "
                                  f"pip install -U py-spy")
            return
        info = PythonInfo(self.target.pid)
        if info.free_threaded:
            self.pyspy_state = "failed"
            self.pyspy_message = (f"process {self.target.pid} runs a free-threaded Python {info.version}t, which "
                                  f"py-spy {_vstr(self.pyspy_version)} cannot read: no Python stacks")
            return
        if not info.python and info.error is None:
            self.pyspy_state = "off"
            self.pyspy_message = (f"process {self.target.pid} is not a Python program "
                                  f"({os.path.basename(info.exe) or '?'}): no Python stacks")
            return
        try:  # py-spy's windows go to a private directory (those of a killed gputop are removed)
            self._tmpdir = private_tempdir("stacks")
        except (FilesError, OSError) as e:
            self.pyspy_state, self.pyspy_message = "failed", f"no directory for py-spy's windows: {e}"
            return
        self.pyspy_ok = True
        self.pyspy_state, self.pyspy_message = "ok", "starting py-spy"

    def _pyspy_step(self) -> None:
        if not self.pyspy_ok:
            return
        run = self._run
        if run is not None:
            try:
                pid, status, rusage = os.wait4(run.proc.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status, rusage = run.proc.pid, 0, None
            if pid == 0:
                mono = time.monotonic()
                if run.calm_factor > 1 and not run.cut and mono - run.t_spawn >= self.first_window_s \
                        and self.calm is not None and not self.calm.calm():
                    # the job changed during a calm window (up to CALM_WINDOW_S long): end it now,
                    # so the next window samples the change at the full rate (sources/calm.py)
                    run.interrupt()
                if mono - run.t_spawn > run.window_s + 30:  # hung: give up on it
                    self._kill_run()
                    self._window_failed("py-spy did not finish its window (hung); restarted")
                elif mono < run.t_spawn + run.window_s:
                    # It cannot be done before its window is over, only fail: a wait4 every
                    # 0.25 s instead of every tick until then.
                    self._pyspy_poll_at = mono + PYSPY_EARLY_POLL_S
                return
            run.proc.returncode = os.waitstatus_to_exitcode(status) if rusage is not None else 0
            if rusage is not None:
                self.pyspy_cpu_s += rusage.ru_utime + rusage.ru_stime
            self._run = None
            self._finish_window(run)
        if self._target_gone:
            self.pyspy_state, self.pyspy_message = "off", f"process {self.target.pid} exited: no more stacks"
            return
        if self._stop.is_set() or time.monotonic() < self._next_spawn:
            return
        self._spawn()

    def _spawn(self) -> None:
        assert self._tmpdir and self.pyspy_path
        self.windows += 1
        out_path = os.path.join(self._tmpdir, f"w{self.windows % 4}.json")
        err_path = os.path.join(self._tmpdir, f"w{self.windows % 4}.err")
        for p in (out_path,):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        # py-spy samples at a fixed period; a +-10% different rate per window (and a fresh start
        # phase each window) keeps it from locking onto a training step of the same period.
        mono = time.monotonic()
        if self._first_spawn is None:
            self._first_spawn = mono
        warm = self._warm(mono)
        # calm (gputop/sources/calm.py): the steady windows at the calm rate, never the warm-up's
        calm = not warm and self.calm is not None and self.calm.calm()
        base = self.calm_rate_hz if calm else self.rate_hz
        self.window_rate_hz = base
        spread = max(1, round(base * 0.1))
        rate = max(1, base + self._rng.randint(-spread, spread))
        subs_every_s = self.subprocess_every * self.first_window_s
        calm_windows = calm and base < self.rate_hz
        if calm_windows:
            # a calm main window is calm_window_s long and the children's window comes after
            # each one (~every 23 s), not every 10 s, which cut each calm window to 6-8 s on the
            # H200's HF Trainer (run 12) and kept the start-ups calm is meant to save; the
            # thread states' horizon is 30 s while calm (derive/stacks_window.py), so it still
            # holds a children's window
            subs_every_s = max(subs_every_s, self.calm_window_s + self.first_window_s)
        subs = self.has_children and self.subprocess_every > 0 and (
            self.children_all_windows or self._subs_at is None or mono - self._subs_at >= subs_every_s - 0.5)
        if subs:
            self._subs_at = mono
        # health says the window now in flight (the stall detector's freshness reads it)
        steady = not warm and not (subs and not self.children_all_windows)
        # calm: longer windows, fewer start-ups (sources/calm.py: CALM_WINDOW_S), only where the
        # rate is the calm one (its samples say so: calm_factor) and never shorter than asked
        length = (self.calm_window_s if calm_windows else self.steady_window_s) if steady else self.first_window_s
        if steady and not calm_windows and self.has_children and self.subprocess_every > 0 \
                and not self.children_all_windows and self._subs_at is not None:
            # end by the children's next window, so that it starts on time (every ~10 s, as in
            # the warm-up), not a whole steady window later (every 12 s: outside the thread
            # states' 10 s horizon for 2 s of them)
            due = self._subs_at + subs_every_s - 0.5 - mono
            length = max(self.first_window_s, min(length, math.ceil(due)))
        self.window_s = length
        cmd = record_command(self.pyspy_path, rate, self.window_s, out_path, self.target.pid, subs)
        err_file = open(err_path, "wb")
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_file,
                                    close_fds=True, preexec_fn=self._preexec)
        except OSError as e:
            err_file.close()
            self._window_failed(f"cannot run {self.pyspy_path}: {e}")
            return
        self._run = _Run(proc, out_path, err_path, time.monotonic(), err_file)
        self._pyspy_poll_at = self._run.t_spawn + PYSPY_EARLY_POLL_S
        self._run.rate = rate
        self._run.window_s = self.window_s
        self._run.subprocesses = subs
        self._run.calm_factor = self.rate_hz // base if base < self.rate_hz else 1

    def _kill_run(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        self.pyspy_cpu_s += run.kill()

    def _finish_window(self, run: _Run) -> None:
        run.err_file.close()
        t_end = self.clock.now()
        try:
            with open(run.err_path, "rb") as f:
                stderr = f.read(65536).decode("utf-8", "replace")
        except OSError:
            stderr = ""
        doc = None
        if os.path.exists(run.out_path):
            try:
                with open(run.out_path, "rb") as f:
                    doc = json.loads(f.read())
            except (OSError, ValueError):
                doc = None
        if doc is None or not isinstance(doc, dict):
            if not self.target.alive() if hasattr(self.target, "alive") else False:
                self._target_gone = True
                self.pyspy_state, self.pyspy_message = "off", f"process {self.target.pid} exited: no more stacks"
                return
            state, message = diagnose_pyspy_error(stderr, self.target.pid, PythonInfo(self.target.pid),
                                                  self.pyspy_version)
            if state == "off":
                # Not Python / gone: no point in retrying every second.
                self.pyspy_state, self.pyspy_message = state, message
                self.pyspy_ok = False
                return
            self._window_failed(message)
            return
        procs = fold_speedscope(doc, self.target.pid, self.lines)
        dur = None
        for prof in doc.get("profiles") or []:
            try:
                dur = max(dur or 0.0, float(prof.get("endValue", 0)) - float(prof.get("startValue", 0)))
            except (TypeError, ValueError):
                pass
        if not dur or dur <= 0:
            dur = float(run.window_s)
        m = _SAMPLES_LINE.search(stderr)
        errors = int(m[2]) if m else None
        behind = [float(x) for x in _BEHIND.findall(stderr)]
        self.behind_s = max(behind) if behind else None
        main_n = max((th["n"] for p in procs.values() for th in p["threads"]), default=0)
        self.rate_eff = round(main_n / dur, 2) if dur else None
        t0 = round(t_end - dur, 4)
        samples = []
        for pid, data in procs.items():
            data["t0"] = t0
            data["dur_s"] = round(dur, 4)
            data["rate_hz"] = run.rate
            data["main"] = pid == self.target.pid
            data["subprocesses"] = run.subprocesses
            if run.calm_factor > 1:   # sampled at 1/calm_factor of the full rate (sources/calm.py)
                data["calm_factor"] = run.calm_factor
            if errors:
                data["errors"] = errors
            samples.append(Sample(t_end, KIND_STACKS, str(pid), data))
        for s in samples:
            self._emit(s)
        self._failures = 0
        self._next_spawn = 0.0
        if self.behind_s:
            self.pyspy_state = "degraded"
            self.pyspy_message = (f"py-spy fell {self.behind_s:.1f} s behind at {self.window_rate_hz} Hz "
                                  f"(effective {self.rate_eff} Hz): lower the stack rate")
        elif not procs:
            self.pyspy_state, self.pyspy_message = "degraded", "py-spy returned no threads in its last window"
        else:
            self.pyspy_state, self.pyspy_message = "ok", ""

    def _window_failed(self, message: str) -> None:
        self.last_error = message
        self.restarts += 1
        delay = BACKOFF_S[min(self._failures, len(BACKOFF_S) - 1)]
        self._failures += 1
        self._next_spawn = time.monotonic() + delay
        self.pyspy_state = "failed"
        self.pyspy_message = f"{message} (retry in {delay:.0f} s)"

    # -- health ------------------------------------------------------------------------------
    def _maybe_health(self, force: bool = False) -> None:
        mono = time.monotonic()
        state, message = self.pyspy_state, self.pyspy_message
        gil_known = any(p.info.runtime_ranges and not p.syscall_denied for p in self.kernel.procs.values())
        denied = any(p.syscall_denied for p in self.kernel.procs.values())
        if denied and state in ("ok", "degraded"):
            state = "degraded"
            message = ((message + "; ") if message else "") + (
                "GIL wait unknown: /proc/PID/task/*/syscall not readable (needs ptrace permission)")
        if not self.kernel.arch_known and state == "ok":
            state, message = "degraded", f"GIL wait unknown on {platform.machine()}: syscall table missing"
        capped = self.kernel.capped
        if capped and state == "ok":
            # degrade, never fail: the process's descriptors (procfs.FdBudget) or the thread cap
            state = "degraded"
            message = (f"kernel wait states of {self.kernel.n_threads} of {self.kernel.n_threads + capped} threads "
                       f"(file descriptors or the {self.kernel.max_threads}-thread cap: raise ulimit -n)")
        # a longer window is news (stall freshness reads it), and so is a calm rate
        said = (state, message, self.window_s, self.window_rate_hz)
        if not self._heartbeat.due(said, mono, force):
            return
        wall = mono
        if self._cost_prev is not None and wall > self._cost_prev[0]:
            dt = wall - self._cost_prev[0]
            self.cost_pct = {"pyspy": round(100 * (self.pyspy_cpu_s - self._cost_prev[1]) / dt, 2),
                             "sampler": round(100 * (self.sampler_cpu_s - self._cost_prev[2]) / dt, 2)}
        self._cost_prev = (wall, self.pyspy_cpu_s, self.sampler_cpu_s)
        self._heartbeat.mark(said, mono)
        now = self.clock.now()
        kt = now - self._kernel_t0 if self._kernel_t0 is not None else None
        # the kernel sampler's rate now (since the previous health sample, at least 1 s ago): the
        # rate since the start read ~20 Hz long after a calm job's 12.5 Hz began
        mono, prev = time.monotonic(), self._kernel_rate_from
        if prev is not None and mono - prev[0] >= 1.0:
            kernel_hz = round((self.kernel_ticks - prev[1]) / (mono - prev[0]), 1)
        else:
            kernel_hz = round(self.kernel_ticks / kt, 1) if kt and kt > 1 else None
        if prev is None or mono - prev[0] >= 1.0:
            self._kernel_rate_from = (mono, self.kernel_ticks)
        self._emit(Sample(now, KIND_HEALTH, self.name, health_data(
            state if state in ("ok", "degraded", "failed", "off") else "failed", message,
            rate_hz=self.rate_eff,
            rate_requested_hz=self.window_rate_hz, calm=self.window_rate_hz < self.rate_hz,
            window_s=self.window_s, windows=self.windows,
            restarts=self.restarts, last_error=self.last_error, behind_s=self.behind_s,
            pyspy=self.pyspy_path, pyspy_version=_vstr(self.pyspy_version) if self.pyspy_version else None,
            kernel_rate_hz=kernel_hz,
            kernel_threads=self.kernel.n_threads, kernel_threads_capped=self.kernel.capped,
            gil_known=gil_known,
            pyspy_cpu_pct=self.cost_pct["pyspy"], sampler_cpu_pct=self.cost_pct["sampler"],
        )))
