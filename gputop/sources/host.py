"""The host source: the target's process tree, its main process's threads, and the host.

Every tick (1 Hz by default, ``DEFAULT_INTERVAL_S``, jittered) it publishes:

- ``system``/"host": host-wide CPU, load, memory, swap rates, and the target's cgroup (CPU
  limit, CFS throttling, memory limit and use);
- ``proc``/PID for every live process of the target's tree (``proc_info`` once per new
  process, and again when its name or role changes, for example after an exec);
- ``thread``/"PID:TID" for every thread of the main process;
- ``target``/PID when the target starts being watched and when it exits;
- ``rank``/PID for every rank of a distributed job in the tree (from the processes'
  environments, read once per new process: gputop/sources/ranks.py);
- ``health``/"host" at start, on change and about every 5 s (with gputop's own sampling cost).

While the job is calm (gputop/sources/calm.py) the ticks come CALM_HELD_FACTOR (2) times less
often, and their ``system`` and ``proc`` samples say so (``calm_factor``: the report's statistics
weigh them so). Each tick is ~37 samples on a GPU job of 35 threads, most of everything gputop
publishes, each stored, recorded and summarized; the jitter is narrower then, so the longest gap
(2.5 s) is shorter than the full rate's (3 s) and the views' holds cover it.

How it stays cheap (budget: ~1% of one core for ~10 processes and ~60 threads at 2 Hz):
per-thread numbers come straight from /proc, and every /proc file read each tick is opened
once and re-read with ``pread(fd, n, 0)`` (procfs regenerates the text on a read from offset
0). On the 2-core CI VM that is ~5 us per thread ``stat`` against ~23 us for Python's
``open().read()`` and ~32 us per thread for ``psutil.Process.threads()`` (which also lacks the
thread names). A held descriptor also pins the identity of the process: once it exits, reads
fail with ESRCH even if its PID is reused. psutil is used for what is read once per process
(command line, user, start time) and for the tree (``Target``).

Context switches are summed over all threads of a process: /proc/PID/status (and psutil's
``num_ctx_switches``) count only the process's *main thread*.

Where the parts live: the /proc parsing, roles and held files in gputop/sources/procfs.py, one
process's readers in host_procs.py, the ``system`` sample in system.py (with the cgroup in
cgroups.py); this module is the source: the tick, the tree, the rows, health.

Sources must not import gputop.session: the clock is duck-typed (``clock.now()``).
"""

from __future__ import annotations

import os
import random
import time
from collections import deque

from gputop.model import (KIND_HEALTH, KIND_PROC, KIND_PROC_INFO, KIND_SYSTEM, KIND_TARGET,
                          KIND_THREAD, MetricSpec, Sample, clean_float, health_data)
from gputop.sources.base import HEALTH_EVERY_S, Heartbeat, ThreadedSource, jittered
from gputop.sources.calm import CALM_HELD_FACTOR, WEIGHT_FIELD
from gputop.sources.host_procs import ProcFiles, TaskFiles
from gputop.sources.procfs import (CLK_TCK, F_MAJFLT, F_PPID, F_RSS, F_STIME, F_THREADS, F_UTIME, GONE_STATES,
                                   PAGE_SIZE, STATE_WORDS, FdBudget, Gone, is_mp_helper, parse_kv, parse_stat,
                                   process_role, schedstat_works)
# The role words, re-exported: they were defined here before gputop/sources/procfs.py.
from gputop.sources.procfs import MP_HELPERS, ROLE_CHILD, ROLE_MAIN, ROLE_WORKER, WORKER_NAMES  # noqa: F401
from gputop.sources.procfs import TREE_MAX_AGE_S
from gputop.sources.ranks import RankFinder
from gputop.sources.cgroups import Cgroup  # noqa: F401 (re-exported)
from gputop.sources.system import SystemSampler

# 1 s: what the host gives is counters (CPU, run queue, faults, swap, I/O: a rate over any span
# is exact, so means over the verdicts' 10 s windows lose nothing) and slow levels (memory), and
# the UI redraws once a second; at 0.5 s the source was 0.4% of a core on the H200 against a
# torch job's 35 threads (benchmarks/cpu_profile.py). The agent reads it every 2 s.
DEFAULT_INTERVAL_S = 1.0
MAX_THREAD_ROWS = 256        # more threads than this in the main process: the busiest are shown
REFRESH_IDLE_TICKS = 4       # a thread that did not run: re-read its name and state every N ticks
COST_WARN_PCT = 5.0          # own sampling CPU above this (% of one core): health says so


