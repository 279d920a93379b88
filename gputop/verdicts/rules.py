"""The verdict rules: pure functions from ``Signals`` to a ``Finding`` (or None when a rule's
inputs are missing). Every threshold is a named constant; docs/verdicts.md gives the reason
for each value and must change with it. ``@verdict(...)`` declares each rule's id (its name),
title, severity, order and one-line meaning once (registry.py); the rule builds its finding
through its spec (``gpu_bound.spec.finding(level=..., ...)``), so the id and title come from there.

A rule's ``level`` is its main measure over its threshold (>= 1: holds). ``lost_share`` is
the share of step time (0-1) the cause costs, used to pick the primary verdict: a healthy
GPU-bound job loses nothing, so ``gpu_bound`` is primary only when nothing else costs time.
"""

from __future__ import annotations

from typing import Callable

from gputop.derive.steps import copies_text
from gputop.sources.probe_fields import COPY_WAYS
from gputop.verdicts.finding import SEVERITY_CRITICAL, SEVERITY_INFO, SEVERITY_WARNING, Finding, pct, rounded
from gputop.verdicts.registry import specs, verdict
from gputop.verdicts.signals import ALLOC_FREES_PER_STEP, Signals, cache_rebuilt  # noqa: F401  (allocator_thrash's meaning reads it)
from gputop.verdicts.workers import WORKERS_CPU_STARVED, input_advice, loader_config, worker_state

# -- thresholds (docs/verdicts.md explains each) -------------------------------------------------
GPU_BOUND_SM_ACTIVE = 80.0        # % SM active: DCGM's "necessary for effective use" line
GPU_BOUND_UTIL_NO_GPM = 95.0      # % util.gpu when GPM is missing (weak evidence)
GPU_BUSY_SM_ACTIVE = 70.0         # above this the GPU is busy enough that host-side waits are hidden
GPU_IDLE_SM_ACTIVE = 5.0          # % SM active below which the GPU is idle
GPU_IDLE_UTIL = 5.0               # % util.gpu below which no kernel ran most of the time
EXPLAINED_IDLE_SHARE = 0.25       # waits that explain idleness (data, sync, GIL, collectives)
MEMORY_BOUND_DRAM = 60.0          # % DRAM bandwidth: ~70% of the 87% practical peak on an H200
MEMORY_BOUND_MIN_SM = 50.0        # ... while the SMs are busy (else it is not the limit)
MEMORY_BOUND_UTIL_MEM_NO_GPM = 80.0  # % util.mem standing in for DRAM bandwidth without GPM
INPUT_BOUND_SHARE = 0.20          # share of step time blocked in next(DataLoader)
SYNC_STALL_SHARE = 0.20           # share of main-thread time waiting on the GPU
SYNC_STALL_SYNCS_PER_STEP = 2.0   # implicit syncs per step that make a stall likely
GIL_CONTENTION_SHARE = 0.15       # share of main-thread time waiting for the GIL
COMM_BOUND_SHARE = 0.20           # share of main-thread time in torch.distributed collectives
H2D_PCIE_RX_MIBS = 1000.0         # MiB/s host->device sustained over the window
H2D_MAX_SM = 70.0                 # ... while the GPU is not kept busy (the copies are not hidden)
PAGEABLE_PCIE_MIBS = 15000.0      # sustained copies slower than this look pageable (pinned: ~50 GB/s on Gen5)
# the probe's counted copies (one sampled step's) stand for the job's when, at its step rate, they
# carry at least this share of the PCIe traffic NVML saw (a prefetch thread's copies are not counted)
COPIES_EXPLAIN_PCIE = 0.5
PCIE_FASTEST_BPS = 64e9           # PCIe Gen5 x16, one direction: no copy moves its bytes faster
D2H_PCIE_TX_MIBS = 1000.0         # MiB/s device->host while the loop waits on the GPU: its waits are copies
LAUNCH_MAX_SM = 40.0              # % SM active: kernels too small to fill the GPU
LAUNCH_MIN_UTIL = 10.0            # % util.gpu: kernels are running (so it is not idle)
LAUNCH_MAIN_BUSY = 0.60           # main thread on the CPU (running) share
CLOCK_THERMAL_SHARE = 0.30        # share of samples with a thermal / hardware slowdown reason
CLOCK_POWER_SHARE = 0.50          # share of samples with the software power cap
CLOCK_RATIO_MAX = 0.90            # SM clock below this fraction of its maximum
SWAP_BPS = 1 << 20                # 1 MiB/s of swap traffic
PSI_MEM_SOME_PCT = 10.0           # % of time some task stalled on memory (PSI)
MEM_AVAILABLE_FRAC = 0.05         # available host memory below 5%
CGROUP_MEM_FULL_FRAC = 0.90       # the job's cgroup is at 90% of its memory limit ...
MAJFLT_PS = 50.0                  # ... and the main process faults pages in from disk this often
PSI_MEM_WITH_FAULTS_PCT = 3.0     # memory stalls that, with those faults, mean thrashing
CGROUP_THROTTLED_PCT = 10.0       # % of CFS periods throttled
CPU_WAIT_SHARE = 0.25             # share of time the main thread is runnable but has no core
GPU_MEM_USED_FRAC = 0.95          # GPU memory used
ALLOC_RETRIES_PER_STEP = 0.25     # CUDA allocator retries (a cache flush and a device sync each) per step ...
ALLOC_RETRIES_PER_S = 0.5         # ... and per second (a job of few long steps)
ALLOC_THRASH_SHARE = 0.10         # ... while the GPU loses this share of the time to it (host code and syncs, and the
                                  # driver's work util.gpu counts busy)
OFFLOAD_CPU_PARAMS = 0.5          # share of the optimizer's parameter elements on the CPU, the model on a GPU
OFFLOAD_SHARE = 0.10              # ... and the GPU idle this share of the time while the loop copies or computes on the CPU
GPU_SHARED_OTHERS_SM = 10.0       # % of the GPU's time other processes' kernels ran on the target's GPU
GPU_SHARED_FULL = 90.0            # % of the GPU's time all processes' kernels ran at which it is full
STRAGGLER_OTHERS_WAIT = 0.20      # the other ranks wait in collectives at least this share ...
STRAGGLER_GAP = 0.15              # ... and at least this much more than the rank they wait for


_pct, _r = pct, rounded   # (short names: the evidence dicts below use them on every line)



def _gate(level: float, ok: bool) -> float:
    """A rule whose precondition fails does not hold at all (level 0, not "almost"): an active
    verdict then leaves after the engine's LEAVE_S instead of being kept on by hysteresis."""
    return level if ok else 0.0


def _missing(sig: Signals, *names: str) -> tuple[str, ...]:
    return tuple(n for n in names if n not in sig.have)


def _confidence(base: float, missing: tuple[str, ...]) -> float:
    return round(max(0.2, base - 0.2 * len(missing)), 2)


def _idle_share(sig: Signals) -> float | None:
    sm = sig.get("gpu.sm_active")
    return None if sm is None else max(0.0, 1.0 - sm / 100.0)


def _share(sig: Signals) -> float | None:
    """The loop's data-wait share of step time: the probe's, else the main thread's from stacks."""
    probe = sig.get("probe.data_wait_share")
    return probe if probe is not None else sig.get("py.main.data")


