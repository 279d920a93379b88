"""What the NVML source publishes: its fields, their meaning, and the clock-event reasons.

Kept apart from gputop/sources/nvml.py so that the exporter, the UI and the docs test can read
them without importing pynvml. docs/metrics.md ("GPU (NVML)") has the NVML call and the caveats
of every field.
"""

from __future__ import annotations

from gputop.catalogue import KIND_GPU, KIND_GPU_PROCS, MetricSpec, dcgm_same

ENERGY_EVERY_S = 5.0   # how often the NVML slow loop reads the total energy counter (nvml_gpu.py)
# How often the slow loop reads the target's per-process SM % (nvmlDeviceGetProcessUtilization:
# ~2 ms of CPU a call on the H200, 0.2% of a core at 1 Hz; benchmarks/results/h200-run1.tar.gz
# nvml_check.json). The driver keeps the samples, and each read asks for those since the newest
# one seen, so a read every 5 s averages the same samples that five reads would; the gpu_procs
# samples in between repeat the last value (the UI and /metrics show the latest).
PROC_SM_EVERY_S = 5.0
# How often the fast loop takes a GPM snapshot (gpm.py; the cheap counters stay at the loop's
# ~10 Hz). nvmlGpmMetricsGet costs ~0.9-1.5 ms a call against ~2-9 us for each cheap call: at
# every >= 100 ms it was 1.7% of a core on the H200, most of the NVML source's cost. A GPM value
# is the mean over the whole time since the previous snapshot, so reading it less often loses no
# time coverage, only resolution of bursts shorter than this (the sparklines' cells are wider).
# Here (no pynvml import) so that the UI and the exporter can size how long a value holds.
GPM_EVERY_S = 0.5
# How long a GPM value stands for "now" in views that show the latest one (the UI's current
# values, the ranks table, the stall snapshot): the fast loop's gap is at most 4x its 0.1 s
# interval, so two snapshots are at most ~0.9 s apart on a machine that keeps up, and while the job
# is calm (sources/calm.py: GPM_EVERY_S and the interval x4) ~3.6 s; 4 s leaves room for that
# without showing a value from a different phase of the job.
GPM_HOLD_S = 4.0

MIB = 1024 * 1024

