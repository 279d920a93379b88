"""The ``gputop`` command line: its parser, help texts and argument checks (gputop/cli.py wires
what they ask for). Kept apart because most of it is help text, written for people.
"""

from __future__ import annotations

import argparse
import os

import gputop
from gputop.sources.calm import CALM_FACTOR

EPILOG = """\
examples:
  gputop                              pick a process to watch (GPU and Python
                                      processes; without a terminal: the list)
  gputop --pid 1234                   watch a running training process
  gputop --pid 1234 --record r.gtrec  ... and record the session to r.gtrec
  gputop --pid 1234 --headless --duration 60
                                      no UI: sample 60 s, record, print a report
  gputop run -- python train.py       start a script with the probe, watch it
  gputop replay r.gtrec               replay a recording in the same UI
  gputop report r.gtrec [--json]      summarise a recording
  gputop diff a.gtrec b.gtrec         compare two recordings (is B faster?)
  gputop demo                         a bundled workload, watched live
  gputop demo --replay                the GPU panels without a GPU: a bundled
                                      recording of an H200, replayed
  gputop COMMAND --help               more on one command, with examples

keys in the UI: ? help, q quit, space pause (replay), left/right seek 10 s

--headless without --record records into
  {state}/recordings/
(the newest 20, at most 1 GiB in all, are kept).

exit status: 0 done, 1 failed at run time (no such process, unreadable
file, a recording stopped early by a full disk, ...), 2 bad command line
(one line says what), 130 interrupted by Ctrl-C (128+N for signal N);
gputop run --headless: the job's when it failed (see gputop run --help).

docs (every metric, verdict and the report's JSON): {docs}
"""

RUN_EPILOG = """\
COMMAND is the program to start, with its arguments, after `--`.

the job's output:
  --headless: the job's stdout and stderr pass through unchanged (with --json
  its stdout goes to stderr, so stdout holds the report alone); the report
  comes last, after the job's end.
  UI: they go to a log, named after the job's PID, whose path gputop prints
  when it ends:
    {state}/logs/run-PID-DATE.log
  (the last 10 logs are kept).

the job's life:
  The job runs in a process group (a session) of its own; "all it started"
  below is that group: torchrun's ranks, DataLoader workers, a script's
  children. To stop it yourself: kill -TERM -PID (the job's PID).
  --headless: when --duration ends, or a signal ends gputop early, gputop
  stops the job and all it started (SIGTERM, then SIGKILL after 5 s), says
  so, then prints the report; --keep-running leaves it running instead.
  Ctrl-C reaches gputop (which writes its report) and the job alike, as it
  would reach the job started without gputop (gputop passes it on); so does
  the hang-up of a closing SSH session.
  UI: when gputop ends (q, a signal) the job goes on, and gputop says so,
  with how to stop it; the job's stdin is /dev/null and a closing terminal
  does not reach it.
  kill -9 of gputop leaves the job running, unless --stop-with-gputop: then
  any end of gputop, even kill -9, stops the job and all it started.

examples:
  gputop run -- python train.py --lr 3e-4
  gputop run -- torchrun --nproc-per-node 8 train.py
  gputop run --headless --duration 120 --json -- python train.py > report.json
  gputop run --headless --duration 600 --keep-running -- python train.py
  gputop run --stop-with-gputop --record r.gtrec -- python train.py

exit status: with --headless, the job's when it failed: its exit code, or
128+N when signal N ended it (gputop's own SIGTERM/SIGKILL at the end of
--duration is no failure: 0); otherwise 0 done, 1 failed at run time (e.g.
COMMAND cannot start), 2 bad command line.
"""

DEMO_EPILOG = """\
The workload is gputop's own and always stops with gputop (which says it
stopped it). Its output passes through with --headless; with the UI it goes
to a log, named after the workload's PID:
  {state}/logs/demo-PID-DATE.log

--replay plays a recording of a real session on an H200, bundled with
gputop: the GPU panels on a machine without a GPU (no workload starts).

examples:
  gputop demo                             the default workload, in the UI
  gputop demo --list                      the scenarios and recordings
  gputop demo --scenario python --headless --duration 10
  gputop demo --replay                    replay the gpu_bound recording
  gputop demo --replay input_bound --headless   its report, no UI
"""

