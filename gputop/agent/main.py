"""The ``gputop agent`` command: check the arguments, listen, run until a signal."""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
import sys
import threading

log = logging.getLogger("gputop.agent")


class UsageError(Exception):
    """A bad command line (cli.py: exit 2)."""


class CliError(Exception):
    """Anything else the user must fix (cli.py: exit 1)."""


def check_args(a) -> None:
    from gputop.export.prometheus import parse_address

    try:
        parse_address(a.prometheus)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if a.match is not None:
        try:
            re.compile(a.match)
        except re.error as e:
            raise UsageError(f"--match {a.match!r} is not a regular expression: {e}") from None
    if a.only_match and a.match is None:
        raise UsageError("--only-match needs --match REGEX (which processes to watch)")
    if not 1 <= a.max_jobs <= 256:
        raise UsageError(f"--max-jobs must be between 1 and 256, not {a.max_jobs}")
    if not 0.5 <= a.scan <= 600:
        raise UsageError(f"--scan must be between 0.5 and 600 seconds, not {a.scan:g}")
    if (a.keep_mb is not None or a.keep_hours is not None) and a.state_dir is None:
        raise UsageError("--keep-mb and --keep-hours apply with --state-dir DIR (where recordings go)")
    if a.keep_mb is not None and not a.keep_mb > 0:
        raise UsageError(f"--keep-mb must be positive, not {a.keep_mb:g}")
    if a.keep_hours is not None and not a.keep_hours > 0:
        raise UsageError(f"--keep-hours must be positive, not {a.keep_hours:g}")
    if a.stack_rate is not None and not 1 <= a.stack_rate <= 100:
        raise UsageError(f"--stack-rate must be between 1 and 100 samples/s, not {a.stack_rate}")
    if a.stack_window is not None and not 1 <= a.stack_window <= 60:
        raise UsageError(f"--stack-window must be between 1 and 60 seconds, not {a.stack_window}")
    if a.duration is not None and not a.duration > 0:
        raise UsageError(f"--duration must be positive, not {a.duration:g}")


def cmd_agent(a, argv: list[str]) -> int:
    check_args(a)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="gputop agent: %(message)s")
    from gputop.agent.agent import Agent
    from gputop.agent.collector import AgentCollector
    from gputop.agent.job import Rates
    from gputop.export.prometheus import ExporterError, PrometheusExporter, parse_address
    from gputop.sources.files import FilesError

    state = None
    if a.state_dir is not None:
        from gputop.agent.state import StateDir

        try:
            state = StateDir(a.state_dir, int((a.keep_mb or 2048) * 2**20), (a.keep_hours or 24) * 3600)
        except FilesError as e:
            raise CliError(str(e)) from None
    rates = Rates(stacks=not a.no_stacks)
    if a.stack_rate is not None:
        rates = dataclasses.replace(rates, stack_rate_hz=a.stack_rate)
    if a.stack_window is not None:
        rates = dataclasses.replace(rates, stack_window_s=a.stack_window)
    agent = Agent(match=a.match, only_match=a.only_match, max_jobs=a.max_jobs, scan_s=a.scan, rates=rates, state=state,
                  host_proc=a.host_proc, argv=argv)
    try:
        exporter = PrometheusExporter(*parse_address(a.prometheus), collector=AgentCollector(agent))
    except ExporterError as e:
        raise CliError(str(e)) from None
    log.info("serving Prometheus metrics on %s%s", exporter.url,
             f"; recordings in {state.path}" if state is not None else "")
    done = threading.Event()
    why = {"signal": None}

    def on_signal(signum, frame):
        why["signal"] = signal.Signals(signum).name
        done.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    agent.start()
    try:
        done.wait(a.duration)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        agent.stop()
        exporter.stop()
    log.info("stopped (%s): watched %d job(s) in all", why["signal"] or "duration", agent.stats["started"])
    return 0