def _free_cores(sig: Signals) -> float | None:
    """Idle cores on the host, by its CPU %; 0 while the main thread itself waits for a core."""
    wait = sig.get("py.main.cpu_wait")
    if wait is not None and wait >= CPU_WAIT_SHARE:
        return 0.0
    cores, host = sig.get("host.cpu_count"), sig.get("host.cpu_pct")
    return None if cores is None or host is None else cores * max(0.0, 1.0 - host / 100.0)


# -- rules ----------------------------------------------------------------------------------------

@verdict(title="GPU-bound (healthy)", severity=SEVERITY_INFO, order=120, names_cause=False,
         meaning="the GPU is the bottleneck (SM active >= {GPU_BOUND_SM_ACTIVE:.0f}%): the healthy case")
def gpu_bound(sig: Signals) -> Finding | None:
    sm, tensor, util = sig.get("gpu.sm_active"), sig.get("gpu.tensor_active"), sig.get("gpu.util_gpu")
    if sm is not None:
        level, conf = sm / GPU_BOUND_SM_ACTIVE, 0.9
        summary = f"GPU busy: SM active {sm:.0f}%" + (f", tensor cores {tensor:.0f}%" if tensor is not None else "")
    elif util is not None:
        level, conf = util / GPU_BOUND_UTIL_NO_GPM, 0.35
        summary = f"GPU busy by util.gpu {util:.0f}% (no GPM counters: SM activity unknown)"
    else:
        return None
    advice = "The GPU is the bottleneck — the healthy case. To go faster: "
    if tensor is not None and tensor < 20 and sm is not None:
        advice += "tensor cores are mostly idle, so try bf16 autocast (torch.autocast) or TF32 matmuls; "
    advice += "fuse kernels with torch.compile; raise the batch size if memory allows; or add GPUs."
    return gpu_bound.spec.finding(
        level=level, lost_share=0.0, confidence=conf,
        evidence={"sm_active_pct": _r(sm), "tensor_active_pct": _r(tensor), "util_gpu_pct": _r(util)},
        advice=advice, summary=summary, missing=_missing(sig, "gpm"))


@verdict(title="GPU memory-bandwidth bound", severity=SEVERITY_INFO, order=110, names_cause=False,
         meaning="a busy GPU limited by DRAM bandwidth (>= {MEMORY_BOUND_DRAM:.0f}%), not arithmetic (informational)")
def memory_bound(sig: Signals) -> Finding | None:
    dram, sm, tensor = sig.get("gpu.dram_bw"), sig.get("gpu.sm_active"), sig.get("gpu.tensor_active")
    conf = 0.85
    if dram is None or sm is None:
        # Without GPM: util.mem (time the memory was read or written) and util.gpu stand in;
        # a bf16 GEMM reads util.mem ~24%, a bandwidth-bound kernel 100% on the H200.
        dram, sm, conf = sig.get("gpu.util_mem"), sig.get("gpu.util_gpu"), 0.5
        if dram is None or sm is None:
            return None
        level = _gate(dram / MEMORY_BOUND_UTIL_MEM_NO_GPM, sm >= GPU_BOUND_UTIL_NO_GPM)
    else:
        level = _gate(dram / MEMORY_BOUND_DRAM, sm >= MEMORY_BOUND_MIN_SM)
    return memory_bound.spec.finding(
        level=level, lost_share=0.0, confidence=conf,
        evidence={"dram_bw_pct": _r(dram), "sm_active_pct": _r(sm), "tensor_active_pct": _r(tensor)},
        advice="Kernels wait on DRAM, not arithmetic: fuse elementwise ops (torch.compile), keep "
               "activations in bf16/fp16, avoid extra copies (.contiguous(), cat) and increase "
               "arithmetic intensity (larger matmuls, fewer passes over the data).",
        summary=f"DRAM bandwidth {dram:.0f}% with SMs {sm:.0f}% active: memory-bound kernels")


@verdict(title="Clocks throttled (thermal / hardware slowdown)", severity=SEVERITY_WARNING, order=130,
         names_cause=False, alt_titles={"power_cap": "Clocks capped by power"},
         meaning="clocks slowed by thermal/hardware limits (warning) or the power cap (info)")
def clock_throttled(sig: Signals) -> Finding | None:
    thermal, power, ratio = sig.get("gpu.thermal_share"), sig.get("gpu.power_cap_share"), sig.get("gpu.clock_ratio")
    if thermal is None or power is None:
        return None
    sm = sig.get("gpu.sm_active")
    busy = (sm / 100.0) if sm is not None else 1.0
    slowed = ratio is not None and ratio < CLOCK_RATIO_MAX
    lt = thermal / CLOCK_THERMAL_SHARE
    lp = _gate(power / CLOCK_POWER_SHARE, slowed)
    level = max(lt, lp)
    evidence = {"thermal_or_hw_slowdown_share": _r(thermal, 2), "power_cap_share": _r(power, 2),
                "sm_clock_of_max_pct": _pct(ratio), "power_w": _r(sig.get("gpu.power_w"))}
    if lt >= 1.0:
        lost = busy * (1.0 - ratio) if ratio is not None else 0.1
        return clock_throttled.spec.finding(
            level=level, lost_share=lost, confidence=0.9, evidence=evidence,
            advice="The GPU slows itself to protect the hardware: check cooling and airflow, the "
                   "GPU's temperature history and the node's power supply with your admins.",
            summary=f"thermal/hardware slowdown in {thermal * 100:.0f}% of samples; SM clock at "
                    f"{_pct(ratio) or '?'}% of max")
    # The software power cap is the GPU working at its power limit: the hardware ceiling of a
    # busy GPU, not a fixable loss, so it costs no "lost share" and stays informational.
    return clock_throttled.spec.finding(
        title=clock_throttled.spec.alt_titles["power_cap"], severity=SEVERITY_INFO,
        level=level, lost_share=0.0, confidence=0.9, evidence=evidence,
        advice="The GPU runs at its power limit and lowers clocks to stay under it — expected for "
               "long dense matmuls. Nothing to fix unless the limit was set below default "
               "(nvidia-smi -q -d POWER, ask an admin).",
        summary=f"power cap in {power * 100:.0f}% of samples; SM clock at {_pct(ratio) or '?'}% of max")


@verdict(title="Input-bound: waiting for the DataLoader", severity=SEVERITY_WARNING, order=10,
         meaning="the training loop waits for the DataLoader (>= {INPUT_BOUND_SHARE:.0%} of step time) "
                 "while the GPU is not busy")
def input_bound(sig: Signals) -> Finding | None:
    probe, share = sig.get("probe.data_wait_share"), _share(sig)
    if share is None:
        return None
    sm = sig.get("gpu.sm_active")
    level = share / INPUT_BOUND_SHARE
    # the GPU stays fed despite the waits: then they are not the bottleneck
    level = _gate(level, sm is None or sm < GPU_BUSY_SM_ACTIVE)
    cfg = loader_config(sig)
    workers, busy = sig.get("proc.workers.count"), sig.get("proc.workers.busy")
    nw = cfg.get("num_workers")
    state = worker_state(sig)
    advice = [input_advice(sig, state, nw, _free_cores(sig))]
    if cfg.get("pin_memory") is False and "nvml" in sig.have:
        advice.append("set pin_memory=True")
    if cfg.get("persistent_workers") is False and nw:
        advice.append("set persistent_workers=True so workers survive between epochs")
    missing = _missing(sig, "probe") if probe is None else ()
    evidence = {"data_wait_share_pct": _pct(share), "from": "probe" if probe is not None else "stacks",
                "sm_active_pct": _r(sm), "workers": workers, "workers_busy": busy,
                "worker_cpu_pct_mean": _r(sig.get("proc.workers.cpu_pct_mean")),
                "worker_cpu_wait_pct_mean": _r(sig.get("proc.workers.cpu_wait_pct_mean")),
                "worker_io_wait_pct": _pct(sig.get("proc.workers.io_share")), "workers_state": state,
                "num_workers": nw, "pin_memory": cfg.get("pin_memory")}
    return input_bound.spec.finding(
        level=level, lost_share=share, confidence=_confidence(0.9 if probe is not None else 0.75, missing),
        evidence=evidence, advice="; ".join(advice) + ".",
        summary=f"{share * 100:.0f}% of step time waiting for data" +
                (f"; {int(busy)}/{int(workers)} workers at 100% CPU" if workers else ""),
        missing=missing)