REPLAY_EPILOG = """\
examples:
  gputop replay r.gtrec
  gputop replay r.gtrec --speed 4 --paused
  gputop replay "$(ls -t {state}/recordings/*.gtrec | head -1)"
                                    the newest recording made by --headless

keys: space play/pause, left/right seek 10 s, [ ] seek 1 min, q quit
"""

REPORT_EPILOG = """\
examples:
  gputop report r.gtrec
  gputop report r.gtrec --json > report.json
  gputop report "$(ls -t {state}/recordings/*.gtrec | head -1)"
                                    the newest recording made by --headless

exit status: 0 done, 1 the file cannot be read, 2 bad command line.
"""

DIFF_EPILOG = """\
Compares B with A: steps/s and step time with a 95% interval (from the
spread of fixed windows), the time budgets, verdicts that appeared or
vanished, settings that changed, GPU counters and energy per step.

examples:
  gputop diff before.gtrec after.gtrec
  gputop diff before.gtrec after.gtrec --json > diff.json
  gputop diff base.gtrec pr.gtrec --fail-above 5    CI: fail on a >5% slowdown

exit status: 0 compared (not slower than --fail-above), 1 B is slower than
--fail-above PCT with 95% confidence, 2 bad command line or a recording that
cannot be read, 3 --fail-above given but steps/s could not be compared.
"""

MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 10.0
NVML_INTERVAL_S = 0.1   # the NVML fast loop's; CALM_FACTOR times it while the job is calm
RECORDINGS_KEPT, RECORDINGS_MAX_BYTES = 20, 1 << 30


class UsageError(Exception):
    """Bad command line: exit code 2."""


class CliError(Exception):
    """Anything else the user must fix: exit code 1 (``exit_code``: a job's failure passed on)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def _grid_arg(text: str) -> float:
    """--grid-intensity: gCO2e per kWh, a finite number in 0-5000 (coal is ~1000)."""
    try:
        g = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be gCO2e per kWh (e.g. 400), not {text!r}") from None
    if not 0 <= g <= 5000:
        raise argparse.ArgumentTypeError(f"must be between 0 and 5000 gCO2e/kWh, not {text}")
    return g


def _pid_arg(text: str) -> int:
    """--pid: a positive process id; anything else is a bad command line (exit 2)."""
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a process id (1, 2, ...), not {text!r}") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive process id, not {pid}")
    return pid


def _pct_arg(text: str) -> float:
    """--fail-above: a percentage, 0 or more."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a percentage (5, 2.5), not {text!r}") from None
    if not (0 <= v < 1e6):
        raise argparse.ArgumentTypeError(f"must be a percentage of 0 or more, not {text}")
    return v