def _m(kind, field, unit, label, help, prom, prom_help, aggregate=True):
    return MetricSpec(kind, field, unit, label, help, aggregate, prom=prom, prom_help=prom_help)


# Each field: kind, field, unit, label; the help screen's words; its Prometheus family (name
# without "gputop_") and that family's help (Prometheus wording: ratios 0-1, base units). The
# exporter's scale comes from the unit (gputop.catalogue.UNIT_SCALE).
METRICS: list[MetricSpec] = [
    _m(KIND_SYSTEM, "cpu_pct", "%", "host CPU",
       "busy share of all cores of the host (100 = every core busy), /proc/stat",
       "host_cpu_utilization_ratio", "Busy share of all cores of the host, 0-1 (/proc/stat)."),
    _m(KIND_SYSTEM, "cpu_iowait_pct", "%", "iowait", "share of all cores idle while waiting for disk I/O, /proc/stat",
       "host_cpu_iowait_ratio", "Share of all cores idle while waiting for disk I/O, 0-1."),
    _m(KIND_SYSTEM, "cpu_steal_pct", "%", "steal",
       "share of all cores taken by the hypervisor for other guests (VMs), /proc/stat",
       "host_cpu_steal_ratio", "Share of all cores taken by the hypervisor for other guests, 0-1."),
    _m(KIND_SYSTEM, "cpu_count", "", "cores", "logical CPUs of the host",
       "host_cpus", "Logical CPUs of the host.", aggregate=False),
    _m(KIND_SYSTEM, "load1", "", "load 1m", "1-minute load average: runnable + uninterruptible tasks",
       "host_load1", "1-minute load average (runnable + uninterruptible tasks)."),
    _m(KIND_SYSTEM, "mem_total", "B", "mem total", "physical memory of the host",
       "host_memory_total_bytes", "Physical memory of the host, in bytes.", aggregate=False),
    _m(KIND_SYSTEM, "mem_available", "B", "mem avail", "memory available for new work without swapping (MemAvailable)",
       "host_memory_available_bytes", "Memory available for new work without swapping (MemAvailable), in bytes."),
    _m(KIND_SYSTEM, "swap_total", "B", "swap total", "swap space of the host",
       "host_swap_total_bytes", "Swap space of the host, in bytes.", aggregate=False),
    _m(KIND_SYSTEM, "swap_used", "B", "swap used", "swap space in use (SwapTotal - SwapFree)",
       "host_swap_used_bytes", "Swap space in use, in bytes."),
    _m(KIND_SYSTEM, "swap_in_bps", "B/s", "swap in", "bytes read back from swap per second (pswpin x page size)",
       "host_swap_in_bytes_per_second", "Bytes read back from swap per second."),
    _m(KIND_SYSTEM, "swap_out_bps", "B/s", "swap out", "bytes written to swap per second (pswpout x page size)",
       "host_swap_out_bytes_per_second", "Bytes written to swap per second."),
    _m(KIND_SYSTEM, "psi_mem_some_pct", "%", "mem stall",
       "share of time some task was stalled waiting for memory (reclaim, refaults, swap-in), /proc/pressure/memory",
       "host_pressure_memory_some_ratio",
       "Share of time some task was stalled waiting for memory, 0-1 (/proc/pressure/memory)."),
    _m(KIND_SYSTEM, "psi_mem_full_pct", "%", "mem stall all",
       "share of time all non-idle tasks were stalled on memory at once",
       "host_pressure_memory_full_ratio", "Share of time all non-idle tasks were stalled on memory at once, 0-1."),
    _m(KIND_SYSTEM, "psi_io_some_pct", "%", "io stall",
       "share of time some task was stalled waiting for I/O, /proc/pressure/io",
       "host_pressure_io_some_ratio", "Share of time some task was stalled waiting for I/O, 0-1 (/proc/pressure/io)."),
    _m(KIND_SYSTEM, "psi_cpu_some_pct", "%", "cpu stall",
       "share of time some runnable task waited for a CPU, /proc/pressure/cpu",
       "host_pressure_cpu_some_ratio", "Share of time some runnable task waited for a CPU, 0-1 (/proc/pressure/cpu)."),
    _m(KIND_SYSTEM, "cgroup_cpu_limit", "cores", "CPU limit",
       "CPU quota of the target's cgroup in cores (quota / period); none if unlimited",
       "cgroup_cpu_limit_cores", "CPU quota of the target's cgroup in cores (quota / period); absent when unlimited."),
    _m(KIND_SYSTEM, "cgroup_throttled_pct", "%", "throttled",
       "share of the cgroup's CFS periods in which it hit its CPU quota and was paused",
       "cgroup_cpu_throttled_periods_ratio", "Share of the cgroup's CFS periods in which it hit its CPU quota, 0-1."),
    _m(KIND_SYSTEM, "cgroup_throttled_ms_per_s", "ms/s", "throttled ms/s",
       "time the cgroup's tasks spent paused by the CPU quota, per second",
       "cgroup_cpu_throttled_seconds_per_second",
       "Time the cgroup's tasks spent paused by the CPU quota, seconds per second."),
    _m(KIND_SYSTEM, "cgroup_mem_limit", "B", "cg mem limit",
       "memory limit of the target's cgroup (tightest of its ancestors); none if unlimited",
       "cgroup_memory_limit_bytes",
       "Memory limit of the target's cgroup (tightest of its ancestors), in bytes; absent when unlimited."),
    _m(KIND_SYSTEM, "cgroup_mem_used", "B", "cg mem used", "memory charged to the target's cgroup, page cache included",
       "cgroup_memory_used_bytes", "Memory charged to the target's cgroup, page cache included, in bytes."),
    _m(KIND_PROC, "cpu_pct", "%", "CPU", "CPU time of the process per wall second (100 = one core), user + system",
       "process_cpu_seconds_per_second", "CPU time of the process per wall second, user + system (1 = one core busy)."),
    _m(KIND_PROC, "user_pct", "%", "user", "user-mode CPU of the process (100 = one core)",
       "process_cpu_user_seconds_per_second", "User-mode CPU time of the process per second."),
    _m(KIND_PROC, "sys_pct", "%", "sys", "kernel-mode CPU of the process (100 = one core)",
       "process_cpu_system_seconds_per_second", "Kernel-mode CPU time of the process per second."),
    _m(KIND_PROC, "cpu_wait_pct", "%", "runq wait",
       "time its threads were ready to run but waited for a CPU (100 = one thread waiting all the time)",
       "process_runqueue_wait_seconds_per_second",
       "Time the process's threads were ready to run but waited for a CPU, seconds per second (schedstat)."),
    _m(KIND_PROC, "rss", "B", "RSS", "resident memory; pages shared with other processes count in each",
       "process_resident_memory_bytes", "Resident memory of the process, in bytes."),
    _m(KIND_PROC, "threads", "", "threads", "number of threads",
       "process_threads", "Number of threads of the process."),
    _m(KIND_PROC, "majflt_ps", "/s", "major faults/s",
       "page faults per second that had to read from disk or swap (/proc/PID/stat majflt)",
       "process_major_page_faults_per_second", "Page faults per second that had to read from disk or swap."),
    _m(KIND_PROC, "ctx_vol_ps", "/s", "vol cs/s",
       "voluntary context switches per second, all threads (blocking: I/O, locks, the GIL, sleeps)",
       "process_voluntary_context_switches_per_second",
       "Voluntary context switches per second, all threads (blocking: I/O, locks, the GIL, sleeps)."),
    _m(KIND_PROC, "ctx_invol_ps", "/s", "invol cs/s",
       "involuntary context switches per second, all threads (preempted: more runnable threads than cores)",
       "process_involuntary_context_switches_per_second",
       "Involuntary context switches per second, all threads (preempted)."),
    _m(KIND_PROC, "io_read_bps", "B/s", "disk read",
       "bytes the process caused to be read from storage per second (/proc/PID/io read_bytes)",
       "process_disk_read_bytes_per_second",
       "Bytes the process caused to be read from storage per second (/proc/PID/io read_bytes)."),
    _m(KIND_PROC, "io_write_bps", "B/s", "disk write",
       "bytes the process caused to be written to storage per second (write_bytes)",
       "process_disk_write_bytes_per_second",
       "Bytes the process caused to be written to storage per second (write_bytes)."),
    _m(KIND_PROC, "io_rchar_bps", "B/s", "read()",
       "bytes returned by read-like syscalls per second, page cache, pipes and sockets included (rchar)",
       "process_read_syscall_bytes_per_second",
       "Bytes returned by read-like syscalls per second, page cache, pipes and sockets included (rchar)."),
    _m(KIND_PROC, "io_wchar_bps", "B/s", "write()", "bytes passed to write-like syscalls per second (wchar)",
       "process_write_syscall_bytes_per_second", "Bytes passed to write-like syscalls per second (wchar)."),
    _m(KIND_THREAD, "cpu_pct", "%", "CPU", "CPU time of the thread per wall second (100 = one core)",
       "thread_cpu_seconds_per_second", "CPU time of the thread per wall second (1 = one core)."),
    _m(KIND_THREAD, "user_pct", "%", "user", "user-mode CPU of the thread (100 = one core)",
       "thread_cpu_user_seconds_per_second", "User-mode CPU time of the thread per second."),
    _m(KIND_THREAD, "sys_pct", "%", "sys", "kernel-mode CPU of the thread (100 = one core)",
       "thread_cpu_system_seconds_per_second", "Kernel-mode CPU time of the thread per second."),
    _m(KIND_THREAD, "cpu_wait_pct", "%", "runq wait",
       "time the thread was ready to run but waited for a CPU (100 = all the time)",
       "thread_runqueue_wait_seconds_per_second",
       "Time the thread was ready to run but waited for a CPU, seconds per second."),
    _m(KIND_THREAD, "ctx_vol_ps", "/s", "vol cs/s", "voluntary context switches of the thread per second",
       "thread_voluntary_context_switches_per_second", "Voluntary context switches of the thread per second."),
    _m(KIND_THREAD, "ctx_invol_ps", "/s", "invol cs/s", "involuntary context switches of the thread per second",
       "thread_involuntary_context_switches_per_second", "Involuntary context switches of the thread per second."),
]