@verdict(title="Host-to-device copies dominate", severity=SEVERITY_WARNING, order=20,
         meaning="host-to-device copies (>= {H2D_PCIE_RX_MIBS:.0f} MiB/s) run while the SMs are mostly idle: pin memory")
def h2d_copy_bound(sig: Signals) -> Finding | None:
    rx, sm = sig.get("gpu.pcie_rx_mibs"), sig.get("gpu.sm_active")
    conf = 0.8
    if sm is None:  # no GPM: PCIe comes from the slow NVML call; util.gpu stands in for SM activity
        sm, conf = sig.get("gpu.util_gpu"), 0.55
    if rx is None or sm is None:
        return None
    level = _gate(rx / H2D_PCIE_RX_MIBS, sm < H2D_MAX_SM)
    cfg = loader_config(sig)
    counted, per_step = _copies(sig)
    pageable = rx < PAGEABLE_PCIE_MIBS
    seen = counted.get("h2d_pageable_pct") is not None and (counted.get("h2d_mb_per_step") or 0.0) >= 1.0
    if seen:
        # the probe saw the host side of this thread's copies: no guess from the rate (a copy of
        # another Python thread, a prefetcher's, is not seen: a step with under 1 MB counted says
        # nothing about the rest)
        pageable = counted["h2d_pageable_pct"] >= 50.0
    advice = []
    if pageable or cfg.get("pin_memory") is False:
        why = "the probe saw them come from pageable host memory" if seen else "typical of pageable memory"
        advice.append(f"copies run at {rx / 1024:.1f} GiB/s, {why}: pin the host "
                      "buffers (DataLoader(pin_memory=True) or tensor.pin_memory()) and copy with "
                      ".to(device, non_blocking=True)")
    advice.append("keep data on the GPU across steps, send smaller dtypes (uint8 images, normalise on the GPU)")
    lost = max(0.0, 1.0 - sm / 100.0)
    host = _copy_host_share(sig, rx)
    if host is not None:
        # the copies held the thread that long a step and no longer: the rest of the GPU's idle
        # time is other host work's (recsys_cpu_embedding with its tables on the GPU: idle 38%,
        # copies 1.4 of 5.5 ms a step; staging the batches on the GPU gained +17%, and the idle
        # after it was the sparse backward's)
        lost = min(lost, host)
    return h2d_copy_bound.spec.finding(
        level=level, lost_share=lost, confidence=conf,
        evidence={"pcie_rx_mib_s": _r(rx, 0), "sm_active_pct": _r(sm), "pageable_suspected": pageable,
                  "main_cuda_wait_pct": _pct(sig.get("py.main.cuda")), "pin_memory": cfg.get("pin_memory"),
                  **counted},
        advice="; ".join(advice) + ".",
        summary=f"PCIe host->device {rx / 1024:.1f} GiB/s while SMs are {sm:.0f}% active"
                + (f"; {per_step}" if per_step else " (pageable memory?)" if pageable else ""))


@verdict(title="Sync stalls: the CPU waits for the GPU, then the GPU for the CPU", severity=SEVERITY_WARNING,
         order=30, meaning="the main thread waits on the GPU (.item(), .cpu(), synchronize) "
                           ">= {SYNC_STALL_SHARE:.0%} of the time")
def sync_stall(sig: Signals) -> Finding | None:
    cuda, syncs = sig.get("py.main.cuda"), sig.get("probe.syncs_per_step")
    if cuda is None and syncs is None:
        return None
    sm = sig.get("gpu.sm_active")
    levels = []
    if cuda is not None:
        levels.append(cuda / SYNC_STALL_SHARE)
    if syncs is not None and cuda is None:
        levels.append(syncs / SYNC_STALL_SYNCS_PER_STEP)
    level = max(levels)
    # waiting on a busy GPU is what a GPU-bound job does; and syncs while the loop mostly
    # waits for data (the copy of each batch syncs) are not what holds it back
    data = max(sig.get("probe.data_wait_share") or 0.0, sig.get("py.main.data") or 0.0)
    level = _gate(level, (sm is None or sm < GPU_BUSY_SM_ACTIVE) and data < INPUT_BOUND_SHARE)
    line = sig.facts.get("sync_top")
    where = ""
    if isinstance(line, (list, tuple)) and line:
        where = f" Hottest sync: {line[0]}."
    elif isinstance(line, str):
        where = f" Hottest sync: {line}."
    # what the syncs cost: the GPU's idle while the thread waits on it or relaunches after it
    # (the host code that follows a sync), not the idle of the sleeps, data or file waits that
    # follow a sync, nor of the host code after those (their own verdicts). A metrics POST after
    # .item() (H100) was given all the idle: +40%, over loop_blocked's +32%, when the POST in a
    # thread gained 38%.
    lost = _idle_share(sig)
    if sig.get("budget.sync") is not None or sig.get("budget.cpu") is not None:
        host = _relaunch_idle(sig)
        lost = host if lost is None else min(lost, host)
    if lost is None:
        lost = cuda or 0.0
    tx = sig.get("gpu.pcie_tx_mibs")
    counted, per_step = _copies(sig)
    transfer = tx is not None and tx >= D2H_PCIE_TX_MIBS
    if transfer:
        # the waits are device-to-host copies (a blocking .cpu() / .to("cpu") of large tensors):
        # a transfer to make smaller or overlap, not a scalar read to remove
        advice = (f"The waits are device-to-host copies (PCIe device->host {tx / 1024:.1f} GiB/s"
                  + (f"; {per_step}" if per_step else "") + "): copy less "
                  "(only what the host needs, in a smaller dtype), into pinned buffers with "
                  "non_blocking=True on a side stream, and read them a step later." + where)
    else:
        advice = ("Remove host reads of GPU values from the hot loop (.item(), .cpu(), .tolist(), "
                  "print(tensor), if tensor:); accumulate metrics on the GPU and read them every N steps; "
                  "use non_blocking copies." + where)
    return sync_stall.spec.finding(
        level=level, lost_share=lost, confidence=_confidence(0.85, _missing(sig, "stacks", "probe")),
        evidence={"main_cuda_wait_pct": _pct(cuda), "syncs_per_step": _r(syncs), "sm_active_pct": _r(sm),
                  "hottest_sync": line if isinstance(line, str) else (line[0] if line else None),
                  "pcie_tx_mib_s": _r(tx, 0), "transfer": transfer, **counted},
        advice=advice,
        summary=f"main thread waits on the GPU {_pct(cuda) or '?'}% of the time"
                + (f", {syncs:.1f} syncs per step" if syncs is not None else "")
                + (f"; device->host copies {tx / 1024:.1f} GiB/s" if transfer else ""),
        missing=_missing(sig, "stacks", "probe"))


