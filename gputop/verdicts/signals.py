"""From a window of samples to the few numbers the verdict rules reason about.

``build_signals(store, now)`` reads the last ``window_s`` seconds of every source and returns
``Signals``: named numbers (None when unknown), which sources contributed, and a few
non-numeric facts for evidence (the hottest sync line, the DataLoader's settings...).
Shares are fractions 0-1; GPU percentages stay percentages as NVML reports them.

Everything here is a pure function of the store's contents, so a replay derives the same
signals as the live session did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce
from operator import add

from gputop.derive.call_sites import call_site
from gputop.derive.moments import chosen_gpus
from gputop.derive.stats import is_number
from gputop.derive.steps import latest_copies, pool_collectives, pool_steps
from gputop.derive.thread_samples import window_weight
from gputop.derive.threads import KIND_THREAD_STATE
from gputop.model import KIND_GPU, KIND_GPU_INFO, KIND_GPU_PROCS, KIND_HEALTH, KIND_PROC, KIND_SYSTEM
from gputop.catalogue import (KIND_BUDGET, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_STEP, KIND_PROBE_SYNC,
                              KIND_RANK, KIND_STALL,
                              KIND_STALL_SNAPSHOT, KIND_THREAD_KERNEL, WAIT_CLASSES)

BUDGET_STALE_S = 3.0  # a budget older than this is not the window being judged
WINDOW_S = 10.0   # long enough to span several training steps, short enough to react in seconds
# recompiles are a pattern when they come in this many seconds, not in WINDOW_S: under inductor on
# the H200 one took 10.2 s (and its backward 5.5 s), so a 10 s window never held two of them
RECOMPILE_HORIZON_S = 60.0

THERMAL_EVENTS = ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")
POWER_EVENTS = ("sw_power_cap",)


@dataclass
class Signals:
    now: float
    window_s: float
    values: dict[str, float | None] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)
    have: set[str] = field(default_factory=set)    # sources that contributed: nvml gpm host stacks probe psi cgroup
    # sources that are running but have not delivered yet (the first seconds after attach):
    # rules that conclude from the *absence* of a wait must hold off until these arrive
    pending: set[str] = field(default_factory=set)

    def get(self, name: str) -> float | None:
        v = self.values.get(name)
        return v if is_number(v) else None

    def set(self, name: str, value) -> None:
        self.values[name] = float(value) if is_number(value) and math.isfinite(value) else None


_NUMBER_TYPES = (int, float)  # exact types: a bool is not a number here
KERNEL_SAMPLE_STALE_S = 1200.0   # a kernel trace older than this is not read (twice the probe's EVERY_S)
# a trace's span, from the tick that started it: the wait for a step boundary (up to 1 s), its window
# (up to 3 s), its stop and reading (up to ~1.4 s measured), with room for a slow stop (a deep queue)
KERNEL_TRACE_SPAN_S = 8.0


def _total(nums: list) -> float:
    """0.0 + nums[0] + nums[1] + ..., left to right: what a ``total += x`` loop gives, bit for
    bit, at C speed (``sum`` of floats is compensated from Python 3.12 on, so would differ)."""
    return reduce(add, nums, 0.0)


def _mean(xs):
    nums = [x for x in xs if type(x) in _NUMBER_TYPES]
    return _total(nums) / len(nums) if nums else None


GPU_FIELDS = ("sm_active", "gr_active", "tensor_active", "dram_bw", "sm_occupancy", "util_gpu", "util_mem", "pcie_rx_mibs",
              "pcie_tx_mibs", "nvlink_rx_mibs", "nvlink_tx_mibs", "power_w", "clock_sm_mhz", "mem_used",
              "mem_total", "power_limit_w")


def _field_means(samples, fields) -> dict[str, float | None]:
    """Mean of each field over the samples (this runs every second per GPU): one list of the
    numbers per field, summed left to right as a running total would be."""
    # (per field, a list of its numbers: 165 us for 100 samples of 15 fields, against 254 for a
    # running total per field and 202 for rows of all fields turned into columns)
    datas = [s.data for s in samples]
    out = {}
    for f in fields:
        nums = [v for d in datas if type(v := d.get(f)) in _NUMBER_TYPES]
        out[f] = _total(nums) / len(nums) if nums else None
    return out


def _window(store, kind, since):
    return store.window(kind, since)


def _gpu_signals(store, since: float, sig: Signals, only: list[str] | None = None) -> None:
    infos = store.latest_of_kind(KIND_GPU_INFO)
    series = _window(store, KIND_GPU, since)
    if not series:
        return
    # The GPUs to judge: one rank's, else those the target uses, else those the user chose,
    # else all watched.
    chosen = chosen_gpus(store, only, fallback=list(series))
    keys = [k for k in chosen if k in series]
    if not keys:
        return
    sig.have.add("nvml")
    sig.facts["gpus"] = keys
    per_gpu: dict[str, dict[str, float | None]] = {}
    for k in keys:
        samples = series[k]
        info = infos.get(k)
        row = _field_means(samples, GPU_FIELDS)
        n = len(samples)
        events = [s.data.get("clock_events") or [] for s in samples]
        # (most samples have no clock event: an empty list is skipped before any() is set up)
        row["power_cap_share"] = sum(1 for ev in events if ev and any(e in POWER_EVENTS for e in ev)) / n
        row["thermal_share"] = sum(1 for ev in events if ev and any(e in THERMAL_EVENTS for e in ev)) / n
        max_clock = info.get("clock_sm_max_mhz") if info else None
        row["clock_ratio"] = (row["clock_sm_mhz"] / max_clock) if (row["clock_sm_mhz"] and is_number(max_clock) and max_clock) else None
        row["mem_used_frac"] = (row["mem_used"] / row["mem_total"]) if (row["mem_used"] is not None and row["mem_total"]) else None
        per_gpu[k] = row
    for name in ("sm_active", "gr_active", "tensor_active", "dram_bw", "sm_occupancy", "util_gpu", "util_mem", "pcie_rx_mibs", "pcie_tx_mibs",
                 "nvlink_rx_mibs", "nvlink_tx_mibs", "power_w", "clock_ratio", "power_cap_share", "thermal_share"):
        sig.set(f"gpu.{name}", _mean(r[name] for r in per_gpu.values()))
    sig.set("gpu.copy_only", _copy_only(sig))
    sig.set("gpu.mem_used_frac", max((r["mem_used_frac"] for r in per_gpu.values() if r["mem_used_frac"] is not None), default=None))
    _sharing_signals(store, since, keys, sig)
    if sig.get("gpu.sm_active") is not None:
        sig.have.add("gpm")
    sig.facts["gpu_names"] = sorted({str(infos[k].get("name")) for k in keys if k in infos})


# PCIe traffic (both ways, MiB/s) from which util.gpu's excess over the compute engine is copying
COPYING_PCIE_MIBS = 1000.0


def _copy_only(sig: Signals) -> float | None:
    """The share of the window util.gpu counted busy while GPM's graphics/compute engine was not:
    the copy engines' (util.gpu counts them: on the offload job util.gpu read 9.4% where GR active
    read 3.0%, on pageable batch copies 19% against 7.6%, and within 5 points of it on the
    corpus's other recordings, H200 and H100). Only with PCIe busy (``COPYING_PCIE_MIBS``): GPM samples
    0.1 s every 0.5 s, so on a periodic job the two means drift apart by several points with no
    copy at all. None without GPM."""
    util, gr = sig.get("gpu.util_gpu"), sig.get("gpu.gr_active")
    if util is None or gr is None:
        return None
    pcie = (sig.get("gpu.pcie_rx_mibs") or 0.0) + (sig.get("gpu.pcie_tx_mibs") or 0.0)
    return max(0.0, util - gr) / 100.0 if pcie >= COPYING_PCIE_MIBS else 0.0


# util.gpu over GPM's graphics/compute engine, in points, under which a gap is the two means' drift (GPM
# samples 0.1 s every 0.5 s: on a periodic job they drift apart by several points, _copy_only; retry jobs
# showed 6-8, which is why the gap counts only where the probe counted a rebuilt cache)
ENGINES_GAP_NOISE_PCT = 5.0
# cudaFree and cudaMalloc calls a step (each) from which the CUDA cache is rebuilt every step
# (torch.cuda.empty_cache() in the loop: 46-109 a step on four H100 jobs; a Trainer calling it
# mid-step, its activations live, freed 1.5 a step and its fix gained +6%). allocator_thrash's threshold
ALLOC_FREES_PER_STEP = 10.0


def cache_rebuilt(sig: Signals) -> bool:
    """The probe counted the allocator giving back and making again >= ``ALLOC_FREES_PER_STEP``
    segments a step."""
    mallocs, frees = sig.get("probe.cuda_mallocs_per_step"), sig.get("probe.cuda_frees_per_step")
    return mallocs is not None and frees is not None and min(mallocs, frees) >= ALLOC_FREES_PER_STEP


def _driver_only(sig: Signals) -> float | None:
    """The share of the window util.gpu counted busy while GPM's graphics/compute engine was not and
    PCIe was quiet (no copy to explain it), where the probe counted the allocator rebuilding its
    cache every step (``cache_rebuilt``): the driver's work for it on the GPU. On an H100 a nanoGPT
    loop calling torch.cuda.empty_cache() every step read util.gpu 98% and GR active 72% over
    steady training in its first run (fixed: 96% and 95%; its fix +42%): each step's cudaFree of every cached segment and cudaMalloc again
    keep util.gpu busy with no kernel running. Only with the calls counted: retry jobs without the
    counts showed gaps of 6-8 points where their fixes gained -1% and +7% (a periodic job's means
    drift apart). 0 within ``ENGINES_GAP_NOISE_PCT``; None without GPM, without a rebuilt cache, or
    while copying (that gap is the copies')."""
    util, gr = sig.get("gpu.util_gpu"), sig.get("gpu.gr_active")
    if util is None or gr is None or not cache_rebuilt(sig):
        return None
    pcie = (sig.get("gpu.pcie_rx_mibs") or 0.0) + (sig.get("gpu.pcie_tx_mibs") or 0.0)
    if pcie >= COPYING_PCIE_MIBS:
        return None
    gap = util - gr
    return gap / 100.0 if gap >= ENGINES_GAP_NOISE_PCT else 0.0


def _sm_sum(procs, skip: set[str] = frozenset()) -> float | None:
    nums = [p.get("sm_pct") for pid, p in procs.items()
            if pid not in skip and isinstance(p, dict) and type(p.get("sm_pct")) in _NUMBER_TYPES]
    return _total(nums) if nums else None


def _sharing_signals(store, since: float, keys: list[str], sig: Signals) -> None:
    """Other processes on the target's GPUs (gpu_procs.others): the share of the GPU's time their
    kernels ran (``gpu.others_sm_pct``) beside the target tree's (``gpu.target_sm_pct``), the mean
    over the window of each reading's sum, the GPUs' mean; and who they are (``facts["gpu_others"]``).
    The job's own ranks are never "others" (a rank outside the watched tree, sharing its GPU)."""
    ranks = {str(s.data.get("pid") or k) for k, s in store.latest_of_kind(KIND_RANK).items()}
    series = _window(store, KIND_GPU_PROCS, since)
    mine_g, others_g, named = [], [], {}
    for k in keys:
        samples = [s for s in series.get(k, ()) if isinstance(s.data.get("procs"), dict)]
        if not samples:
            continue
        # (the target's None while NVML gave others' samples: its kernels did not run, 0)
        mine = [_sm_sum(s.data["procs"]) if _sm_sum(s.data["procs"]) is not None
                else (0.0 if isinstance(s.data.get("others"), dict) and _sm_sum(s.data["others"]) is not None else None)
                for s in samples]
        # (no "others" and other_count 0: nobody else; other_count > 0 without them: a recording
        # made before gputop named them, unknown)
        others = [(_sm_sum(o, ranks) or 0.0) if isinstance(o := s.data.get("others"), dict)
                  else (0.0 if s.data.get("other_count") == 0 else None) for s in samples]
        if any(v is not None for v in mine) and any(v is not None for v in others):
            mine_g.append(_mean(mine))
            others_g.append(_mean(others))
        last = samples[-1].data.get("others")
        for pid, o in (last.items() if isinstance(last, dict) else ()):
            if pid not in ranks and isinstance(o, dict):
                named[pid] = {"pid": pid, "gpu": k,
                              "user": o.get("user") if isinstance(o.get("user"), str) else None,
                              "name": o.get("name") if isinstance(o.get("name"), str) else None,
                              "sm_pct": o.get("sm_pct") if type(o.get("sm_pct")) in _NUMBER_TYPES else None,
                              "mem": o.get("mem") if type(o.get("mem")) in _NUMBER_TYPES else None}
    if mine_g:
        # (each a share of the GPU's time: never above 100 together, whatever a file says)
        others_pct = min(100.0, _mean(others_g))
        sig.set("gpu.others_sm_pct", others_pct)
        sig.set("gpu.target_sm_pct", min(100.0 - others_pct, _mean(mine_g)))
        sig.facts["gpu_others"] = sorted(named.values(), key=lambda o: -(o["sm_pct"] or 0.0))


def _host_signals(store, since: float, sig: Signals, target_pid: str | None) -> None:
    system = _window(store, KIND_SYSTEM, since).get("host", [])
    if system:
        sd = [s.data for s in system]   # (Sample.get is data.get, one call less per value)
        sig.have.add("host")
        sig.set("host.cpu_pct", _mean(d.get("cpu_pct") for d in sd))
        sig.set("host.cpu_count", system[-1].get("cpu_count"))
        avail = [d.get("mem_available") / d.get("mem_total") for d in sd
                 if is_number(d.get("mem_available")) and is_number(d.get("mem_total")) and d.get("mem_total")]
        sig.set("host.mem_available_frac", min(avail) if avail else None)
        swap = [(d.get("swap_in_bps") or 0) + (d.get("swap_out_bps") or 0) for d in sd
                if is_number(d.get("swap_in_bps")) or is_number(d.get("swap_out_bps"))]
        sig.set("host.swap_bps", _mean(swap))
        thr = [d.get("cgroup_throttled_pct") for d in sd if is_number(d.get("cgroup_throttled_pct"))]
        if thr:
            sig.have.add("cgroup")
            sig.set("host.cgroup_throttled_pct", _mean(thr))
        sig.set("host.cgroup_cpu_limit", system[-1].get("cgroup_cpu_limit"))
        cg_mem = [d.get("cgroup_mem_used") / d.get("cgroup_mem_limit") for d in sd
                  if is_number(d.get("cgroup_mem_used")) and is_number(d.get("cgroup_mem_limit")) and d.get("cgroup_mem_limit")]
        sig.set("host.cgroup_mem_frac", max(cg_mem) if cg_mem else None)
        psi = [d.get("psi_mem_some_pct") for d in sd if is_number(d.get("psi_mem_some_pct"))]
        if psi:
            sig.have.add("psi")
            sig.set("host.psi_mem_some_pct", _mean(psi))
            sig.set("host.psi_mem_full_pct", _mean(d.get("psi_mem_full_pct") for d in sd))
        sig.set("host.psi_io_some_pct", _mean(d.get("psi_io_some_pct") for d in sd))
    procs = _window(store, KIND_PROC, since)
    workers, worker_waits, worker_pids = [], [], []
    for pid, samples in procs.items():
        role = samples[-1].get("role")
        rows = [s.data for s in samples]
        cpu = _mean(d.get("cpu_pct") for d in rows)
        if pid == target_pid or (target_pid is None and role == "main"):
            sig.set("proc.main.cpu_pct", cpu)
            sig.set("proc.main.majflt_ps", _mean(d.get("majflt_ps") for d in rows))
        elif role == "dataloader_worker":
            workers.append(cpu)
            worker_waits.append(_mean(d.get("cpu_wait_pct") for d in rows))
            worker_pids.append(pid)
    if workers:
        sig.set("proc.workers.count", len(workers))
        sig.set("proc.workers.cpu_pct_mean", _mean(workers))
        sig.set("proc.workers.busy", sum(1 for c in workers if c is not None and c >= 80.0))
        # What the workers do when not on a CPU decides the advice (rules.input_bound): runnable
        # but waiting for a core (schedstat, 100 = one thread waiting all the time), or blocked
        # in I/O system calls (the kernel wait sampler's share of the worker's own thread).
        sig.set("proc.workers.cpu_wait_pct_mean", _mean(worker_waits))
        sig.set("proc.workers.io_share", _worker_io_share(store, since, worker_pids))


_IO_COL = 2 + WAIT_CLASSES.index("io")   # in a thread_kernel row: tid, name, then the wait classes


def _worker_io_share(store, since: float, pids: list[str]) -> float | None:
    """Share of the kernel sampler's ticks in which the workers' own threads (TID = PID) were
    blocked in a read/write-like system call, over the window; None when none was sampled."""
    kernel = _window(store, KIND_THREAD_KERNEL, since)
    io = ticks = 0
    for pid in pids:
        for s in kernel.get(pid, ()):
            rows = s.get("threads")
            if not isinstance(rows, list):
                continue
            w = window_weight(s.data)   # a calm second's ticks count for the full rate's
            for row in rows:
                if not (isinstance(row, list) and len(row) > _IO_COL and str(row[0]) == pid):
                    continue
                counts = row[2:2 + len(WAIT_CLASSES)]
                if all(type(c) is int and c >= 0 for c in counts):
                    io += row[_IO_COL] * w
                    ticks += sum(counts) * w
    return io / ticks if ticks else None


def _stack_signals(store, since: float, sig: Signals, pid: str | None = None) -> None:
    states = store.latest_of_kind(KIND_THREAD_STATE)
    if not states:
        return
    fresh = {k: s for k, s in states.items() if s.t >= since}
    if pid is not None:  # one rank: its main thread is the one whose TID is its PID
        main = fresh.get(f"{pid}:{pid}")
        fresh = {k: v for k, v in fresh.items() if k.split(":")[0] == pid}
    else:
        main = next((s for s in fresh.values() if s.get("role") == "main"), None)
    if main is None:
        return
    sig.have.add("stacks")
    for state in ("running", "gil", "data", "cuda", "collective", "idle", "cpu_wait", "unknown"):
        v = main.get(f"{state}_pct")
        sig.set(f"py.main.{state}", v / 100.0 if is_number(v) else None)
    others = [s for s in fresh.values() if s.get("role") in ("thread", "child") and s is not main
              and s.key.split(":")[0] == main.key.split(":")[0]]
    busy = sorted(((s.get("running_pct") or 0.0, s.get("name") or s.key) for s in others), reverse=True)
    sig.set("py.others.running_sum", sum(r for r, _ in busy) / 100.0 if busy else 0.0)
    sig.facts["busy_threads"] = [(name, round(r)) for r, name in busy if r >= 20.0][:5]


def _kernel_signals(samples, step_ms: float | None, sig: Signals) -> None:
    """The probe's latest kernel trace (probe_step.kernel_ms_per_step, opt-in): the kernels' time
    per step, and their share of the window's mean step (``probe.kernel_busy``: the GPU's busy
    share as its kernels make it, where util.gpu counts their launch time too; at most 1)."""
    last = next((s for s in reversed(samples) if type(s.get("kernel_ms_per_step")) in _NUMBER_TYPES), None)
    if last is None or not step_ms or last.get("kernel_ms_per_step") <= 0:
        return
    age = last.get("kernel_sample_age_s")
    if type(age) not in _NUMBER_TYPES or age > KERNEL_SAMPLE_STALE_S:
        return   # (a trace this old may be of another phase or shape; the probe traces every 10 min)
    ms = float(last.get("kernel_ms_per_step"))
    # the steps the trace itself slowed (CUPTI records each launch; its stop and reading take up
    # to ~1.4 s: one RNN job lost 1.05 s of steps) are not the job's: the step it is divided by
    # leaves out the probe windows of the trace's span
    traced_at = last.t - age
    rest = pool_steps([s for s in samples if not traced_at <= s.t <= traced_at + KERNEL_TRACE_SPAN_S])
    if rest.timed_steps and rest.step_s_sum > 0:
        step_ms = rest.step_ms_mean
    sig.set("probe.kernel_ms_per_step", ms)
    sig.set("probe.kernel_busy", min(1.0, ms / step_ms))


def _probe_signals(store, since: float, sig: Signals, pid: str | None = None) -> None:
    steps = _window(store, KIND_PROBE_STEP, since)
    if pid is not None:
        steps = {k: v for k, v in steps.items() if k == pid}
    if not steps:
        return
    # One process: the rank asked for, else the busiest-reporting probe.
    key, samples = max(steps.items(), key=lambda kv: len(kv[1]))
    pool = pool_steps(samples)
    sig.have.add("probe")
    # Every step per observed second: the probe's own per-window steps/s, over the window.
    sig.set("probe.steps_per_s", pool.steps_per_observed_s)
    # torch.compile's compilations (gputop/probe/compiles.py), also in windows without a step
    sig.set("probe.compile_share", pool.compile_share)
    sig.set("probe.recompile_share", pool.recompile_share)
    if pool.compile_s is not None:
        sig.set("probe.recompiles", float(pool.recompiles))
        # windows with a recompile, over the horizon (the window's own, when it holds more)
        horizon = _window(store, KIND_PROBE_STEP, sig.now - RECOMPILE_HORIZON_S).get(key, [])
        recent = sum(1 for s in horizon if type(s.get("recompiles")) is int and s.get("recompiles") > 0)
        sig.set("probe.recompile_windows", float(max(pool.recompile_windows, recent)))
        # what recompiling costs, over the same horizon: one recompile under inductor takes
        # seconds, and a 10 s window holds either a compile or the fast steps between two
        sig.set("probe.recompile_cost", pool_steps(horizon).recompile_cost_share)
        sig.set("probe.recompile_limit_hits", float(pool.recompile_limit_hits))
        sig.facts["recompile_top"] = pool.recompile_top
        last = samples[-1]
        total = last.get("recompile_limit_hits_total")
        sig.facts["recompile_limit_total"] = total if type(total) is int else 0
        sig.facts["recompile_limit_top"] = {"function": last.get("recompile_limit_fn"),
                                            "where": last.get("recompile_limit_where")}
    # GradScaler's skipped optimizer steps (gputop/probe/amp_scaler.py)
    sig.set("probe.skipped_share", pool.skipped_share)
    if pool.scaler_steps:
        sig.set("probe.scaler_steps", float(pool.scaler_steps))
        sig.set("probe.skipped_steps", float(pool.skipped_steps))
        sig.set("probe.scaler_seen_steps", float(pool.scaler_steps - pool.skipped_unknown))
        known = [v for v in pool.loss_scales if v is not None]
        sig.facts["loss_scale"] = (known[0], known[-1], min(known)) if known else None
    copies = latest_copies(samples)
    if copies is not None:
        sig.facts["copies"] = copies
    # (before the timed steps: a loop that stopped stepping still has the allocator's counters)
    _allocator_signals(store, since, key, sig)
    if pool.timed_steps == 0 or pool.step_s_sum <= 0:
        return
    sig.set("probe.step_ms", pool.step_ms_mean)
    sig.set("probe.slow_step_excess", pool.slow_step_excess)
    sig.set("probe.data_wait_share", pool.data_wait_share)
    sig.set("probe.data_idle_share", pool.data_idle_share)
    sig.set("probe.gpu_share", pool.gpu_share)
    sig.set("probe.syncs_per_step", pool.syncs_per_timed_step)
    _kernel_signals(samples, pool.step_ms_mean, sig)
    _collective_signals(samples, sig)
    cfg = store.latest(KIND_PROBE_CONFIG, key)
    if cfg is not None:
        sig.facts["probe_config"] = dict(cfg.data)
    sync = store.latest(KIND_PROBE_SYNC, key)
    if sync is not None and sync.get("lines"):
        sig.facts["sync_top"] = sync.get("lines")[0]


def _allocator_signals(store, since: float, key: str, sig: Signals) -> None:
    """The CUDA caching allocator's retries (probe_memory.alloc_retries, a counter: a cudaMalloc
    that failed, so the allocator freed its whole cache, synchronizing the device, and tried again)
    per second over the window, and per step; its cudaMalloc and cudaFree calls per step
    (device_allocs, device_frees); with the allocator's reserved and allocated bytes."""
    mem = [s for s in _window(store, KIND_PROBE_MEMORY, since).get(key, ())
           if type(s.data.get("alloc_retries")) is int and s.data["alloc_retries"] >= 0]
    if len(mem) < 2 or mem[-1].t <= mem[0].t:
        return
    # (a counter that went back: the process restarted, or a hostile file; not a rate)
    delta = mem[-1].data["alloc_retries"] - mem[0].data["alloc_retries"]
    if delta < 0:
        return
    rate = delta / (mem[-1].t - mem[0].t)
    sig.set("probe.alloc_retries_per_s", rate)
    steps = sig.get("probe.steps_per_s")
    if steps:
        sig.set("probe.alloc_retries_per_step", rate / steps)
        # the cudaMalloc/cudaFree calls behind them, per step (torch 2.13 counts the calls; before it the probe
        # sends the segments created and freed; none in recordings made before 2026-12-07), over the
        # readings that carry both ends of the window
        for field, name in (("device_allocs", "probe.cuda_mallocs_per_step"), ("device_frees", "probe.cuda_frees_per_step")):
            have = [m for m in mem if type(m.data.get(field)) is int and m.data[field] >= 0]
            if len(have) >= 2 and have[-1].t > have[0].t and have[-1].data[field] >= have[0].data[field]:
                sig.set(name, (have[-1].data[field] - have[0].data[field]) / (have[-1].t - have[0].t) / steps)
    last = mem[-1].data
    sig.facts["allocator"] = {k: last.get(k) for k in ("allocated", "reserved", "peak_reserved")
                              if type(last.get(k)) in _NUMBER_TYPES}
    # CUDA out-of-memory errors raised in the window (probe_memory.ooms, a counter): a job that
    # catches them and goes on shows them nowhere else (a loop that skips every batch stalls
    # with the GPU busy)
    ooms = [s.data.get("ooms") for s in (mem[0], mem[-1])]
    if all(type(o) is int and o >= 0 for o in ooms) and ooms[1] >= ooms[0]:
        sig.set("probe.ooms_in_window", float(ooms[1] - ooms[0]))
        # each caught OOM is a step tried and thrown away (its batch dropped, or tried again): their
        # share of the steps tried over the same readings (an H100 job at the edge dropped 5 of
        # ~59 batches, ~8% of its data, while its steps/s said +2.5%)
        span = mem[-1].t - mem[0].t
        if steps and span > 0:   # (0 kept: the report's mean of it covers the windows without one)
            failed = ooms[1] - ooms[0]
            sig.set("probe.oom_share_of_tries", failed / (failed + steps * span))


def _collective_signals(samples, sig: Signals) -> None:
    """The probe's collective timing (DDP buckets, FSDP, explicit calls; gputop/probe/collectives.py)
    pooled over the window: ``probe.collective_wait_share`` (exposed: waited for, not overlapped)
    and ``probe.collective_share`` of step time. Unset (None) for windows without those fields,
    so that older recordings and jobs without torch.distributed are judged as before."""
    pooled = pool_collectives(samples)
    if pooled is not None:
        sig.set("probe.collective_wait_share", pooled[0])
        sig.set("probe.collective_share", pooled[1])
        last = samples[-1]
        sig.facts["collective_top_op"] = last.get("collective_top_op")
    off = samples[-1].get("collective_off") if samples else None
    if isinstance(off, str):
        sig.facts["collective_off"] = off


def _budget_signals(store, now: float, sig: Signals, pid: str | None = None) -> None:
    """The time budget of the judged window (gputop.derive.budget_processor): ``budget.<share>``
    and, as a fact, the whole budget (frames, stalls, probe split) for the rules' evidence."""
    b = store.latest(KIND_BUDGET, "window")
    if b is None or b.t < now - BUDGET_STALE_S or (pid is not None and b.get("pid") != pid):
        return
    shares = b.get("shares")
    if not isinstance(shares, dict):
        return
    sig.have.add("budget")
    for name, v in shares.items():
        if isinstance(name, str):
            sig.set(f"budget.{name}", v)
    sig.facts["budget"] = dict(b.data)


def _pending(store, sig: Signals) -> None:
    health = store.latest_of_kind(KIND_HEALTH)
    stacks = health.get("stacks")
    if "stacks" not in sig.have and stacks is not None and stacks.get("state") in ("ok", "degraded"):
        sig.pending.add("stacks")
    probe = health.get("probe")
    if "probe" not in sig.have and probe is not None and probe.get("state") == "ok":
        sig.pending.add("probe")  # a probe is attached; its first step window is on its way


def _stall_facts(store, now: float, sig: Signals) -> None:
    """The stall detector's newest word (gputop.derive.stall) and the snapshot taken of it."""
    st = store.latest(KIND_STALL, "job")
    if st is None or st.t < now - BUDGET_STALE_S:
        return
    sig.facts["stall"] = dict(st.data)
    snap = store.latest(KIND_STALL_SNAPSHOT, "job")
    if snap is not None:
        sig.facts["stall_snapshot"] = dict(snap.data)


def running_ranks(store, now: float) -> list[dict]:
    """The ranks of a distributed job that are running now, by rank number:
    [{"pid", "rank", "gpu"}], the GPU from NVML's process list (else the environment's hint).
    Empty for a single-process job."""
    from gputop.derive.ranks import rank_table

    out = []
    for row in rank_table(store, now):
        if row.get("state") == "exited":
            continue
        gpu = row.get("gpu")
        out.append({"pid": str(row["pid"]), "rank": row.get("rank"), "gpu": None if gpu is None else str(gpu)})
    out.sort(key=lambda r: (r["rank"] is None, r["rank"] if isinstance(r["rank"], int) else 0, r["pid"]))
    return out


def build_signals(store, now: float, window_s: float = WINDOW_S, rank: dict | None = None) -> Signals:
    """Signals of the job as a whole, or of one ``rank`` (from ``running_ranks``): its GPU,
    its main thread's states, its probe."""
    since = now - window_s
    sig = Signals(now=now, window_s=window_s)
    pid = rank["pid"] if rank else None
    _gpu_signals(store, since, sig, [rank["gpu"]] if rank and rank.get("gpu") is not None else None)
    _host_signals(store, since, sig, pid)
    _stack_signals(store, since, sig, pid)
    _probe_signals(store, since, sig, pid)
    _budget_signals(store, now, sig, pid)
    sig.set("gpu.driver_only", _driver_only(sig))   # (reads the GPU's and the probe's signals)
    if cache_rebuilt(sig):
        # the line that gives the cache back: torch.cuda.empty_cache()'s caller in the main thread's stacks
        sig.facts["empty_cache_site"] = call_site(store, since, "empty_cache", "torch/cuda/memory.py", pid)
    _pending(store, sig)
    _stall_facts(store, now, sig)
    if rank:
        sig.facts["rank"] = rank.get("rank")
        sig.facts["pid"] = pid
    return sig