def _add_attach_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("watching a process")
    g.add_argument("--gpu", type=int, action="append", metavar="N",
                   help="watch GPU N (repeatable); default: the GPUs the process uses "
                        "(all until it uses one)")
    g.add_argument("--interval", type=float, default=None, metavar="S",
                   help=f"GPU sampling interval in seconds, {MIN_INTERVAL_S}-{MAX_INTERVAL_S} "
                        f"(default {NVML_INTERVAL_S:g}, {NVML_INTERVAL_S * CALM_FACTOR:g} while the "
                        "job is calm: one phase, no verdict change, no stall for a minute); "
                        "host sampling runs at max(1, S)")
    g.add_argument("--record", metavar="FILE",
                   help="record the session to FILE, a new .gtrec file (created 0600)")
    g.add_argument("--headless", action="store_true",
                   help="no UI: sample for --duration seconds, record (to --record FILE, else "
                        "into the state directory: see gputop --help), print the report")
    g.add_argument("--duration", type=float, metavar="S",
                   help="with --headless: how long to sample (seconds)")
    g.add_argument("--json", action="store_true", help="with --headless: print the report as JSON")
    g.add_argument("--no-stacks", action="store_true", help="do not sample Python stacks with py-spy")
    g.add_argument("--grid-intensity", type=_grid_arg, metavar="G",
                   help="with --headless: the grid's carbon intensity in gCO2e/kWh, for the report's emissions")
    g.add_argument("--prometheus", metavar="[HOST:]PORT",
                   help="serve the session's metrics to Prometheus on http://HOST:PORT/metrics "
                        "(host default 127.0.0.1; 0.0.0.0 for all interfaces; docs/prometheus.md)")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line (what is wrong, where to look), not the
    usage block followed by the error."""

    def error(self, message: str):
        self.exit(2, f"gputop: error: {message} (see {self.prog} --help)\n")


def _state_for_help() -> str:
    from gputop.sources.files import state_base

    home = os.path.expanduser("~")
    base = state_base()
    return "~" + base[len(home):] if home not in ("", "/") and base.startswith(home + os.sep) else base


def _docs_for_help() -> str:
    from gputop.demo.bundled import docs_dir

    return docs_dir() or "docs/ in gputop's source tree (the clone it was installed from)"


def build_parser() -> argparse.ArgumentParser:
    state = _state_for_help()
    raw = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog="gputop",
        description="Why is my training job slow? Live GPU counters, Python stacks and step\n"
                    "timings, fused into bottleneck verdicts.",
        epilog=EPILOG.format(state=state, docs=_docs_for_help()), formatter_class=raw)
    p.add_argument("--version", action="version", version=f"gputop {gputop.__version__}")
    p.add_argument("--pid", type=_pid_arg, metavar="PID",
                   help="the process to watch (a training script or launcher)")
    _add_attach_options(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND",
                           help="replay, report, diff, demo, run or agent (gputop COMMAND --help)")

    r = sub.add_parser("replay", help="replay a recording in the UI", description="Replay a recording in the UI.",
                       epilog=REPLAY_EPILOG.format(state=state), formatter_class=raw)
    r.add_argument("file", metavar="FILE", help="a recording (.gtrec) made by --record or --headless")
    r.add_argument("--speed", type=float, default=1.0, help="playback speed, 0.25-16 (default 1)")
    r.add_argument("--paused", action="store_true", help="start paused at the beginning")

    rep = sub.add_parser("report", help="summarise a recording", description="Summarise a recording.",
                         epilog=REPORT_EPILOG.format(state=state), formatter_class=raw)
    rep.add_argument("file", metavar="FILE", help="a recording (.gtrec) made by --record or --headless")
    rep.add_argument("--json", action="store_true", help="print JSON (shape: docs/report.md)")
    rep.add_argument("--grid-intensity", type=_grid_arg, metavar="G",
                     help="the grid's carbon intensity in gCO2e/kWh: the GPUs' energy as emissions")

    df = sub.add_parser("diff", help="compare two recordings",
                        description="Compare two recordings: is B faster than A?", epilog=DIFF_EPILOG,
                        formatter_class=raw)
    df.add_argument("file_a", metavar="A", help="the baseline recording (.gtrec)")
    df.add_argument("file_b", metavar="B", help="the recording to compare with it")
    df.add_argument("--json", action="store_true", help="print JSON (shape: docs/report.md)")
    df.add_argument("--fail-above", type=_pct_arg, metavar="PCT",
                    help="exit 1 when B is slower than A by more than PCT%% with 95%% confidence")

    d = sub.add_parser("demo", help="run a bundled workload and watch it",
                       description="Start a bundled training workload as a child process and watch it.",
                       epilog=DEMO_EPILOG.format(state=state), formatter_class=raw)
    d.add_argument("--scenario", default="default", help="which workload (see --list)")
    d.add_argument("--list", action="store_true", help="list the scenarios and recordings, and exit")
    d.add_argument("--replay", nargs="?", const="", metavar="NAME",
                   help="replay a bundled H200 recording instead (default gpu_bound; --list "
                        "names them); with --headless print its report")
    _add_attach_options(d)
    d.add_argument("--pid", dest="sub_pid", help=argparse.SUPPRESS)

    _add_agent_parser(sub, raw)

    run = sub.add_parser("run", help="start a command with the in-process probe and watch it",
                         description="Start COMMAND with gputop's in-process probe loaded, and watch it.",
                         usage="gputop run [options] -- COMMAND [ARGS...]",
                         epilog=RUN_EPILOG.format(state=state), formatter_class=raw)
    _add_attach_options(run)
    run.add_argument("--stop-with-gputop", action="store_true",
                     help="stop the job (and all it started) whenever gputop ends, even of kill -9; "
                          "by default only --headless stops it (at the end of --duration)")
    run.add_argument("--keep-running", action="store_true",
                     help="with --headless: leave the job running when --duration ends (by default "
                          "gputop stops it and all it started, then prints the report)")
    run.add_argument("--pid", dest="sub_pid", help=argparse.SUPPRESS)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND",
                     help="the program to start and its arguments, after --")
    return p


AGENT_EPILOG = """\
Watches every training job on this node without being told which: Python
processes on a GPU (NVML), with a gputop probe, torchrun and its kind, SLURM
tasks, and whatever --match names. Each job gets a headless session at lower
rates than the UI's (about 1% of a core per job) and all of them are served
on one /metrics, with a job label. docs/fleet.md: systemd, Kubernetes, SLURM.