def _relaunch_idle(sig: Signals) -> float:
    """The GPU's idle share while the main thread waited on the GPU or relaunched after a sync
    (the budget's sync share and its ``cpu_after_sync``: host code with no wait of another kind
    since the last sync or its window's start); the sync and cpu shares where the budget has no
    such share (an older one)."""
    budget = sig.facts.get("budget") if isinstance(sig.facts.get("budget"), dict) else {}
    after = budget.get("cpu_after_sync")
    if type(after) not in (int, float):
        return _host_side_idle(sig)
    return (sig.get("budget.sync") or 0.0) + after


def _host_side_idle(sig: Signals) -> float:
    """The GPU's idle share while the main thread waited on the GPU or ran host code: the
    budget's sync + cpu shares (each a share of GPU-idle wall time); without a budget, the GPU's
    idle share."""
    sync, cpu = sig.get("budget.sync"), sig.get("budget.cpu")
    if sync is None and cpu is None:
        return _idle_share(sig) or 0.0
    return (sync or 0.0) + (cpu or 0.0)


def _copies(sig: Signals) -> tuple[dict, str]:
    """The probe's count of one step's copies between host and GPU (gputop/probe/flops.py) as
    evidence fields and a clause ("per step: device->host 512 MB, all pageable, 41 ms"); empty
    where the probe counted none."""
    c = sig.facts.get("copies")
    if not isinstance(c, dict):
        return {}, ""
    ev = {}
    for way, _words in COPY_WAYS:
        row = c.get(way) or {}
        n, pageable, ms = row.get("bytes"), row.get("pageable_bytes"), row.get("ms")
        if not isinstance(n, (int, float)):
            continue
        ev[f"{way}_mb_per_step"] = _r(n / 1e6, 1)
        ev[f"{way}_pageable_pct"] = _pct(pageable / n) if n > 0 and isinstance(pageable, (int, float)) else None
        ev[f"{way}_ms_per_step"] = _r(ms, 1) if isinstance(ms, (int, float)) else None
    text = copies_text(c)
    return ev, (f"per step: {text}" if text else "")


def _copy_host_share(sig: Signals, rx: float) -> float | None:
    """The share of a step the training thread spent issuing its host->device copies (the probe's
    count: host time, pageable ones included, which wait for their staging), or their bytes'
    time at ``PCIE_FASTEST_BPS`` where that is longer, where those copies carry at least
    ``COPIES_EXPLAIN_PCIE`` of the PCIe traffic; else None."""
    row = (sig.facts.get("copies") or {}).get("h2d") if isinstance(sig.facts.get("copies"), dict) else None
    step_ms = sig.get("probe.step_ms")
    if not isinstance(row, dict) or not step_ms or step_ms <= 0 or not rx or rx <= 0:
        return None
    n, ms = row.get("bytes"), row.get("ms")
    if type(n) not in (int, float) or type(ms) not in (int, float) or n < 1e6 or ms < 0:
        return None
    carried = n * (1000.0 / step_ms) / (rx * 1024 * 1024)
    # (a pinned non_blocking copy returns at once while its DMA holds the stream: its cost is at
    # least its bytes at the fastest PCIe rate there is)
    dma_ms = n / PCIE_FASTEST_BPS * 1000.0
    return min(1.0, max(ms, dma_ms) / step_ms) if carried >= COPIES_EXPLAIN_PCIE else None


def _offloaded(sig: Signals) -> tuple[float, int] | None:
    """(share of the optimizer's parameter elements on the CPU, their count) while the job uses
    CUDA (the probe's config), else None."""
    cfg = sig.facts.get("probe_config")
    if not isinstance(cfg, dict) or cfg.get("cuda_initialized") is not True:
        return None
    opt = cfg.get("optimizer")
    devices = opt.get("param_devices") if isinstance(opt, dict) else None
    if not isinstance(devices, dict):
        return None
    counts = {k: v for k, v in devices.items() if isinstance(k, str) and type(v) is int and v >= 0}
    total = sum(counts.values())
    return (counts.get("cpu", 0) / total, counts.get("cpu", 0)) if total else None


@verdict(title="Optimizer offloaded: the step waits on host copies and a CPU optimizer", severity=SEVERITY_WARNING,
         order=25, meaning=">= {OFFLOAD_CPU_PARAMS:.0%} of the optimizer's parameters on the CPU; the GPU idles "
                           ">= {OFFLOAD_SHARE:.0%} in copies and CPU code")
def optimizer_offload(sig: Signals) -> Finding | None:
    off = _offloaded(sig)
    if off is None:
        return None
    share, n = off
    # the offload's cost: the GPU's idle time while the main thread waited on the GPU (the
    # gradients' device-to-host copies, blocking) or ran CPU code (the optimizer step, the copies
    # back): the budget's sync and cpu shares, each already a share of GPU-idle wall time; and,
    # the fix removing the copies too, the time the GPU only copied (util.gpu counts the copy
    # engines busy) and the off-CPU time no blocking call names (page faults and pageable copies
    # inside the offload's own lines; a sleep or a lock is loop_blocked's)
    sync, cpu = sig.get("budget.sync"), sig.get("budget.cpu")
    copying = sig.get("gpu.copy_only")
    lost = _host_side_idle(sig)
    if sync is not None or cpu is not None:   # (without a budget the idle share holds the copies already)
        budget = sig.facts.get("budget") if isinstance(sig.facts.get("budget"), dict) else {}
        named = budget.get("blocked_in_calls")
        unnamed = max(0.0, (sig.get("budget.blocked") or 0.0) - (named if isinstance(named, (int, float)) else 0.0))
        lost += (copying or 0.0) + unnamed
    lost = max(0.0, min(1.0, lost))
    level = _gate(lost / OFFLOAD_SHARE, share >= OFFLOAD_CPU_PARAMS)
    tx, rx = sig.get("gpu.pcie_tx_mibs"), sig.get("gpu.pcie_rx_mibs")
    opt = (sig.facts.get("probe_config") or {}).get("optimizer") or {}
    copies = "; ".join(f"PCIe {d} {v / 1024:.1f} GiB/s" for d, v in (("device->host", tx), ("host->device", rx))
                       if v is not None and v >= 1.0)
    counted, per_step = _copies(sig)
    if per_step:
        copies = per_step + (f"; {copies}" if copies else "")
    from gputop.verdicts.budget_rules import _win   # (the budget rules' wording of the window; loaded after this module)
    budget = sig.facts.get("budget") if isinstance(sig.facts.get("budget"), dict) else {}
    return optimizer_offload.spec.finding(
        level=level, lost_share=lost, confidence=_confidence(0.8, _missing(sig, "stacks", "budget")),
        evidence={"optimizer": opt.get("class"), "cpu_param_share_pct": _pct(share), "cpu_params": n,
                  "sync_share_pct": _pct(sync), "cpu_share_pct": _pct(cpu), "copy_only_pct": _pct(copying),
                  "pcie_tx_mib_s": _r(tx, 0),
                  "pcie_rx_mib_s": _r(rx, 0), **counted},
        advice=("The optimizer steps on the CPU: each step copies the gradients to the host and the parameters "
                "back, and the GPU waits meanwhile. If the model's state fits on the GPU, keep the optimizer there "
                "with a fused GPU optimizer (torch.optim.AdamW(..., fused=True)); else make the offload overlap: "
                "pinned host buffers, non_blocking copies on a side stream, and a multi-threaded CPU optimizer "
                "(DeepSpeed's CPUAdam) while the next forward runs."),
        summary=(f"{opt.get('class') or 'the optimizer'} holds {share * 100:.0f}% of its parameters on the CPU; the GPU "
                 f"computes nothing {lost * 100:.0f}% of the last {_win(budget)} while the loop copies, waits on copies "
                 "or runs CPU code"
                 + (f" ({copies})" if copies else "")),
        missing=_missing(sig, "stacks", "budget"))


