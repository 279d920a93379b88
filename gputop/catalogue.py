"""The catalogue: every sample kind, and what one field of a sample means.

One home for these facts, so the sources, the exporter, the UI's help and docs/metrics.md
cannot drift apart. It imports nothing (not even the rest of gputop), so a module that only
needs a kind's name or a field's unit never pulls in pynvml, psutil or textual.

The fields themselves are declared next to their source, in modules that import without heavy
dependencies (``gputop.sources.METRIC_MODULES``: e.g. ``gputop/sources/nvml_fields.py``);
``gputop.sources.metric_specs()`` gathers them all. tests/test_catalogue.py checks that every
field is in docs/metrics.md with the same unit.
"""

from __future__ import annotations

from dataclasses import dataclass

# Sample kinds. Each is produced by one module (docs/architecture.md, "Sample kinds").
KIND_GPU = "gpu"                # NVML fast counters for one GPU, key = GPU index
KIND_GPU_INFO = "gpu_info"      # static facts + unsupported fields (with reasons), key = index
KIND_GPU_PROCS = "gpu_procs"    # GPU memory of each target-tree process on one GPU
KIND_SYSTEM = "system"          # host-wide CPU / memory / swap / cgroup, key = "host"
KIND_PROC = "proc"              # one process of the target tree, key = PID
KIND_PROC_INFO = "proc_info"    # once per newly seen process: name, cmdline, role, key = PID
KIND_THREAD = "thread"          # one thread of the target's main process, key = "PID:TID"
KIND_TARGET = "target"          # the target's identity and life: started / exited
KIND_HEALTH = "health"          # one source's health, key = source name
KIND_EVENT = "event"            # something happened (a note for the timeline), key = source
KIND_RANK = "rank"              # a rank process of a distributed job, key = PID (sources/ranks.py)
KIND_STACKS = "stacks"                # one py-spy window, one process: key = PID (sources/stacks.py)
KIND_THREAD_KERNEL = "thread_kernel"  # one second of kernel wait states, one process: key = PID
KIND_THREAD_STATE = "thread_state"    # share of time per state, key = "PID:TID" (derive/threads.py)
KIND_PROBE_STEP = "probe_step"        # one probe window of step timings, key = PID (probe_client.py)
KIND_PROBE_CONFIG = "probe_config"    # the job's torch settings, on change, key = PID
KIND_PROBE_MEMORY = "probe_memory"    # the CUDA caching allocator, ~1 Hz, key = PID
KIND_PROBE_SYNC = "probe_sync"        # implicit syncs by source line, on change, key = PID
KIND_VERDICT = "verdict"                  # one verdict id's state, key = id (verdicts/engine.py)
KIND_VERDICT_PRIMARY = "verdict_primary"  # the verdict that explains most now, key = "primary"
KIND_VERDICT_CHANGE = "verdict_change"    # a verdict turned on or off, key = id
KIND_EFFICIENCY = "efficiency"            # FLOP/s, MFU and energy per rank, key = "job" (derive/efficiency.py)
KIND_BUDGET = "budget"                    # the time budget, key = "window" / "session" (derive/budget_processor.py)
KIND_PHASE = "phase"                      # the job's phase (start-up, training, ...), key = "main" (derive/phases.py)
KIND_STALL = "stall"                      # is the loop stalled, since when, key = "job" (derive/stall.py)
KIND_STALL_SNAPSHOT = "stall_snapshot"    # every rank's threads at a stall, key = "job" (sources/stall_snapshot.py)

# The stack source's name (its health samples' key) and the kernel wait classes a
# thread_kernel sample counts per thread (sources/stacks.py writes them, derive/ reads them).
SOURCE_STACKS = "stacks"
SOURCE_PROBE = "probe"     # the probe client's (sources/probe_client.py)
WAIT_CLASSES = ("run", "gil", "lock", "sleep", "poll", "io", "other")

# Unit of a field -> factor to Prometheus base units (ratios 0-1, bytes, seconds, hertz).
# A unit not listed is exported as it is.
UNIT_SCALE: dict[str, float] = {
    "%": 0.01,                 # percent -> ratio (and "100 = one core" -> seconds per second)
    "ms": 0.001,
    "ms/s": 0.001,
    "MHz": 1e6,
    "MiB/s": 1024.0 * 1024.0,
}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """What one number means: shown in the help screen, the report, docs/metrics.md and, when
    ``prom`` is set, served by the Prometheus exporter as ``gputop_<prom>``."""

    kind: str
    field: str
    unit: str          # "%", "B", "B/s", "MiB/s", "W", "MHz", "C", "/s", "" ...
    label: str         # short column/row label
    help: str          # one line, for the help screen
    aggregate: bool = True  # include in report statistics (mean/p50/p95/max)
    prom: str = ""       # Prometheus metric name without "gputop_"; "" = not one family per field
    prom_help: str = ""  # the family's help text (Prometheus wording: ratios 0-1, base units)
    dcgm: str = ""       # the DCGM field for the same quantity, or how it differs
    counter: bool = False  # a real counter: served as "<prom>_total"

    @property
    def scale(self) -> float:
        """Sample value x scale = the value in Prometheus base units."""
        return UNIT_SCALE.get(self.unit, 1.0)


def dcgm_same(name: str, fid: int, note: str = "") -> str:
    """The ``dcgm`` text of a field that measures what a DCGM field does."""
    return f"same quantity as {name} (field {fid}){note}"