examples:
  gputop agent                          serve 127.0.0.1:9464 until stopped
  gputop agent --prometheus 0.0.0.0:9464 --state-dir /var/lib/gputop \\
               --keep-mb 2048 --keep-hours 24
  gputop agent --match 'python.*train'  also jobs the rules would miss
"""


def _add_agent_parser(sub, raw) -> None:
    ag = sub.add_parser("agent", help="watch every training job on this node, for Prometheus",
                        description="Headless node agent: every training job on this node, one /metrics.",
                        epilog=AGENT_EPILOG, formatter_class=raw)
    ag.add_argument("--prometheus", metavar="[HOST:]PORT", default="127.0.0.1:9464",
                    help="where to serve /metrics (default 127.0.0.1:9464, this machine only; "
                         "0.0.0.0:9464 for all interfaces)")
    ag.add_argument("--match", metavar="REGEX", help="also watch processes whose command line matches REGEX")
    ag.add_argument("--only-match", action="store_true",
                    help="watch only what --match names (no automatic discovery)")
    ag.add_argument("--max-jobs", type=int, default=16, metavar="N", help="watch at most N jobs (default 16)")
    ag.add_argument("--scan", type=float, default=5.0, metavar="S",
                    help="look for new and ended jobs every S seconds (default 5)")
    ag.add_argument("--state-dir", metavar="DIR",
                    help="keep rolling recordings per job in DIR (a private directory of this user)")
    ag.add_argument("--keep-mb", type=float, metavar="N", help="with --state-dir: at most N MiB in all (default 2048)")
    ag.add_argument("--keep-hours", type=float, metavar="H",
                    help="with --state-dir: remove recordings older than H hours (default 24)")
    ag.add_argument("--no-stacks", action="store_true", help="do not sample Python stacks with py-spy")
    ag.add_argument("--stack-rate", type=int, default=None, metavar="HZ",
                    help="py-spy samples per second per job (default 2; the UI uses 20)")
    ag.add_argument("--stack-window", type=int, default=None, metavar="S",
                    help="seconds per py-spy run (default 20; the UI uses 2)")
    ag.add_argument("--host-proc", metavar="DIR",
                    help="the host's /proc mounted here (in a container without hostPID): maps NVML's PIDs exactly")
    ag.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: run until a signal)")