@verdict(title="Allocator thrash: CUDA memory is freed and allocated again, step after step", severity=SEVERITY_WARNING,
         order=27, meaning=">= {ALLOC_RETRIES_PER_STEP} cudaMalloc retries or >= {ALLOC_FREES_PER_STEP:g} "
                           "cudaFree+cudaMalloc a step; GPU lost >= {ALLOC_THRASH_SHARE:.0%}")
def allocator_thrash(sig: Signals) -> Finding | None:
    rate, per_step = sig.get("probe.alloc_retries_per_s"), sig.get("probe.alloc_retries_per_step")
    if rate is None:
        return None
    # The allocator keeps no clock. Its flushes and refills cost the GPU two ways: the GPU idles
    # while the loop waits on it (the flush's synchronize) or runs host code slowed by a cudaMalloc
    # under each allocating op (the budget's cpu + sync shares), and util.gpu counts the driver's
    # cudaFree/cudaMalloc work on the GPU as busy while no engine runs a kernel (gpu.driver_only,
    # with GPM). On an H100 (means over steady training), nanoGPT with empty_cache() every step:
    # util.gpu 88%, GR active 69%, host-side 2%, +35% by its fix; a ResNet-50: util.gpu 65%, GR
    # active 51%, host-side 26%, +80%.
    # The sum is an upper bound: the loop's own host time is in the host-side share too
    sync, cpu = sig.get("budget.sync"), sig.get("budget.cpu")
    host = _host_side_idle(sig)
    # (without a budget the host side is the GPU's idle share by SM activity, 1 - SM active, which holds
    # the driver's time already: then it is not added again)
    driver = sig.get("gpu.driver_only") if sync is not None or cpu is not None else None
    lost = min(1.0, host + (driver or 0.0))
    retrying = rate >= ALLOC_RETRIES_PER_S and (per_step is None or per_step >= ALLOC_RETRIES_PER_STEP)
    # The same churn without a retry: segments given back and made again every step. A steady job makes
    # none once its cache is built; torch.cuda.empty_cache() in the loop gives the whole cache back each
    # time (a device sync, a cudaFree per segment), and the next step cudaMallocs it again
    mallocs, frees = sig.get("probe.cuda_mallocs_per_step"), sig.get("probe.cuda_frees_per_step")
    rebuilt = cache_rebuilt(sig)
    level = _gate(lost / ALLOC_THRASH_SHARE, retrying or rebuilt)
    alloc = sig.facts.get("allocator") or {}
    used = sig.get("gpu.mem_used_frac")
    idle = f"; the GPU idles {host * 100:.0f}% of the time in host code and syncs"
    if driver:
        idle += (f", and its engines another {driver * 100:.0f}% while util.gpu counts it busy "
                 f"(util.gpu {sig.get('gpu.util_gpu'):.0f}%, GR active {sig.get('gpu.gr_active'):.0f}%: the driver "
                 "freeing and mapping memory)")
    site = sig.facts.get("empty_cache_site") or {}
    if retrying or not rebuilt:   # (retries this often free the cache too: then they are the churn's cause)
        advice = ("The CUDA caching allocator runs out of cached blocks that fit, frees its whole cache (a device "
                  "sync) and allocates again, step after step. Let its blocks grow in place "
                  "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), keep shapes fixed (pad or bucket sequence "
                  "lengths), or lower the micro-batch (with gradient accumulation) to leave memory headroom.")
        summary = (f"{rate:.1f} cudaMalloc retries a second" + (f" ({per_step:.2f} a step)" if per_step is not None else "")
                   + (f", GPU memory {used * 100:.0f}% used" if used is not None else "") + idle)
    else:
        at = (f" at {site['where']}" + (f", called from {site['via']}" if site.get("via") else "")) if site else ""
        call = (f"torch.cuda.empty_cache(){at}, every step" if site
                else "torch.cuda.empty_cache() in the loop?")
        advice = ("The allocator's cache is given back and built again every step with no retry behind it: "
                  f"torch.cuda.empty_cache(){at if site else ' called in the loop'} does that (a device sync and a "
                  "cudaFree per cached segment, then a cudaMalloc for each again in the next step). Remove it from "
                  "the step (a Trainer: torch_empty_cache_steps=None); it frees no memory the job will not take back "
                  "at once. For fragmentation out-of-memory errors use "
                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead.")
        summary = (f"{frees:.0f} cudaFree and {mallocs:.0f} cudaMalloc calls a step: the CUDA cache is rebuilt every "
                   f"step with no retry behind it ({call})" + idle)
    return allocator_thrash.spec.finding(
        level=level, lost_share=lost, confidence=_confidence(0.75, _missing(sig, "stacks", "budget")),
        evidence={"alloc_retries_per_s": _r(rate), "alloc_retries_per_step": _r(per_step),
                  "cuda_mallocs_per_step": _r(mallocs), "cuda_frees_per_step": _r(frees),
                  "gpu_mem_used_pct": _pct(used), "reserved_gib": _r((alloc.get("reserved") or 0) / 2**30) or None,
                  "allocated_gib": _r((alloc.get("allocated") or 0) / 2**30) or None,
                  "sync_share_pct": _pct(sync), "cpu_share_pct": _pct(cpu), "driver_only_pct": _pct(driver),
                  "empty_cache_at": site.get("where")},
        advice=advice, summary=summary, missing=_missing(sig, "stacks", "budget"))


@verdict(title="Launch-bound: Python and kernel-launch overhead", severity=SEVERITY_WARNING, order=60,
         meaning="kernels run but are too small to fill the GPU; the CPU launching them is saturated")
def launch_bound(sig: Signals) -> Finding | None:
    sm, util = sig.get("gpu.sm_active"), sig.get("gpu.util_gpu")
    conf = 0.8
    if sm is None and util is not None:
        # Without GPM the kernels' size is unknown: a GPU busy less than half the time while the
        # CPU side is saturated and waits on nothing still says the CPU side is the limit.
        sm, conf = util, 0.45
    running = sig.get("py.main.running")
    cpu = sig.get("proc.main.cpu_pct")
    # The launching CPU: the main thread, or the process as a whole up to one core — the
    # backward pass launches its kernels from autograd's own device thread while the main
    # thread waits for it, so the process saturating a core is the better sign.
    busy = max(x for x in (running, None if cpu is None else min(1.0, cpu / 100.0), -1.0) if x is not None)
    if sm is None or util is None or busy < 0 or sig.pending:
        return None  # (waits not known yet: a sync or data stall would look the same)
    blockers = max(sig.get("py.main.data") or 0.0, sig.get("py.main.cuda") or 0.0, sig.get("py.main.gil") or 0.0,
                   sig.get("probe.data_wait_share") or 0.0,
                   1.0 if (sig.get("probe.syncs_per_step") or 0.0) >= SYNC_STALL_SYNCS_PER_STEP else 0.0)
    rx = sig.get("gpu.pcie_rx_mibs") or 0.0
    ok = sm < LAUNCH_MAX_SM and util >= LAUNCH_MIN_UTIL and blockers < 0.15 and rx < H2D_PCIE_RX_MIBS
    level = _gate(busy / LAUNCH_MAIN_BUSY, ok)
    gpu_share = sig.get("probe.gpu_share")
    return launch_bound.spec.finding(
        level=level, lost_share=max(0.0, 1.0 - sm / 100.0),
        confidence=_confidence(conf, _missing(sig, "stacks", "probe", "gpm")),
        evidence={"sm_active_pct": _r(sm), "util_gpu_pct": _r(util), "main_busy_pct": _pct(busy),
                  "gpu_time_share_pct": _pct(gpu_share), "step_ms": _r(sig.get("probe.step_ms")),
                  "kernel_ms_per_step": _r(sig.get("probe.kernel_ms_per_step"), 3),
                  "kernel_busy_pct": _pct(sig.get("probe.kernel_busy"))},
        advice="Kernels are too small to fill the GPU and the CPU cannot launch them fast enough: "
               "capture the step with CUDA graphs or torch.compile(mode='reduce-overhead'), fuse "
               "small ops, use foreach/fused optimizers, avoid Python loops over tensors, raise the batch size.",
        summary=f"util.gpu {util:.0f}% but SMs only {sm:.1f}% active; main thread {busy * 100:.0f}% busy on the CPU"
                + (f"; the kernels run {kb * 100:.0f}% of the step ({sig.get('probe.kernel_ms_per_step'):.2f} ms, traced)"
                   if (kb := sig.get("probe.kernel_busy")) is not None else ""),
        missing=_missing(sig, "stacks", "probe"))


@verdict(title="GIL contention: the training thread waits for other Python threads", severity=SEVERITY_WARNING,
         order=40, meaning="the main thread waits for the GIL >= {GIL_CONTENTION_SHARE:.0%} of the time: "
                           "other Python threads hold it")
def gil_contention(sig: Signals) -> Finding | None:
    gil = sig.get("py.main.gil")
    if gil is None:
        return None
    threads = sig.facts.get("busy_threads") or []
    names = ", ".join(f"{n} ({r}%)" for n, r in threads)
    return gil_contention.spec.finding(
        level=gil / GIL_CONTENTION_SHARE, lost_share=gil, confidence=0.8,
        evidence={"main_gil_wait_pct": _pct(gil), "busy_threads": names or None},
        advice="Other Python threads hold the GIL" + (f" ({names})" if names else "") +
               ": move their work to a process (multiprocessing, DataLoader workers), do it less often, "
               "or use code that releases the GIL (numpy/torch ops, I/O).",
        summary=f"main thread waits for the GIL {gil * 100:.0f}% of the time" + (f"; busy: {names}" if names else ""))


@verdict(title="Communication-bound: collectives dominate", severity=SEVERITY_WARNING, order=50,
         meaning="the main thread is in torch.distributed collectives >= {COMM_BOUND_SHARE:.0%} of the time")
def communication_bound(sig: Signals) -> Finding | None:
    stacks = sig.get("py.main.collective")
    probe = sig.get("probe.collective_wait_share")   # DDP/FSDP waits too, also inside backward()
    comm = collective_wait(sig)
    if comm is None:
        return None
    evidence = {"main_collective_pct": _pct(stacks), "nvlink_tx_mib_s": _r(sig.get("gpu.nvlink_tx_mibs"), 0)}
    summary = f"main thread in torch.distributed collectives {comm * 100:.0f}% of the time"
    if probe is not None:
        evidence.update(probe_collective_wait_pct=_pct(probe),
                        probe_collective_pct=_pct(sig.get("probe.collective_share")),
                        collective_top_op=sig.facts.get("collective_top_op"))
        if stacks is None or probe > stacks:
            summary = (f"the step waits for collectives {probe * 100:.0f}% of its time (probe"
                       + (f"; mostly {sig.facts['collective_top_op']}" if sig.facts.get("collective_top_op") else "")
                       + ")")
    return communication_bound.spec.finding(
        level=comm / COMM_BOUND_SHARE, lost_share=comm, confidence=0.75,
        evidence=evidence,
        advice="Overlap communication with compute (DDP bucket_cap_mb, gradient accumulation with "
               "no_sync()), communicate less often or in lower precision, and check for a straggler rank "
               "that the others wait for.",
        summary=summary)


def collective_wait(sig: Signals) -> float | None:
    """The share of time a rank waits in collectives: what its stacks show (explicit
    torch.distributed calls), or what its probe timed (DDP's all-reduce inside backward(), FSDP),
    whichever is larger; None when neither is known."""
    got = [v for v in (sig.get("py.main.collective"), sig.get("probe.collective_wait_share")) if v is not None]
    return max(got) if got else None


@verdict(title="Host memory pressure: swapping or reclaim stalls", severity=SEVERITY_WARNING, order=70,
         meaning="the host swaps or stalls on memory reclaim (PSI), or is nearly out of memory")
def host_memory_pressure(sig: Signals) -> Finding | None:
    swap, psi, avail = sig.get("host.swap_bps"), sig.get("host.psi_mem_some_pct"), sig.get("host.mem_available_frac")
    cg, majflt = sig.get("host.cgroup_mem_frac"), sig.get("proc.main.majflt_ps")
    if swap is None and psi is None and avail is None and cg is None:
        return None
    levels = [0.0]
    if swap is not None:
        levels.append(swap / SWAP_BPS)
    if psi is not None:
        levels.append(psi / PSI_MEM_SOME_PCT)
    if avail is not None:
        levels.append(MEM_AVAILABLE_FRAC / max(avail, 1e-3))
    if majflt is not None and ((cg is not None and cg >= CGROUP_MEM_FULL_FRAC)
                               or (psi is not None and psi >= PSI_MEM_WITH_FAULTS_PCT)):
        # Thrashing: the job's pages are evicted as fast as it reads them (at its cgroup's limit,
        # or while the kernel reports memory stalls), so every re-read is a major fault that
        # blocks the thread; no swap is needed for this to hurt. Faults without memory stalls
        # are first reads of mapped files, not pressure.
        levels.append(majflt / MAJFLT_PS)
    level = max(levels)
    blocked = sig.get("py.main.idle")
    lost = max((psi or 0.0) / 100.0, blocked or 0.0) if level >= 1 else 0.0
    if level >= 1 and psi is None and blocked is None:
        lost = 0.1
    spec = host_memory_pressure.spec
    return spec.finding(
        severity=SEVERITY_CRITICAL if (avail is not None and avail < 0.02) else spec.severity,
        level=level, lost_share=lost, confidence=_confidence(0.85, _missing(sig, "psi")),
        evidence={"swap_mib_s": _r(swap / (1 << 20) if swap is not None else None, 2), "psi_mem_some_pct": _r(psi),
                  "mem_available_pct": _pct(avail), "cgroup_mem_used_pct": _pct(cg),
                  "main_major_faults_per_s": _r(sig.get("proc.main.majflt_ps"), 0)},
        advice="The job needs more memory than it has: reduce DataLoader workers or prefetch_factor "
               "(each worker holds its own copy of the dataset object), avoid loading the whole dataset "
               "in RAM (memory-map it), or raise the container's memory limit.",
        summary="memory stalls " + (f"{psi:.0f}% of the time" if psi is not None else "")
                + (f", swap {swap / (1 << 20):.1f} MiB/s" if swap else "")
                + (f", {avail * 100:.0f}% memory available" if avail is not None else ""),
        missing=_missing(sig, "psi"))


@verdict(title="CPU quota throttling (cgroup)", severity=SEVERITY_WARNING, order=80,
         meaning="the container's CPU quota throttles the job (>= {CGROUP_THROTTLED_PCT:.0f}% of CFS periods)")
def cpu_throttled(sig: Signals) -> Finding | None:
    thr = sig.get("host.cgroup_throttled_pct")
    if thr is None:
        return None
    limit = sig.get("host.cgroup_cpu_limit")
    return cpu_throttled.spec.finding(
        level=thr / CGROUP_THROTTLED_PCT, lost_share=min(1.0, thr / 100.0), confidence=0.85,
        evidence={"throttled_periods_pct": _r(thr), "cpu_limit_cores": _r(limit)},
        advice="The container's CPU quota stops the job every scheduling period: raise the CPU limit"
               + (f" (now {limit:g} cores)" if limit else "") + " or use fewer DataLoader workers/threads "
               "(torch.set_num_threads, OMP_NUM_THREADS).",
        summary=f"throttled in {thr:.0f}% of CPU periods" + (f" (limit {limit:g} cores)" if limit else ""))


@verdict(title="CPU oversubscribed: the training thread waits for a core", severity=SEVERITY_WARNING, order=90,
         meaning="the main thread is ready to run but waits for a free core >= {CPU_WAIT_SHARE:.0%} of the time")
def cpu_oversubscribed(sig: Signals) -> Finding | None:
    wait = sig.get("py.main.cpu_wait")
    if wait is None:
        return None
    workers, cores = sig.get("proc.workers.count"), sig.get("host.cpu_count")
    data, state = _share(sig), worker_state(sig)
    advice = "More threads want to run than there are cores: "
    waits_for_data = bool(workers) and data is not None and data >= INPUT_BOUND_SHARE
    if waits_for_data:
        # input_bound holds too (or would, were the GPU not busy): the loop is short of data,
        # so fewer workers would starve it more; the cores must come from elsewhere
        advice += (f"the loop also waits for data ({data * 100:.0f}% of step time), so keep the DataLoader "
                   "workers and free cores for them and the loop: ")
    advice += "limit torch's CPU threads (torch.set_num_threads, OMP_NUM_THREADS), move other work off this machine"
    if not waits_for_data and workers and state == WORKERS_CPU_STARVED:
        # the workers queue for the same cores: fewer of them would not make their work smaller
        advice += (f", or give the job more cores; the DataLoader workers wait for a core too "
                   f"({sig.get('proc.workers.cpu_wait_pct_mean'):.0f}% of the time), so fewer of them would "
                   "only slow the data feed")
    elif not waits_for_data and workers and data is not None and data < INPUT_BOUND_SHARE / 2:
        advice += (", or use fewer DataLoader workers"
                   + (f" (now {int(workers)} on {int(cores)} cores)" if cores else "")
                   + f": the loop waits for data only {data * 100:.0f}% of step time")
    else:
        advice += ", or give the job more cores"
    return cpu_oversubscribed.spec.finding(
        level=wait / CPU_WAIT_SHARE, lost_share=wait, confidence=0.8,
        evidence={"main_cpu_wait_pct": _pct(wait), "host_cpu_pct": _r(sig.get("host.cpu_pct")),
                  "cores": cores, "dataloader_workers": workers, "data_wait_share_pct": _pct(data),
                  "workers_state": state,
                  "worker_cpu_wait_pct_mean": _r(sig.get("proc.workers.cpu_wait_pct_mean"))},
        advice=advice + ".",
        summary=f"the main thread is ready to run but waits for a CPU {wait * 100:.0f}% of the time")


def _who(o: dict) -> str:
    if not o.get("user") and o.get("pid") is not None and "not visible" in str(o.get("name") or ""):
        return f"PID {o['pid']}: {o['name']}"
    parts = [str(x) for x in (o.get("user"), o.get("name")) if x]
    return f"PID {o.get('pid')}" + (f" ({', '.join(parts)})" if parts else "")


@verdict(title="GPU shared with another process", severity=SEVERITY_WARNING, order=8,
         meaning="other processes' kernels run on the target's GPU >= {GPU_SHARED_OTHERS_SM:.0f}% of the time "
                 "(NVML's per-process utilization)")
def gpu_shared(sig: Signals) -> Finding | None:
    others, mine = sig.get("gpu.others_sm_pct"), sig.get("gpu.target_sm_pct")
    if others is None or mine is None:
        return None
    total = others + mine
    # Kernels of different processes take turns on a GPU (time-slicing, without MPS): the share of
    # the wall time the GPU ran the others' kernels is time the target could have had, where the
    # GPU was full; on a GPU with time to spare they cost it less (the switches, not the time)
    loss = (others / 100.0) * min(1.0, total / GPU_SHARED_FULL)
    # ... and only the time the loop was not waiting for something else: a loop that waits for
    # its data would not go faster with the GPU to itself
    data = max(sig.get("probe.data_wait_share") or 0.0, sig.get("py.main.data") or 0.0)
    loss = min(loss, max(0.0, 1.0 - data))
    who = [o for o in sig.facts.get("gpu_others") or () if isinstance(o, dict)]
    named = ", ".join(f"{_who(o)}" + (f" {o['sm_pct']:.0f}%" if type(o.get("sm_pct")) in (int, float) else "")
                      for o in who[:3])
    advice = ("Another job runs kernels on this GPU and the two take turns: move one of them to a GPU of its "
              "own (CUDA_VISIBLE_DEVICES, or the scheduler's GPU request), or ask the cluster's admins for "
              "exclusive GPUs (the EXCLUSIVE_PROCESS compute mode is theirs to set: gputop never changes GPU "
              "settings); MPS or MIG share a GPU on purpose, with each job's part known.")
    return gpu_shared.spec.finding(
        level=others / GPU_SHARED_OTHERS_SM, lost_share=loss, confidence=0.8,
        evidence={"others_sm_pct": _r(others), "target_sm_pct": _r(mine), "others": named or None,
                  "other_processes": len(who)},
        advice=advice,
        summary=(f"other processes ran kernels on this GPU {others:.0f}% of the time, the job's own {mine:.0f}%"
                 + (f": {named}" if named else "")))


@verdict(title="GPU memory nearly full", severity=SEVERITY_WARNING, order=140, names_cause=False,
         meaning="GPU memory >= {GPU_MEM_USED_FRAC:.0%} used: allocator retries and fragmentation ahead")
def gpu_memory_pressure(sig: Signals) -> Finding | None:
    used = sig.get("gpu.mem_used_frac")
    if used is None:
        return None
    # what the allocator did at this edge, where the probe counted it: its retries (each a flush of
    # the cache) and the out-of-memory errors the loop caught. A count, not a cost: on an H100 a job
    # at 98% of memory made 12 retries and caught 5 OOMs in 20 s with its GPU 99.5% busy, and
    # expandable_segments gained +2.5% (docs/verdicts.md); what they cost, where the GPU idles for
    # them, is allocator_thrash's. Zeros are kept in the evidence, so its mean over the verdict's
    # windows (the report's) covers the windows without a retry too.
    retries, ooms = sig.get("probe.alloc_retries_per_s"), sig.get("probe.ooms_in_window")
    evidence = {"gpu_mem_used_pct": _pct(used)}
    summary = f"GPU memory {used * 100:.0f}% used"
    if retries is not None:
        evidence["alloc_retries_per_s"] = _r(retries)
        if retries > 0:
            summary += f"; {retries:.1f} cudaMalloc retries a second"
    if ooms is not None:
        evidence["ooms_in_window"] = int(ooms)
        thrown = sig.get("probe.oom_share_of_tries")
        if thrown is not None:
            evidence["oom_steps_pct"] = _pct(thrown)
        if ooms > 0:
            summary += (f"; {int(ooms)} out-of-memory error{'s' if int(ooms) != 1 else ''} caught in the "
                        f"last {sig.window_s:.0f} s")
            if thrown is not None:
                summary += f" ({thrown * 100:.0f}% of the steps tried, their work thrown away)"
    return gpu_memory_pressure.spec.finding(
        level=used / GPU_MEM_USED_FRAC, lost_share=0.0, confidence=0.8, evidence=evidence,
        advice="Close to out-of-memory: allocator retries and fragmentation slow steps. Use activation "
               "checkpointing, bf16, a smaller micro-batch with gradient accumulation, or "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        summary=summary)


@verdict(title="GPU idle: the job is not using the GPU", severity=SEVERITY_WARNING, order=100, names_cause=False,
         meaning="the GPU has nothing to do and no wait (data, sync, GIL) explains why")
def gpu_idle(sig: Signals) -> Finding | None:
    sm, util = sig.get("gpu.sm_active"), sig.get("gpu.util_gpu")
    if (sm is None and util is None) or sig.pending:
        return None  # (the waits that would explain the idleness are not known yet)
    if sm is not None:
        level = GPU_IDLE_SM_ACTIVE / max(sm, 0.5)
    else:
        level = GPU_IDLE_UTIL / max(util, 0.5)
    # kernels are running (tiny ones: launch-bound), so the GPU is not idle
    level = _gate(level, util is None or util < LAUNCH_MIN_UTIL)
    explained = max(sig.get("py.main.data") or 0.0, sig.get("probe.data_wait_share") or 0.0,
                    sig.get("py.main.cuda") or 0.0, sig.get("py.main.gil") or 0.0,
                    sig.get("py.main.collective") or 0.0)
    level = _gate(level, explained < EXPLAINED_IDLE_SHARE)  # else another verdict names the reason
    level = min(level, 10.0)
    running = sig.get("py.main.running")
    cpu = sig.get("proc.main.cpu_pct")
    doing = ("the main thread is busy on the CPU" if (running or (cpu or 0) / 100.0) >= 0.5
             else "the main thread is mostly idle (sleeping, I/O, locks)")
    return gpu_idle.spec.finding(
        level=level, lost_share=_idle_share(sig) if sm is not None else 1.0 - (util or 0) / 100.0,
        confidence=_confidence(0.8, _missing(sig, "gpm", "stacks")),
        evidence={"sm_active_pct": _r(sm, 2), "util_gpu_pct": _r(util), "main_running_pct": _pct(running),
                  "main_cpu_pct": _r(cpu)},
        advice="The GPU has nothing to do and the process is not waiting for data or the GPU: "
               f"{doing}. Check that the model and tensors are on the GPU (.to('cuda')), and what the "
               "main thread does in the hot frames view.",
        summary=f"SMs {sm:.1f}% active" if sm is not None else f"util.gpu {util:.0f}%",
        missing=_missing(sig, "gpm", "stacks"))


@verdict(title="Straggler: rank {rank} holds the others back", severity=SEVERITY_WARNING, order=0,
         across_ranks=True,
         meaning="a multi-GPU job: one rank is late and the others wait for it in collectives")
def straggler_rank(ranks: list, findings: dict) -> Finding | None:
    """One rank is late and the others wait for it in collectives. ``ranks``: [(rank dict,
    Signals)] of the running ranks; ``findings``: each rank's own findings by PID, for the cause.
    The rank that waits least in collectives while the others wait a lot is the one they wait
    for; its own strongest verdict (data, GIL, sync, compute...) is the likely cause."""
    waits = [(collective_wait(sig), r, sig) for r, sig in ranks]
    waits = [(w, r, sig) for w, r, sig in waits if w is not None]
    if len(waits) < 2:
        return None
    waits.sort(key=lambda x: x[0])
    low, r, sig = waits[0]
    others = [w for w, _, _ in waits[1:]]
    high = max(others)
    mean_others = sum(others) / len(others)
    gap = mean_others - low
    level = _gate(gap / STRAGGLER_GAP, high >= STRAGGLER_OTHERS_WAIT)
    own = [f for vid, f in findings.get(r["pid"], {}).items()
           if vid not in ("communication_bound", "gpu_bound", "clock_throttled", "gpu_memory_pressure") and f.level >= 1.0]
    cause = max(own, key=lambda f: f.lost_share) if own else None
    if cause is not None:
        why = f"its own verdict: {cause.id} ({cause.summary})"
        advice = f"Fix rank {r['rank']} first — {cause.advice}"
    else:
        busy = sig.get("gpu.sm_active")
        why = ("it computes more than the others" + (f" (SMs {busy:.0f}% active)" if busy is not None else "")
               + ": uneven work or a slower GPU/host")
        advice = (f"Look at rank {r['rank']}'s GPU and host (clocks, other jobs on the node, its data shard); "
                  "balance the work between ranks.")
    evidence = {"straggler": r["rank"], "straggler_pid": r["pid"], "straggler_collective_pct": _pct(low),
                "others_collective_pct": _pct(mean_others),
                "per_rank_collective_pct": {str(rr["rank"]): _pct(w) for w, rr, _ in waits},
                "likely_cause": cause.id if cause else "compute"}
    probed = {str(rr["rank"]): _pct(sg.get("probe.collective_wait_share")) for _w, rr, sg in waits
              if sg.get("probe.collective_wait_share") is not None}
    if probed:   # (only then: recordings without the probe's collective timing keep their evidence)
        evidence["per_rank_probe_collective_wait_pct"] = probed
    spec = straggler_rank.spec
    return spec.finding(
        title=spec.title.format(rank=r["rank"]), level=level, lost_share=mean_others,
        confidence=_confidence(0.85, ()), evidence=evidence, advice=advice,
        summary=f"rank {r['rank']} waits {low * 100:.0f}% in collectives, the others {mean_others * 100:.0f}%: "
                f"they wait for it; {why}")


# Every rule of one window's signals, in order of specificity (registry.py: each verdict's
# ``order``): on equal lost share (or losses under the engine's MIN_PRIMARY_LOSS), the earlier
# rule explains more. The zero-loss verdicts come last: memory_bound (a specific kind of busy
# GPU) before gpu_bound, and the power cap or a nearly full GPU never outrank a busy GPU.
from gputop.verdicts import budget_rules  # noqa: E402,F401  (its rules register themselves)
from gputop.verdicts import compile_rules  # noqa: E402,F401  (likewise)
from gputop.verdicts import amp_rules  # noqa: E402,F401  (likewise)
from gputop.verdicts import stall_rules  # noqa: E402,F401  (the stalled verdict)

RULES: list[Callable[[Signals], Finding | None]] = [s.rule for s in specs() if not s.across_ranks]
VERDICT_IDS = tuple(s.id for s in specs())  # most specific first
