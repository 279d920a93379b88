"""The DataLoader workers' state and the advice that follows from it (rules.input_bound,
rules.cpu_oversubscribed). The loop waiting for data says nothing about *why* the workers are
late; their own processes do (signals.py): busy on a core (their work per sample is the limit),
runnable but without a core (they are short of CPU: more workers would queue for the same
cores, fewer would starve the loop more), or blocked reading (storage or network). Each has its
own advice; docs/verdicts.md explains the thresholds.
"""

from __future__ import annotations

from gputop.verdicts.signals import Signals

WORKER_CPU_WAIT_SHARE = 0.25      # workers runnable but without a core this share of the time: CPU-starved
WORKER_IO_SHARE = 0.25            # workers blocked in read/write-like calls this share of the time: I/O-bound
FREE_CORE = 1.0                   # idle cores (of the host's, by its CPU %) that make more workers worth it


def loader_config(sig: Signals) -> dict:
    """The settings of the DataLoader the loop iterates: the probe reports every loader it saw
    under ``loaders``; the one with the most iterators is the training loader. {} when none."""
    cfg = sig.facts.get("probe_config")
    loaders = cfg.get("loaders") if isinstance(cfg, dict) else None
    loaders = [ld for ld in loaders if isinstance(ld, dict)] if isinstance(loaders, list) else []
    if not loaders:
        return {}
    best = max(loaders, key=lambda ld: ld.get("iterators") if type(ld.get("iterators")) is int else 0)
    nw = best.get("num_workers")
    return {**best, "num_workers": nw if type(nw) is int and nw >= 0 else None}


# What the DataLoader workers do, from their own processes (signals.py): the advice follows it.
WORKERS_CPU_STARVED = "cpu_starved"   # runnable but waiting for a core: they need CPU time
WORKERS_CPU_BOUND = "cpu_bound"       # all busy on a core: their work per sample is the limit
WORKERS_IO_WAIT = "io_wait"           # blocked in read/write-like calls: storage or network
WORKERS_NOT_BUSY = "not_busy"         # none of these: a lock, a queue, a sleep, the network


def worker_state(sig: Signals) -> str | None:
    """The DataLoader workers' state over the window; None when no worker was watched."""
    workers = sig.get("proc.workers.count")
    if not workers or sig.get("proc.workers.cpu_pct_mean") is None:
        return None
    wait = sig.get("proc.workers.cpu_wait_pct_mean")
    if wait is not None and wait / 100.0 >= WORKER_CPU_WAIT_SHARE:
        return WORKERS_CPU_STARVED
    busy = sig.get("proc.workers.busy")
    if busy and busy >= workers:
        return WORKERS_CPU_BOUND
    io = sig.get("proc.workers.io_share")
    if io is not None and io >= WORKER_IO_SHARE:
        return WORKERS_IO_WAIT
    return WORKERS_NOT_BUSY


_GIVE_CORES = ("fewer other threads (torch.set_num_threads / OMP_NUM_THREADS in the main process, "
               "other jobs off this machine) or more cores")


def input_advice(sig: Signals, state: str | None, nw: int | None, free: float | None) -> str:
    """input_bound's first advice, from the workers' state (``free``: idle cores, None when
    unknown): never "storage" for workers short of CPU, never "more workers" without a free
    core, never "num_workers=4" to a loader that has workers."""
    workers, cores = sig.get("proc.workers.count"), sig.get("host.cpu_count")
    n = int(workers) if workers else nw
    if nw == 0 or (nw is None and not workers and "host" in sig.have):
        return "load data in worker processes: DataLoader(num_workers=4 or more)"
    if state == WORKERS_CPU_STARVED:
        wait = sig.get("proc.workers.cpu_wait_pct_mean") or 0.0
        return (f"the {n} DataLoader workers wait for a core {wait:.0f}% of the time: they are short of CPU, "
                f"not of storage; give them cores: {_GIVE_CORES}; fewer workers would starve the loop more")
    if state == WORKERS_CPU_BOUND:
        if free is not None and free < FREE_CORE:
            return (f"all {n} DataLoader workers are ~100% busy and no core is free: make __getitem__/transforms "
                    "cheaper (decode on GPU, cache preprocessed data) or get more cores; more workers would "
                    "only share the same cores")
        return (f"all {n} DataLoader workers are ~100% busy: raise num_workers"
                + (f" (the machine has {int(cores)} cores)" if cores else "")
                + " or make __getitem__/transforms cheaper (decode on GPU, cache preprocessed data)")
    if state == WORKERS_IO_WAIT:
        io = sig.get("proc.workers.io_share") or 0.0
        return (f"the {n} DataLoader workers are blocked reading {io * 100:.0f}% of the time: the storage or "
                "network feeding them is slow; prefetch more (prefetch_factor), cache the dataset locally, "
                "use a faster format (fewer, larger files), or add workers to overlap the reads")
    if state == WORKERS_NOT_BUSY:
        cpu = sig.get("proc.workers.cpu_pct_mean") or 0.0
        return (f"the {n} DataLoader workers are neither busy on the CPU ({cpu:.0f}% each) nor waiting for a "
                "core: they wait on something else (storage, network, a lock); see what they do in the "
                "threads view, prefetch more (prefetch_factor) or cache the dataset locally")
    who = f"the {n} DataLoader workers" if n else "the DataLoader workers"
    return (f"{who} cannot keep up, and their CPU use was not watched in this session: if they are "
            "busy on the CPU, make transforms cheaper or add workers while cores are free; if they wait "
            "for a core, free cores; if they read, cache the data or prefetch more")
