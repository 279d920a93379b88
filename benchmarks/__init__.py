"""gputop's benchmarks: one registry, one entry point.

    python -m benchmarks --list            # every benchmark: where it runs, its goal
    python -m benchmarks NAME [ARGS ...]   # runs benchmarks/<script> with ARGS

Each benchmark is declared once, in ``BENCHMARKS``: its name, its script (relative to this
folder), what it measures, where it runs and its goal. ``where`` is ``local`` (the 2-core
development and CI box: no GPU needed), ``h200`` (the GPU test machine; most are phases of
``bash benchmarks/h200.sh``) or ``both`` (no GPU needed, and also measured on the H200). A goal
is the one docs/benchmarks.md measures the benchmark against, with its issue; ``none: ...``
where the benchmark only measures (or is a tool).

The scripts stay where they are and keep working on their own (``python benchmarks/NAME.py
ARGS``): ``python -m benchmarks`` runs the very same file with ``runpy.run_path``, with
``sys.argv`` and ``sys.path[0]`` set as Python sets them for a script. Tests import some of them
by path (``sys.path.insert(0, "benchmarks")``). Modules that are not benchmarks (``HELPERS``)
are not listed. The jobs of benchmarks/corpus/ are workloads, not benchmarks:
``corpus_run`` runs them (benchmarks/corpus/manifest.py lists them).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
WHERE = ("local", "h200", "both")


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str  # relative to benchmarks/
    measures: str
    where: str  # one of WHERE
    goal: str

    @property
    def path(self) -> pathlib.Path:
        return HERE / self.script


# Modules of benchmarks/ that benchmarks import; never run on their own.
HELPERS = ("agent_common.py", "corpus/common.py", "corpus/manifest.py")

BENCHMARKS: tuple[Benchmark, ...] = (
    # --- the spine (issue 2) and what watching costs (issues 2, 3, 14)
    Benchmark("nvml_check", "nvml_check.py",
              "the NVML source on a real GPU: what it publishes, its CPU, the time of each NVML call",
              "h200", "none: a measurement"),
    Benchmark("host_cost", "host_cost.py",
              "the host source's CPU, per-tick time and dominant calls on a ~10-process, ~60-thread tree",
              "both", "about 1% of one core for ~10 processes and ~60 threads (#2)"),
    Benchmark("monitor_cost", "monitor_cost.py",
              "each monitor's CPU (gputop headless, the UI, nvitop) and the target's slowdown, windows"
              " alternated; the recording's MB/min",
              "h200", "NVML + host at defaults <= 3% of a core (#2); with stacks <= 10% and a GPU-bound"
              " slowdown <= 1% (#3); the UI <= 3%, headless <= 2% (#14)"),
    Benchmark("monitor_steady", "monitor_steady.py",
              "every monitor (nvitop, gputop headless and UI) started at once, measured together in"
              " steady state after a long settle",
              "h200", "the UI at defaults <= 3% of a core, headless <= 2% (#14)"),
    Benchmark("cpu_profile", "cpu_profile.py",
              "where gputop headless's own CPU goes, by thread and by component",
              "both", "none: a measurement (the parts of headless's <= 2% of a core, #14)"),
    Benchmark("ui_cost", "ui_cost.py",
              "the UI's CPU beyond headless, attached to a busy Python process in a 120x40 pty",
              "local", "the UI <= 2% of a core on a busy Python process (#14)"),
    Benchmark("ui_tick", "ui_tick.py",
              "the UI's tick rate and tick time with 8 GPUs of replayed data",
              "local", ">= 4 Hz with 8 GPUs of data, the replay not falling behind (#2)"),
    # --- recordings and memory (issues 2, 14)
    Benchmark("recording_scale", "recording_scale.py",
              "recording MB/min; open, seek and report times of a real recording tiled to an hour",
              "local", "<= 1 MB per minute; open a one-hour recording < 1 s; its report < 1 s (#2)"),
    Benchmark("long_recording", "long_recording.py",
              "a long recording built through the recorder: its CPU and memory, the report, replay open,"
              " seeks and playback",
              "local", "report of a one-hour recording < 1 s, seek < 1 s, <= 1 MB/min, memory flat over"
              " 24 h of simulated time (< 50 MB) (#14)"),
    Benchmark("replay_cost", "replay_cost.py",
              "the derivation processors' CPU per recorded second, replaying real recordings offline",
              "local", "none: a measurement"),
    Benchmark("memory_soak", "memory_soak.py",
              "gputop headless's RSS (and py-spy's) over a long session, every source at defaults",
              "local", "< 50 MB growth over one hour (#2, #14)"),
    Benchmark("exporter_cost", "exporter_cost.py",
              "the Prometheus exporter's CPU per scrape (replayed recordings) and per core at 5 s / 1 s"
              " scrapes (live)",
              "local", "a scrape every 5 s adds <= 1% of one core (#6)"),
    # --- Python stacks (issue 3)
    Benchmark("gil_accuracy", "gil_accuracy.py",
              "gputop's GIL wait, data wait and CUDA sync wait against the workload's own ground truth",
              "both", "within +-10 points (#3); +-5 points at the calm rates (#14)"),
    Benchmark("stacks_overhead", "stacks_overhead.py",
              "the target's slowdown with the stack source attached (alternated or twin targets), its"
              " CPU and recording size",
              "both", "slowdown <= 1% GPU-bound, <= 3% on launch-heavy loops; gputop + py-spy <= 10% of"
              " a core (#3)"),
    Benchmark("pool_slowdown", "pool_slowdown.py",
              "pools the slowdown estimates of several stacks_overhead runs into one number (95% interval)"
              " per loop",
              "local", "none: a tool (decides the <= 3% launch-heavy goal of #3 over pooled runs)"),
    # --- the in-process probe (issues 4, 13)
    Benchmark("probe_overhead", "probe_overhead.py",
              "the probe's cost to ~5 ms training steps: off, installed (idle) and monitored, alternated",
              "h200", "<= 0.5% of step time (#4)"),
    Benchmark("probe_accuracy", "probe_accuracy.py",
              "the probe's steps, step time, batches/s, data wait, GPU time and syncs against the job's"
              " own measurements",
              "h200", "step time and batches/s within 2% of the job's own (#4)"),
    Benchmark("probe_device", "probe_device.py",
              "the probe on a real GPU: the job's device, no stray CUDA context, the job's warnings"
              " untouched",
              "h200", "the job's device reported, no CUDA context on another GPU, no sync raised or"
              " recorded in the job's warnings (#4)"),
    Benchmark("probe_flood", "probe_flood.py",
              "a flooding client of the probe socket: the job's steps/s with and without it, 10 idle"
              " clients attached",
              "local", "none: a measurement (the flooded / unflooded steps/s ratio, #13; tests/test_probe_bounds.py"
              " holds it >= 0.7)"),
    # --- verdicts (issues 5, 11, 29)
    Benchmark("scenario_proof", "scenario_proof.py",
              "replays scenario recordings and scores the primary verdict against the scenario's known"
              " cause",
              "local", "right primary within 10 s, held >= 80%, first verdict <= 5 s, no false alarm on"
              " gpu_bound (#5)"),
    Benchmark("real_proof", "real_proof.py",
              "replays recordings of real training loops (h200.sh phase real) and scores them against"
              " issue 11's proof",
              "local", "expected primary within 5 s of the first training step and held >= 90%, budget"
              " 100% +-2 points, a periodic stall within 20%, steps/s within 2% under gputop run (#11)"),
    Benchmark("corpus_run", "corpus_run.py",
              "the corpus jobs (benchmarks/corpus/) as they are and fixed under gputop run --headless,"
              " recorded; each fix's gain from the job's own rate lines",
              "h200", "none: a measurement (the recordings corpus_score scores)"),
    Benchmark("subprocess_cost", "subprocess_cost.py",
              "what subprocess.run(nvidia-smi) in a training loop costs: the call, the steps after it"
              " against an equal sleep, the page faults (issue 29's nvidia_smi_in_loop job)",
              "h200", "none: a measurement"),
    Benchmark("corpus_score", "corpus_score.py",
              "scores corpus_run's recordings with today's rules: primary verdict and predicted gain"
              " against each job's known cause and measured gain",
              "local", "right primary as is; no cause with a predicted gain > 10% once fixed; predicted"
              " gain within +-30% relative or +-5 points of the measured; the same primary attached"
              " late (#29)"),
    Benchmark("corpus_split", "corpus_split.py",
              "the probe's per-step split (GPU time, data wait less the GPU time it overlaps) against the"
              " time budget's gpu_busy and data shares, on every corpus recording made with the probe",
              "local", "agree within 5 points on every corpus job (#29)"),
    Benchmark("kernel_busy", "kernel_busy.py",
              "a corpus job's kernels' time per step from CUDA-only torch.profiler traces (CUPTI) against"
              " its unprofiled step time, and its step time before and after the traces",
              "h200", "none: a measurement (whether a kernel timeline could set launch_bound's gain, and"
              " what tracing costs the job; #29)"),
    # --- ranks, FLOPs, stalls, DDP (issues 6, 15, 17)
    Benchmark("ranks_h200", "ranks_h200.py",
              "gputop attached to a torchrun launcher: every rank found, its GPU, SM active, steps/s",
              "h200", "every rank found from the launcher, with its GPU (#6)"),
    Benchmark("mfu_h200", "mfu_h200.py",
              "FLOPs/step and MFU against the analytic count, energy per step against power x time"
              " (a GPT and a ResNet-50)",
              "h200", "FLOPs/step within 5% of analytic, MFU beside GPM tensor activity; energy per step"
              " against power x time (#15)"),
    Benchmark("stall_h200", "stall_h200.py",
              "a GPU loop that stops stepping (sleep, lock, a collective): time to `stalled`, the lines"
              " named, the GPU's state",
              "h200", "a stopped loop named `stalled` with the right lines, the target never paused (#15)"),
    Benchmark("ddp_nccl", "ddp_nccl.py",
              "DDP and FSDP on real ranks: straggler and communication-bound named from the timed"
              " collectives; the DDP hook's cost",
              "h200", "the straggler and communication-bound jobs named; the DDP hook costs nothing"
              " measurable (#17)"),
    # --- the node agent (issue 16)
    Benchmark("agent_cost", "agent_cost.py",
              "the node agent's CPU per watched job at its default rates, by thread",
              "both", "<= ~1% of a core per job (#16)"),
    Benchmark("agent_h200", "agent_h200.py",
              "the node agent finds two jobs started after it, exports both, forgets the first; its CPU"
              " per job",
              "h200", "both jobs found and served, the first forgotten once it ends; ~1% of a core per"
              " job (#16)"),
    Benchmark("agent_soak", "agent_soak.py",
              "the node agent under job churn: RSS, descriptors, sockets, py-spy children",
              "local", "memory flat, no leaked py-spy child, descriptor or socket (#16)"),
    Benchmark("agent_stall", "agent_stall.py",
              "how soon the node agent at its defaults names a stopped job `stalled`",
              "local", "never `stalled` while the job trains; the time to `stalled` is a measurement (#16)"),
)

BY_NAME: dict[str, Benchmark] = {b.name: b for b in BENCHMARKS}


def get(name: str) -> Benchmark | None:
    return BY_NAME.get(name)