# GPM metrics: our field -> name of the pynvml constant (IDs from nvml.h; see docs/metrics.md).
GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),                   # 2
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),           # 3
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),       # 5
    ("dram_bw", "NVML_GPM_METRIC_DRAM_BW_UTIL"),                # 10
    ("gr_active", "NVML_GPM_METRIC_GRAPHICS_UTIL"),             # 1
    ("pcie_tx_mibs", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),        # 20
    ("pcie_rx_mibs", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),        # 21
    ("nvlink_tx_mibs", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"),  # 61
    ("nvlink_rx_mibs", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC"),  # 60
)
GPM_FIELDS = tuple(f for f, _ in GPM_METRICS)
PCIE_FIELDS = ("pcie_tx_mibs", "pcie_rx_mibs")
NVLINK_FIELDS = ("nvlink_tx_mibs", "nvlink_rx_mibs")
GPM_PERCENT_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw", "gr_active")
# Fields of a gpu sample read less often than the fast loop ticks: GPM's (every GPM_EVERY_S) and
# PCIe's (GPM's, or the slow loop's without GPM), None on the ticks between, and the energy
# counter (every ENERGY_EVERY_S). Views hold them longer (ui/snapshot.py). While the job is calm
# their schedules stretch by their own factors, not by the fast loop's: a GPM value is the mean over
# its gpm_window_s, the slow loop's PCIe reading (without GPM) stretches by CALM_HELD_FACTOR, the
# energy counter not at all; the report weighs a calm sample's value of these so
# (derive/record_stats.py: field_weights).
HELD_FIELDS = frozenset(GPM_FIELDS) | frozenset(PCIE_FIELDS) | {"gpm_window_s"}
OWN_CADENCE_FIELDS = frozenset({"energy_j"})

# Every field of a "gpu" sample, in order.
GPU_FIELDS = (
    "util_gpu", "util_mem", "mem_used", "mem_total", "mem_reserved", "power_w", "power_limit_w",
    "clock_sm_mhz", "clock_mem_mhz", "temp_c", "clock_events", "clock_events_mask",
    *GPM_FIELDS, "gpm_window_s", "energy_j",
)

# Clock-event ("throttle") reason bits: (pynvml constant, value in nvml.h, our name, words).
# The names are what "gpu" samples carry in clock_events; the words are what the UI shows.
# nvml.py takes each bit from pynvml where it has the constant.
# 0x200/0x400 exist only as nvmlClocksThrottleReason* in pynvml (not in nvml.h API 13).
CLOCK_EVENT_REASONS: tuple[tuple[str, int, str, str], ...] = (
    ("nvmlClocksEventReasonGpuIdle", 0x1, "gpu_idle", "idle (no work)"),
    ("nvmlClocksEventReasonApplicationsClocksSetting", 0x2, "applications_clocks_setting",
     "application clocks setting"),
    ("nvmlClocksEventReasonSwPowerCap", 0x4, "sw_power_cap", "power cap (software)"),
    ("nvmlClocksEventReasonHwSlowdown", 0x8, "hw_slowdown", "hardware slowdown (thermal or power brake)"),
    ("nvmlClocksEventReasonSyncBoost", 0x10, "sync_boost", "sync boost (held to a group's clocks)"),
    ("nvmlClocksEventReasonSwThermalSlowdown", 0x20, "sw_thermal", "thermal slowdown (software)"),
    ("nvmlClocksEventReasonHwThermalSlowdown", 0x40, "hw_thermal", "thermal slowdown (hardware)"),
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", 0x80, "hw_power_brake", "power brake (hardware)"),
    ("nvmlClocksEventReasonDisplayClockSetting", 0x100, "display_clocks", "display clock setting"),
    ("nvmlClocksThrottleReasonBoardLimit", 0x200, "board_limit", "board limit"),
    ("nvmlClocksThrottleReasonReliability", 0x400, "reliability", "reliability limit"),
)
CLOCK_EVENT_NAMES: tuple[str, ...] = tuple(name for _, _, name, _ in CLOCK_EVENT_REASONS)
CLOCK_EVENT_WORDS: dict[str, str] = {name: words for _, _, name, words in CLOCK_EVENT_REASONS}


def _spec(field: str, unit: str, label: str, help: str, prom: str = "", prom_help: str = "", dcgm: str = "",
          kind: str = KIND_GPU, aggregate: bool = True, counter: bool = False) -> MetricSpec:
    return MetricSpec(kind=kind, field=field, unit=unit, label=label, help=help, aggregate=aggregate,
                      prom=prom, prom_help=prom_help, dcgm=dcgm, counter=counter)


_PERCENT = ", which DCGM reports in percent"
_MIB = ", which DCGM reports in MiB"
_MHZ = ", which DCGM reports in MHz"
_PCIE_NO_GPM = "(GPM; without GPM a 20 ms NVML snapshot about once a second)."

METRICS: list[MetricSpec] = [
    _spec("util_gpu", "%", "GPU util", "time a kernel was running (any kernel, even 1 SM): not how busy the SMs are",
          "gpu_utilization_ratio",
          "Share of the driver's sample period during which any kernel ran (NVML utilization.gpu), 0-1; "
          "1 even with a single busy SM: use gputop_gpu_sm_active_ratio for how busy the SMs are.",
          dcgm_same("DCGM_FI_DEV_GPU_UTIL", 203, _PERCENT)),
    _spec("util_mem", "%", "mem util", "time device memory was being read or written (NVML)",
          "gpu_memory_utilization_ratio",
          "Share of time device memory was read or written (NVML utilization.memory), 0-1; not bandwidth.",
          dcgm_same("DCGM_FI_DEV_MEM_COPY_UTIL", 204, _PERCENT)),
    _spec("mem_used", "B", "mem used", "device memory in use (NVML memory info v2, excludes reserved)",
          "gpu_memory_used_bytes",
          "Device memory in use by all processes, in bytes (NVML memory info v2: driver-reserved memory excluded).",
          "compare with DCGM_FI_DEV_FB_USED (field 252), in MiB; DCGM versions differ in whether reserved "
          "memory counts as used (here it never does: gputop_gpu_memory_reserved_bytes)"),
    _spec("mem_total", "B", "mem total", "device memory size", "gpu_memory_total_bytes",
          "Device memory size, in bytes.", dcgm_same("DCGM_FI_DEV_FB_TOTAL", 250, _MIB), aggregate=False),
    _spec("mem_reserved", "B", "mem reserved", "memory the driver reserves for itself", "gpu_memory_reserved_bytes",
          "Device memory reserved by the driver and firmware, never usable by programs, in bytes.",
          dcgm_same("DCGM_FI_DEV_FB_RESERVED", 253, _MIB), aggregate=False),
    _spec("power_w", "W", "power", "board power draw (a 1 s average on Ampere and newer)", "gpu_power_watts",
          "Board power draw in watts (NVML power usage: a 1 s average on Ampere and newer).",
          dcgm_same("DCGM_FI_DEV_POWER_USAGE", 155)),
    _spec("power_limit_w", "W", "power limit", "enforced power limit; clocks drop when power reaches it",
          "gpu_power_limit_watts", "Enforced power limit in watts; clocks drop when the draw reaches it.",
          dcgm_same("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 164), aggregate=False),
    _spec("clock_sm_mhz", "MHz", "SM clock", "current SM clock", "gpu_sm_clock_hertz",
          "Current SM clock, in hertz.", dcgm_same("DCGM_FI_DEV_SM_CLOCK", 100, _MHZ)),
    _spec("clock_mem_mhz", "MHz", "mem clock", "current memory clock", "gpu_memory_clock_hertz",
          "Current memory clock, in hertz.", dcgm_same("DCGM_FI_DEV_MEM_CLOCK", 101, _MHZ)),
    _spec("temp_c", "C", "temp", "GPU temperature", "gpu_temperature_celsius",
          "GPU die temperature, in degrees Celsius.", dcgm_same("DCGM_FI_DEV_GPU_TEMP", 150)),
    # Served one reason at a time (gputop_gpu_clock_event{reason}), not as one family.
    _spec("clock_events", "", "clock events", "why clocks are below maximum now (power cap, thermal, idle...)",
          aggregate=False),
    _spec("clock_events_mask", "", "clock events mask", "raw NVML clock-event reason bits", "gpu_clock_events_mask",
          "Raw NVML clock-event (throttle) reason bits now; gputop_gpu_clock_event has them one by one.",
          dcgm_same("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 112, " (formerly DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)"),
          aggregate=False),
    _spec("sm_active", "%", "SM active",
          "GPM: share of SMs with work, over time (DCGM SM_ACTIVE); the honest busy number",
          "gpu_sm_active_ratio",
          "GPM: share of time warps were resident on the SMs, averaged over all SMs, 0-1; the honest 'how busy'.",
          dcgm_same("DCGM_FI_PROF_SM_ACTIVE", 1002)),
    _spec("sm_occupancy", "%", "SM occupancy", "GPM: resident warps vs the maximum; higher is not always better",
          "gpu_sm_occupancy_ratio", "GPM: resident warps relative to the maximum, 0-1; higher is not always better.",
          dcgm_same("DCGM_FI_PROF_SM_OCCUPANCY", 1003)),
    _spec("tensor_active", "%", "tensor active", "GPM: tensor-core pipe activity (any precision)",
          "gpu_tensor_active_ratio", "GPM: tensor-core pipe activity (any precision), 0-1.",
          dcgm_same("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004)),
    _spec("dram_bw", "%", "DRAM bw", "GPM: DRAM bandwidth used vs theoretical; ~87% is the practical max on H200",
          "gpu_dram_active_ratio",
          "GPM: DRAM bandwidth used relative to the theoretical peak, 0-1 (~0.87 is the practical maximum on H200).",
          dcgm_same("DCGM_FI_PROF_DRAM_ACTIVE", 1005)),
    _spec("gr_active", "%", "GR active", "GPM: time the graphics/compute engine was busy",
          "gpu_gr_engine_active_ratio", "GPM: share of time the graphics/compute engine was busy, 0-1.",
          dcgm_same("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001)),
    _spec("pcie_tx_mibs", "MiB/s", "PCIe TX",
          "GPU -> host over PCIe, headers included (GPM; ~1 Hz snapshot without GPM)",
          "gpu_pcie_tx_bytes_per_second",
          f"PCIe traffic GPU -> host in bytes per second, headers included {_PCIE_NO_GPM}",
          dcgm_same("DCGM_FI_PROF_PCIE_TX_BYTES", 1009, " where GPM is used")),
    _spec("pcie_rx_mibs", "MiB/s", "PCIe RX",
          "host -> GPU over PCIe, headers included (GPM; ~1 Hz snapshot without GPM)",
          "gpu_pcie_rx_bytes_per_second",
          f"PCIe traffic host -> GPU in bytes per second, headers included {_PCIE_NO_GPM}",
          dcgm_same("DCGM_FI_PROF_PCIE_RX_BYTES", 1010, " where GPM is used")),
    _spec("nvlink_tx_mibs", "MiB/s", "NVLink TX", "GPM: NVLink data sent, all links, payload only",
          "gpu_nvlink_tx_bytes_per_second", "GPM: NVLink data sent over all links in bytes per second, payload only.",
          dcgm_same("DCGM_FI_PROF_NVLINK_TX_BYTES", 1011)),
    _spec("nvlink_rx_mibs", "MiB/s", "NVLink RX", "GPM: NVLink data received, all links, payload only",
          "gpu_nvlink_rx_bytes_per_second",
          "GPM: NVLink data received over all links in bytes per second, payload only.",
          dcgm_same("DCGM_FI_PROF_NVLINK_RX_BYTES", 1012)),
    _spec("gpm_window_s", "s", "GPM window", "the time the GPM values of this sample average over (>= 0.1 s)",
          "gpu_gpm_window_seconds", "The time the GPM values above average over, in seconds (>= 0.1).",
          aggregate=False),
    # Read by the slow loop every ENERGY_EVERY_S (the call costs ~3 ms), so in one gpu sample of ~50.
    _spec("energy_j", "J", "energy", "energy the GPU used since the driver loaded (NVML total energy counter)",
          "gpu_energy_consumption_joules",
          "Energy the GPU used since the driver was loaded, in joules (nvmlDeviceGetTotalEnergyConsumption, "
          "read every 5 s).",
          dcgm_same("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, ", which DCGM reports in mJ"),
          aggregate=False, counter=True),
    # A dict per PID: served as gputop_process_gpu_memory_bytes / _sm_utilization_ratio.
    _spec("procs", "", "GPU processes",
          "per process of the target tree: GPU memory (B) and SM % (time-based, like util_gpu)",
          kind=KIND_GPU_PROCS, aggregate=False),
    _spec("other_count", "", "other procs", "compute processes on this GPU outside the target tree",
          "gpu_other_processes",
          "Compute processes on this GPU outside the target's tree (another job sharing it).",
          kind=KIND_GPU_PROCS, aggregate=False),
    _spec("other_mem", "B", "other procs mem", "GPU memory of processes outside the target tree",
          "gpu_other_processes_memory_bytes", "GPU memory of the processes outside the target's tree, in bytes.",
          kind=KIND_GPU_PROCS, aggregate=False),
]