def _pct(x: float | None) -> float | None:
    """A share (1.0 = one core) as a percentage with one decimal. The inputs are differences
    of kernel integers over a positive time, so never NaN or infinite."""
    return None if x is None else round(x * 100.0, 1)


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _bps(x: float | None) -> int | None:
    return None if x is None else int(round(x))


# ---------------------------------------------------------------------------------------------
# The source


# jittered()'s mean is a little under the one asked once its tail is capped: 0.997 at the full
# rate (floor 0.5, cap 3), 0.976 with floor 0.8 and a cap of 2.5 s; asking 2% more while calm keeps
# the calm gap CALM_HELD_FACTOR times the full rate's mean (1.99 against 0.997 s)
_CALM_STRETCH = 1.02


class HostSource(ThreadedSource):
    name = "host"
    thread_name = "gputop-host"

    def __init__(self, clock, target, interval_s: float = DEFAULT_INTERVAL_S, calm=None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.clock = clock
        self.target = target
        self.interval_s = float(interval_s)
        # a JobCalm (sources/calm.py), or None for always the set interval
        self.calm = calm
        self._gap_weight = 1     # of the gap being waited: CALM_HELD_FACTOR when it is a calm one
        self.tick_weight = 1     # of the tick now: the gap before it (its samples' calm_factor)
        self._rng = random.Random()
        self._init_thread()
        self._budget = FdBudget()
        self._procs: dict[int, ProcFiles] = {}
        self._skip: set[int] = set()              # zombies of the tree: nothing to sample
        self._has_schedstat = schedstat_works()
        self.target_state: str | None = None       # None until the first tick
        self.target_exit_t: float | None = None
        self.system = SystemSampler(target.pid, self._budget)
        self.cpu_count = self.system.cpu_count
        self.cgroup = self.system.cgroup
        self._cgroup_error = self.system.cgroup_error
        # Accounting of our own cost (read by health and benchmarks/host_cost.py).
        self.ticks = 0
        self.cpu_s = 0.0                           # thread CPU time spent in ticks
        # Thread CPU seconds by phase of the tick (benchmarks/host_cost.py prints them).
        # system: /proc/stat, meminfo, vmstat, cgroup; main: the main process and its threads'
        # counters; tree: finding the descendants; children: their counters; rows: building
        # the samples; emit: handing them to the bus (the store and the recorder's queue).
        self.phase_s = {"system": 0.0, "main": 0.0, "tree": 0.0, "children": 0.0, "rows": 0.0, "emit": 0.0}
        self.tick_wall_s: deque[float] = deque(maxlen=4096)
        self._heartbeat = Heartbeat(HEALTH_EVERY_S)
        self._health_cpu = (0.0, 0.0, 0)           # (cpu_s, monotonic, ticks) at last health
        self._cost_pct: float | None = None         # own CPU, % of one core, last window
        self._error: str | None = None
        self._thread_rows_capped = 0
        self._n_threads = 0
        self.ranks = RankFinder(target.pid)

    # -- Source protocol ------------------------------------------------------------------
    def stop(self) -> None:
        self._stop_thread(timeout=5)
        self._close_all()

    def describe(self) -> dict:
        return {
            "interval_s": self.interval_s,
            "rate_hz": round(1.0 / self.interval_s, 3),
            "jitter": "interval x (0.5 + Exp(mean 0.5)), capped at 3x",
            "cpu_count": self.cpu_count,
            "mem_total": self.system.mem_total if self.system.mem_total is not None else self.system.mem_total_now(),
            "page_size": PAGE_SIZE,
            "clk_tck": CLK_TCK,
            "cgroup": self.cgroup.describe() if self.cgroup else {"problem": self._cgroup_error},
            "thread_rows": f"threads of the main process (at most {MAX_THREAD_ROWS}, busiest first)",
            "fd_budget": self._budget.limit,
            "ranks": "RANK / OMPI_COMM_WORLD_RANK / PMI_RANK / SLURM_PROCID from /proc/PID/environ, once per new process",
        }

    # -- the loop ---------------------------------------------------------------------------
    def _next_delay(self) -> float:
        """A jittered interval: never periodic, so samples cannot lock onto a training step's
        period. Mean ~ interval_s (0.997 x), never below half of it or above three times it.
        While the job is calm, between 1.63 and 2.5 x interval_s (2.5 s: what a sparkline's cell
        holds, ui/fmt.HOLD_S, and under the views' other holds), mean 1.99 x: CALM_HELD_FACTOR
        times the full rate's mean, so a calm tick's weight (its calm_factor) is its share of
        time. Called just before a tick: that tick stands for the gap before it."""
        self.tick_weight = self._gap_weight
        if self.calm is not None and self.calm.calm():
            self._gap_weight = CALM_HELD_FACTOR
            mean = self.interval_s * CALM_HELD_FACTOR * _CALM_STRETCH
            return jittered(mean, self._rng, floor=0.8, cap=CALM_HELD_FACTOR * 1.25 * self.interval_s / mean)
        self._gap_weight = 1
        return jittered(self.interval_s, self._rng, floor=0.5, cap=3.0)

    def _main(self) -> None:
        while not self._stop.is_set():
            # The next tick is due a jittered delay after this one *started*: a late tick
            # (a busy box) pushes the next one back instead of causing a burst to catch up.
            due = time.monotonic() + self._next_delay()
            self._tick_guarded()
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
        self._close_all()

    def _tick_guarded(self) -> None:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        t = self.clock.now()
        try:
            self._tick(t)
            self._error = None
        except Exception as e:  # a bug or a surprise of the machine: say it, keep going
            self._error = f"{type(e).__name__}: {e}"
        wall = time.perf_counter() - wall0
        self.cpu_s += time.thread_time() - cpu0
        self.ticks += 1
        self.tick_wall_s.append(wall)
        try:
            self._maybe_health(t)
        except Exception:
            pass

    def _tick(self, t: float) -> None:
        emit = self._emit
        p0 = time.thread_time()
        system = self.system.sample(t)
        p1 = time.thread_time()
        if self.tick_weight > 1:
            system[WEIGHT_FIELD] = self.tick_weight
        emit(Sample(t, KIND_SYSTEM, "host", system))
        p2 = time.thread_time()
        self.phase_s["system"] += p1 - p0
        self.phase_s["emit"] += p2 - p1
        if self.target_state != "exited":
            self._sample_tree(t)

    # -- the tree ---------------------------------------------------------------------------
    def _sample_tree(self, t: float) -> None:
        clock = time.thread_time
        p0 = clock()
        main_pid = self.target.pid
        main = self._procs.get(main_pid)
        if main is None:
            try:
                main = self._procs[main_pid] = ProcFiles(main_pid, True, self._budget)
            except Gone:
                self._target_exited(t)
                return
        try:
            main_stat = self._read_proc(main, t)
        except Gone:
            self._target_exited(t)
            return
        if self.target_state is None:
            self.target_state = "running"
            self._emit(Sample(t, KIND_TARGET, str(main_pid), self._target_data("running")))
        p1 = clock()
        tree = self.target.tree(max_age_s=min(TREE_MAX_AGE_S, self.interval_s))
        p2 = clock()
        by_pid = {p.pid: p for p in tree}
        for pid in list(self._procs):
            if pid not in by_pid:
                self._procs.pop(pid).close()
        self._skip &= set(by_pid)
        stats = {main_pid: main_stat}
        for pid in by_pid:
            if pid == main_pid or pid in self._skip:
                continue
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = ProcFiles(pid, False, self._budget)
                stats[pid] = self._read_proc(proc, t)
            except (Gone, OSError) as e:
                gone = self._procs.pop(pid, None)
                if gone is not None:
                    gone.close()
                if isinstance(e, Gone):
                    self._skip.add(pid)  # a zombie: nothing to read until it is reaped
        # The parents just read decide: a process whose parent exited was re-parented out of
        # the tree (the tree's cached parents are re-checked only every second).
        kids: dict[int, list[int]] = {}
        for pid, data in stats.items():
            kids.setdefault(data["ppid"], []).append(pid)
        inside, queue = {main_pid}, [main_pid]
        while queue:
            for kid in kids.get(queue.pop(), ()):
                if kid not in inside:
                    inside.add(kid)
                    queue.append(kid)
        p3 = clock()
        out: list[Sample] = []
        for pid, data in stats.items():
            if pid not in inside:
                continue
            proc = self._procs[pid]
            self._update_identity(proc, by_pid.get(pid), data.pop("_name"))
            data["role"] = proc.role
            if proc.info_said != (proc.name, proc.role):
                proc.info_said = (proc.name, proc.role)
                out.append(Sample(t, KIND_PROC_INFO, str(pid), self._info(proc, by_pid.get(pid))))
            if self.tick_weight > 1:
                data[WEIGHT_FIELD] = self.tick_weight
            out.append(Sample(t, KIND_PROC, str(pid), data))
        out.extend(self._thread_samples(main, t))
        out.extend(self.ranks.update(t, {pid: (stats[pid]["ppid"], self._procs[pid].name, self._procs[pid].cmdline)
                                         for pid in inside}))
        p4 = clock()
        for s in out:
            self._emit(s)
        p5 = clock()
        ph = self.phase_s
        ph["main"] += p1 - p0
        ph["tree"] += p2 - p1
        ph["children"] += p3 - p2
        ph["rows"] += p4 - p3
        ph["emit"] += p5 - p4

    def _read_proc(self, proc: ProcFiles, t: float) -> dict:
        """One process's numbers now. Raises Gone when it exited (a zombie counts as gone)."""
        name, state, f = parse_stat(proc.stat.read())
        if state in GONE_STATES:
            raise Gone(proc.base)
        nthreads = int(f[F_THREADS])
        utime, stime = int(f[F_UTIME]), int(f[F_STIME])
        majflt = int(f[F_MAJFLT])
        proc.ppid = int(f[F_PPID])
        # Threads: context switches and run-queue waits are per thread in Linux. The task
        # directory is listed again only when the thread count changed or a thread vanished
        # (a held file of an exited thread fails with ESRCH): same count, all readable = same set.
        if nthreads <= 1 and not proc.is_main:
            tids = [proc.pid]
        elif nthreads == len(proc.tasks) and not proc.relist:
            tids = list(proc.tasks)
        else:
            try:
                tids = [int(x) for x in os.listdir(proc.base + "/task")]
            except FileNotFoundError:
                raise Gone(proc.base) from None
        proc.relist = False
        seen = set()
        refresh_every = REFRESH_IDLE_TICKS
        for tid in tids:
            task = proc.tasks.get(tid)
            try:
                if task is None:
                    task = proc.tasks[tid] = TaskFiles(f"{proc.base}/task/{tid}", self._budget, proc.is_main,
                                                   self._has_schedstat)
                task.read(refresh=(self.ticks + tid) % refresh_every == 0)
            except (Gone, OSError, ValueError, IndexError):
                proc.relist = True
                continue
            seen.add(tid)
        if len(seen) != len(proc.tasks):
            for tid in [x for x in proc.tasks if x not in seen]:
                proc.retire(tid)
        live = proc.tasks.values()
        vol = proc.dead[0] + sum(x.vol for x in live)
        invol = proc.dead[1] + sum(x.invol for x in live)
        wait_ns = None if not self._has_schedstat else proc.dead[2] + sum(x.wait_ns or 0 for x in live)
        r = proc.rates
        cpu = r.rate("cpu", (utime + stime) / CLK_TCK, t)
        user = r.rate("user", utime / CLK_TCK, t)
        sys_ = r.rate("sys", stime / CLK_TCK, t)
        wait = r.rate("wait", None if wait_ns is None else wait_ns / 1e9, t)
        d = {
            "_name": name,
            "ppid": proc.ppid,
            "name": name,
            "cpu_pct": _pct(cpu), "user_pct": _pct(user), "sys_pct": _pct(sys_), "cpu_wait_pct": _pct(wait),
            "rss": int(f[F_RSS]) * PAGE_SIZE,
            "threads": nthreads,
            "majflt_ps": _r1(r.rate("majflt", majflt, t)),
            "ctx_vol_ps": _r1(r.rate("vol", vol, t)),
            "ctx_invol_ps": _r1(r.rate("invol", invol, t)),
            "io_read_bps": None, "io_write_bps": None, "io_rchar_bps": None, "io_wchar_bps": None,
            "state": STATE_WORDS.get(state, state),
        }
        if proc.io is not None:
            try:
                io = parse_kv(proc.io.read())
            except PermissionError:
                proc.io, proc.io_denied = None, True
                io = {}
            d["io_read_bps"] = _bps(r.rate("rb", io.get(b"read_bytes"), t))
            d["io_write_bps"] = _bps(r.rate("wb", io.get(b"write_bytes"), t))
            d["io_rchar_bps"] = _bps(r.rate("rc", io.get(b"rchar"), t))
            d["io_wchar_bps"] = _bps(r.rate("wc", io.get(b"wchar"), t))
        return d

    def _update_identity(self, proc: ProcFiles, ps_proc, name: str) -> None:
        """Name, command line and role. The command line is read again when the name changes
        (an exec, or torch renaming a DataLoader worker) and at a new process's first ticks
        (an exec that keeps the name: YOUNG_CMDLINE_TICKS and YOUNG_CMDLINE_S); the rank finder reads the
        environment again when it changes."""
        young = proc.young_ticks > 0 or time.monotonic() < proc.young_until
        if proc.young_ticks > 0:
            proc.young_ticks -= 1
        if proc.cmdline is None or name != proc.name or young:
            proc.cmdline = self._cmdline(proc, ps_proc)
            joined = " ".join(proc.cmdline)
            proc.mp_helper = is_mp_helper(joined)
        proc.name = name
        proc.role = self._role(proc)

    @staticmethod
    def _cmdline(proc: ProcFiles, ps_proc) -> list[str]:
        try:
            if ps_proc is not None:
                return ps_proc.cmdline()
            with open(proc.base + "/cmdline", "rb") as f:
                return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except Exception:
            return []

    def _role(self, proc: ProcFiles) -> str:
        """The recorded role (gputop.sources.procfs.process_role says how it is decided)."""
        parent = self._procs.get(proc.ppid) if proc.ppid is not None else None
        return process_role(proc, self.target.pid, self.target.cmdline, parent)

    @staticmethod
    def _info(proc: ProcFiles, ps_proc) -> dict:
        create_time = user = None
        if ps_proc is not None:
            try:
                create_time = round(ps_proc.create_time(), 2)
            except Exception:
                pass
            try:
                user = ps_proc.username()
            except Exception:
                pass
        return {"name": proc.name, "cmdline": list(proc.cmdline or []), "ppid": proc.ppid,
                "create_time": create_time, "role": proc.role, "user": user}

    def _thread_samples(self, main: ProcFiles, t: float) -> list[Sample]:
        """Rows for the main process's threads, from the counters ``_read_proc`` just read."""
        rows = []
        for tid, task in main.tasks.items():
            if task.stat is None or not task.name:
                continue
            cpu = user = sys_ = wait = vol = invol = None
            prev = task.prev
            if prev is not None and t > task.t:
                dt = t - task.t
                du, ds = task.utime - prev[0], task.stime - prev[1]
                if du >= 0 and ds >= 0:
                    user, sys_ = du / CLK_TCK / dt, ds / CLK_TCK / dt
                    cpu = user + sys_
                if task.vol >= prev[2] and task.invol >= prev[3]:
                    vol, invol = (task.vol - prev[2]) / dt, (task.invol - prev[3]) / dt
                if task.wait_ns is not None and prev[4] is not None and task.wait_ns >= prev[4]:
                    wait = (task.wait_ns - prev[4]) / 1e9 / dt
            task.prev = (task.utime, task.stime, task.vol, task.invol, task.wait_ns)
            task.t = t
            rows.append((cpu or 0.0, tid, {
                "name": task.name, "state": STATE_WORDS.get(task.state, task.state),
                "cpu_pct": _pct(cpu), "user_pct": _pct(user), "sys_pct": _pct(sys_),
                "cpu_wait_pct": _pct(wait),
                "ctx_vol_ps": _r1(vol), "ctx_invol_ps": _r1(invol),
            }))
        self._n_threads = len(rows)
        self._thread_rows_capped = max(0, len(rows) - MAX_THREAD_ROWS)
        if self._thread_rows_capped:
            rows.sort(key=lambda r: -r[0])
            rows = rows[:MAX_THREAD_ROWS]
        key = f"{main.pid}:"
        return [Sample(t, KIND_THREAD, key + str(tid), data) for _c, tid, data in rows]

    # -- the target's life ------------------------------------------------------------------
    def _target_data(self, state: str) -> dict:
        d = {"state": state, "pid": self.target.pid, "command": self.target.command,
             "python": bool(self.target.is_python())}
        if state == "exited":
            d["exit_t"] = self.target_exit_t
        return d

    def _target_exited(self, t: float) -> None:
        self.target_state = "exited"
        self.target_exit_t = round(t, 3)
        try:
            self.target.note_exited()
        except AttributeError:
            pass
        self._close_procs()
        for s in self.ranks.end_all(t):
            self._emit(s)
        self._emit(Sample(t, KIND_TARGET, str(self.target.pid), self._target_data("exited")))
        self._maybe_health(t, force=True)

    def _close_procs(self) -> None:
        for proc in self._procs.values():
            proc.close()
        self._procs.clear()
        self._n_threads = 0
        self._thread_rows_capped = 0

    def _close_all(self) -> None:
        self._close_procs()
        self.system.close()

    # -- health -----------------------------------------------------------------------------
    def _maybe_health(self, t: float, force: bool = False) -> None:
        problems = []
        if self._error:
            problems.append(f"sampling failed: {self._error}")
        if self.target_state == "exited":
            problems.append(f"the target (PID {self.target.pid}) exited at t={self.target_exit_t:.1f} s: "
                            f"its process and thread samples stopped, host-wide samples go on")
        denied = sorted(p.pid for p in self._procs.values() if p.io_denied)
        if denied:
            shown = ", ".join(map(str, denied[:5])) + (" ..." if len(denied) > 5 else "")
            problems.append(f"I/O counters not readable for PID {shown}: run gputop as the same user or root")
        if self._cgroup_error:
            problems.append(self._cgroup_error)
        env_denied = sorted(self.ranks.denied)
        if env_denied:
            shown = ", ".join(map(str, env_denied[:5])) + (" ..." if len(env_denied) > 5 else "")
            problems.append(f"environment of PID {shown} not readable (another user's process): their ranks "
                            f"come from the in-process probe only; run gputop as the same user or root")
        if self._thread_rows_capped:
            problems.append(f"the main process has {self._n_threads} threads: only the busiest "
                            f"{MAX_THREAD_ROWS} are shown")
        now = time.monotonic()
        cpu0, at0, ticks0 = self._health_cpu
        window = now - at0 >= 1.0 and at0 > 0   # a cost over a shorter window is noise
        cost = 100.0 * (self.cpu_s - cpu0) / (now - at0) if window else self._cost_pct
        if cost is not None and cost > COST_WARN_PCT:
            problems.append(f"sampling costs {cost:.1f}% of a core ({len(self._procs)} processes, "
                            f"{self._n_threads} threads): more than planned")
        state = "failed" if self._error and self.ticks and self.target_state is None else (
            "degraded" if problems else "ok")
        every_s = self.interval_s * self._gap_weight   # (twice the interval while calm)
        message = "; ".join(problems) if problems else (
            f"sampling the target's processes and threads and the host every ~{every_s:g} s (jittered)")
        said = (state, message)
        if not self._heartbeat.due(said, t, force):
            return
        recent = list(self.tick_wall_s)[-max(1, self.ticks - ticks0):] if self.tick_wall_s else []
        self._heartbeat.mark(said, t)
        if window or at0 == 0:
            self._health_cpu = (self.cpu_s, now, self.ticks)
            self._cost_pct = cost
        self._emit(Sample(t, KIND_HEALTH, self.name, health_data(
            state, message, rate_hz=round(1.0 / every_s, 3), calm=self._gap_weight > 1,
            target_state=self.target_state, procs=len(self._procs), threads=self._n_threads,
            ranks=len(self.ranks.running),
            cost_pct=clean_float(cost, 2),
            tick_ms=clean_float(1000.0 * sum(recent) / len(recent), 2) if recent else None,
            cgroup=self.cgroup.version if self.cgroup else None)))
