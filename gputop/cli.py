"""The ``gputop`` command: argument parsing and wiring of sources, session, UI and report.

Every user error ends in one line on stderr (``gputop: error: ...``: what went wrong, what to
do) and a non-zero exit code: 2 for a bad command line, 1 for anything else. A headless session of
a job gputop started exits with the job's status when the job failed (``job_exit_status``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

from gputop.cli_args import (MAX_INTERVAL_S, MIN_INTERVAL_S, NVML_INTERVAL_S, RECORDINGS_KEPT, RECORDINGS_MAX_BYTES,  # noqa: F401
                             CliError, UsageError, _add_attach_options, _pid_arg, build_parser)

LOGS_KEPT = 10

def _check_attach_args(a: argparse.Namespace) -> None:
    if a.interval is not None and not (MIN_INTERVAL_S <= a.interval <= MAX_INTERVAL_S):
        raise UsageError(f"--interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} seconds, not {a.interval:g}")
    if a.headless:
        if a.duration is None:
            raise UsageError("--headless needs --duration S (how many seconds to sample)")
        if not (0 < a.duration <= 7 * 24 * 3600):
            raise UsageError(f"--duration must be a positive number of seconds, not {a.duration:g}")
    elif a.duration is not None:
        raise UsageError("--duration only applies with --headless")
    if getattr(a, "keep_running", False):
        if not a.headless:
            raise UsageError("--keep-running only applies with --headless (in the UI the job goes on "
                             "when you quit)")
        if a.stop_with_gputop:
            raise UsageError("--keep-running and --stop-with-gputop contradict each other: choose one")
    if a.json and not a.headless:
        raise UsageError("--json only applies with --headless (or use: gputop report FILE --json)")
    for n in a.gpu or []:
        if n < 0:
            raise UsageError(f"--gpu takes a GPU index (0, 1, ...), not {n}")
    if a.prometheus is not None:
        from gputop.export.prometheus import parse_address

        try:
            parse_address(a.prometheus)
        except ValueError as e:
            raise UsageError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# Live sessions


def _build_live_session(pid: int, a: argparse.Namespace, argv: list[str], record_path: str | None,
                        target=None):
    from gputop.sources.target import Target

    if target is None:
        target = Target(pid)  # first: a bad PID is reported before anything else starts

    from gputop.session.recording import Recorder, RecordingError, RecordingWriter
    from gputop.session.session import LiveSession, SessionClock, base_meta
    from gputop.sources.host import DEFAULT_INTERVAL_S as HOST_INTERVAL_S, HostSource
    from gputop.sources.calm import JobCalm
    from gputop.sources.nvml import NvmlSource

    clock = SessionClock()
    calm = JobCalm(clock)
    sources = [
        calm,
        # an interval the user chose is kept; the default ones are CALM_FACTOR (4; NVML) and
        # CALM_HELD_FACTOR (2; host) times longer while the job is calm (sources/calm.py)
        NvmlSource(clock, target, gpu_indices=a.gpu, interval_s=a.interval or NVML_INTERVAL_S,
                   calm=calm if a.interval is None else None),
        HostSource(clock, target, interval_s=max(HOST_INTERVAL_S, a.interval or NVML_INTERVAL_S),
                   calm=calm if a.interval is None else None),
    ]
    sources += _optional_sources(clock, target, a, calm)
    processors = _processors()
    meta = base_meta(clock, argv)
    meta["target"] = target.describe()
    recorder = None
    if record_path:
        try:
            recorder = Recorder(RecordingWriter(record_path, meta), summarizer=_summarizer())
        except RecordingError as e:
            raise CliError(str(e)) from None
    session = LiveSession(sources, clock, meta, recorder=recorder, processors=processors)
    return session, target


def _optional_sources(clock, target, a, calm=None) -> list:
    """Sources that plug in when their module is part of this build."""
    out = []
    try:
        from gputop.sources.stacks import StackSource
    except ModuleNotFoundError:
        StackSource = None
    if StackSource is not None and not a.no_stacks:
        out.append(StackSource(clock, target, calm=calm))
    try:
        from gputop.sources.probe_client import ProbeClientSource
    except ModuleNotFoundError:
        ProbeClientSource = None
    if ProbeClientSource is not None:
        out.append(ProbeClientSource(clock, target))
    if not a.no_stacks:
        from gputop.sources.stall_snapshot import StallSnapshotSource

        out.append(StallSnapshotSource(clock))
    return out


def _summarizer():
    """The recording's summary frames: what `gputop report` merges instead of replaying."""
    from gputop.verdicts.recording_summary import RecordingSummarizer

    return RecordingSummarizer()


def _processors() -> list:
    """Derivations run on the session's samples (live and on replay)."""
    from gputop.verdicts import default_processors

    return default_processors()


def _default_record_path(pid: int) -> str:
    """Headless without --record: a new file in the per-user state directory, never the working
    directory (which may be read-only, or a checkout); older ones beyond the retention go."""
    from gputop.sources.files import FilesError, owned_name, prune, state_dir

    try:
        directory = state_dir("recordings")
    except FilesError as e:
        raise CliError(f"cannot record: {e}; or give --record FILE") from None
    prune(directory, ".gtrec", RECORDINGS_KEPT - 1, RECORDINGS_MAX_BYTES)
    return os.path.join(directory, owned_name("gputop", ".gtrec", pid=pid))


def _start_exporter(a: argparse.Namespace):
    """--prometheus: listen before anything else starts, so a port in use is one line, at once."""
    if a.prometheus is None:
        return None
    from gputop.export.prometheus import ExporterError, PrometheusExporter, parse_address

    try:
        exporter = PrometheusExporter(*parse_address(a.prometheus))
    except ExporterError as e:
        raise CliError(str(e)) from None
    print(f"gputop: serving Prometheus metrics on {exporter.url}", file=sys.stderr, flush=True)
    return exporter


def attach(pid: int, a: argparse.Namespace, argv: list[str], job: "_Job | None" = None) -> int:
    """Watch ``pid`` (in the UI, or headless); ``job``: the command gputop run/demo started."""
    target = _target(pid)  # first: a missing PID is its one line, before the TTY check or a port
    exporter = _start_exporter(a)
    try:
        return _attach(target, a, argv, job, exporter)
    finally:
        if exporter is not None:
            exporter.stop()


def _target(pid: int):
    from gputop.sources.target import Target, TargetError

    try:
        return Target(pid)
    except TargetError as e:
        raise CliError(str(e)) from None


def _need_terminal(a) -> None:
    if not a.headless and not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise CliError("no terminal here (stdin/stdout is not a TTY): run with --headless --duration S")


def _attach(target, a: argparse.Namespace, argv: list[str], job, exporter) -> int:
    from gputop.sources.target import TargetError

    _need_terminal(a)
    record_path = a.record
    if a.headless and not record_path:
        record_path = _default_record_path(target.pid)
    try:
        session, target = _build_live_session(target.pid, a, argv, record_path, target=target)
    except TargetError as e:
        raise CliError(str(e)) from None
    if target.ptrace_denied and a.headless:  # watched anyway: say what is missing (Sources view in the UI)
        print(f"gputop: {target.ptrace_denied}; watching what this user may read: the GPU (NVML), the "
              "process's CPU, memory and threads (/proc); no Python stacks, GIL wait, I/O counters or "
              "environment" + ("" if os.geteuid() == 0 else ", and no probe (its socket is private to its user)"),
              file=sys.stderr, flush=True)
    if a.headless:
        # The signals are caught before the sources start: a kill during start-up (py-spy's
        # first window, the report module's import) still ends with the end frame and report.
        stop, old = _catch_stop_signals(job)
        try:
            session.start()
            if exporter is not None:
                exporter.serve(session)
        except BaseException:
            for s, h in old.items():
                signal.signal(s, h)
            session.stop()
            raise
        return _run_headless(session, target, a, record_path, job, stop, old)
    from gputop.ui.app import run_app   # (slow: imported before the sources start, not after)
    with _exit_on_sigterm():
        try:
            session.start()
            if exporter is not None:
                exporter.serve(session)
            return run_app(session, job_log=getattr(a, "job_log", None), notice=getattr(a, "notice", None))
        finally:
            session.stop()


class _exit_on_sigterm:
    """In the UI, SIGTERM (a kill, a closing SSH session's hang-up) unwinds like a quit, so the
    recording is closed, py-spy stopped and a started command stopped too."""

    def __enter__(self):
        def leave(signum, frame):
            raise SystemExit(128 + signum)

        self._old = {s: signal.signal(s, leave) for s in (signal.SIGTERM, signal.SIGHUP)}
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def _catch_stop_signals(job: "_Job | None" = None) -> tuple[dict, dict]:
    """Headless: SIGINT, SIGTERM and SIGHUP (a closed SSH session) end the session as cleanly as
    its duration does (end frame, report); a started job gets the terminal's two (SIGINT,
    SIGHUP) passed on, as it would without gputop. Returns (the flag they set, the old handlers)."""
    stop = {"why": None}

    def on_signal(signum, frame):
        stop["why"] = signal.Signals(signum).name
        if job is not None:
            job.forward(signum)

    return stop, {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def _run_headless(session, target, a, record_path: str, job, stop: dict, old: dict) -> int:
    from gputop.report import build_report, render_text
    from gputop.sources.candidates import one_line

    print(f"gputop: watching PID {target.pid} ({one_line(target.command, 80)}) for {a.duration:g} s, "
          f"recording to {record_path}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + a.duration
    exited_at = None
    alive_at = 0.0
    try:
        while time.monotonic() < deadline and stop["why"] is None:
            time.sleep(0.2)   # a signal's stop is seen within 0.2 s
            # the target's exit within a second (psutil's check costs ~0.1 ms, 5 times a second was
            # 0.05% of a core for nothing)
            if exited_at is None and time.monotonic() >= alive_at:
                alive_at = time.monotonic() + 1.0
                if target.alive():
                    continue
                exited_at = time.monotonic()
                print(f"gputop: the target (PID {target.pid}) exited; finishing the report",
                      file=sys.stderr, flush=True)
            if exited_at is not None and time.monotonic() - exited_at > 1.5:
                break
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        session.stop({"stopped_by": stop["why"] or ("target exited" if exited_at else "duration")})
    if job is not None:  # the job ends (or is said to go on) before the report: the report comes last
        job.end()
        job.say()
    if session.recording_error:
        print(f"gputop: {session.recording_error}: the recording covers the session only up to then",
              file=sys.stderr)
    print(f"gputop: recorded to {record_path}", file=sys.stderr, flush=True)
    report = _with_emissions(build_report(record_path), a)
    if a.json:
        print(_report_json(report))
    else:
        sys.stdout.write(render_text(report))
    sys.stdout.flush()
    status = job.exit_status() if job is not None else 0
    if status == 0 and stop["why"] is not None:
        # interrupted (the report is written all the same): 128 + the signal, as a shell says it;
        # Ctrl-C is 130 (README's exit status)
        status = 128 + signal.Signals[stop["why"]].value
    if status == 0 and session.recording_error:
        status = 1   # the recording stopped early (a full disk): a failure at run time
    return status


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_replay(a) -> int:
    from gputop.session.recording import RecordingError
    from gputop.session.replay import SPEEDS, ReplaySession

    if not (SPEEDS[0] <= a.speed <= SPEEDS[-1]):
        raise UsageError(f"--speed must be between {SPEEDS[0]} and {SPEEDS[-1]}, not {a.speed:g}")
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise CliError("no terminal here (stdin/stdout is not a TTY): use `gputop report FILE` instead")
    try:
        session = ReplaySession(a.file, processors=_processors(), start_playing=not a.paused)
    except RecordingError as e:
        raise CliError(str(e)) from None
    session.set_speed(a.speed)
    from gputop.ui.app import run_app
    try:
        with _exit_on_sigterm():
            return run_app(session)
    finally:
        session.stop()


def _report_json(report: dict) -> str:
    """Strict JSON, whatever the recording held: no NaN/Infinity (json_safe makes them null)."""
    from gputop.session.sanitize import json_safe

    return json.dumps(json_safe(report), indent=2, allow_nan=False)


def _with_emissions(report: dict, a) -> dict:
    """--grid-intensity G: the efficiency section's energy as gCO2e (derive/efficiency.py)."""
    if getattr(a, "grid_intensity", None) is not None:
        from gputop.derive.efficiency import add_emissions
        add_emissions(report.get("efficiency"), a.grid_intensity)
    return report


def cmd_report(a) -> int:
    from gputop.report import build_report, render_text
    from gputop.session.recording import RecordingError

    # A one-shot process that builds millions of small objects and keeps most of them to the end:
    # the cyclic collector's passes over that growing heap were a third of a day-long file's
    # report (19.3 -> 12.6 s) and ~10% of an hour's, and they find next to nothing (peak RSS +2%).
    gc.disable()
    try:
        report = _with_emissions(build_report(a.file), a)
    except RecordingError as e:
        raise CliError(str(e)) from None
    if a.json:
        print(_report_json(report))
    else:
        sys.stdout.write(render_text(report))
    return 0


def _start_child(argv: list[str], log_fd: int | None, a, stop_with: bool) -> subprocess.Popen:
    from gputop.session.launch import LaunchError, start_job

    try:
        return start_job(argv, with_probe=True, log_fd=log_fd, stdout_to_stderr=a.headless and a.json,
                         stop_with_parent=stop_with)
    except FileNotFoundError:
        raise CliError(f"cannot start {argv[0]!r}: no such program") from None
    except PermissionError:
        raise CliError(f"cannot start {argv[0]!r}: permission denied") from None
    except (LaunchError, OSError) as e:
        raise CliError(f"cannot start {argv[0]!r}: {getattr(e, 'strerror', None) or e}") from None


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            lines = [ln.strip() for ln in f.read()[-4000:].decode(errors="replace").splitlines() if ln.strip()]
        return f": {lines[-1]}" if lines else ""
    except OSError:
        return ""


def _open_log(what: str) -> tuple[str, int]:
    """The UI's log of the job's output: a new 0600 file in the per-user state directory (the
    oldest beyond LOGS_KEPT removed), named after gputop's PID until the job has one
    (``_name_log_after``); its path and descriptor."""
    from gputop.sources.files import FilesError, create_file, owned_name, prune, state_dir

    try:
        directory = state_dir("logs")
        prune(directory, ".log", LOGS_KEPT - 1)
        path = os.path.join(directory, owned_name(what, ".log"))
        return path, create_file(path)
    except FilesError as e:
        raise CliError(f"no log for the {what} command's output: {e}") from None


def _probe_dir_of_job() -> str:
    from gputop.probe import wire

    return wire.probe_dir(dict(os.environ))


def _name_log_after(path: str, pid: int) -> str:
    """The UI's log, named after the job's PID once it has one: ``run-<job PID>-DATE.log`` (a
    link and unlink in gputop's private directory, never over an existing file; the job's
    descriptor is unchanged). The old name if that fails."""
    directory, name = os.path.split(path)
    kind, _, rest = name.partition("-")
    new = os.path.join(directory, f"{kind}-{pid}-{rest.partition('-')[2]}")
    try:
        os.link(path, new)
    except OSError:
        return path
    try:
        os.unlink(path)
    except OSError:
        pass
    return new


def _ending(returncode: int) -> str:
    """How a job ended, in words: "exit code 1", "killed by SIGSEGV"."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def job_exit_status(returncode: int | None, stopped_by_gputop: bool) -> int:
    """gputop's exit status for a headless session of a job it started (run --help): the job's
    when it failed (its exit code; 128+N when signal N ended it, as a shell says), else 0. A job
    gputop itself stopped (its SIGTERM/SIGKILL at the end), or one still running, did not fail."""
    if returncode is None or returncode == 0 or stopped_by_gputop:
        return 0
    return 128 - returncode if returncode < 0 else returncode


class _Job:
    """The command `gputop run` / `gputop demo` started: its end (stopped with the session when
    ``stop_at_end``, else left running), the line gputop says about it and the exit status."""

    def __init__(self, child: subprocess.Popen, what: str, log_path: str | None, stop_at_end: bool,
                 keep_hint: bool = False):
        self.child, self.what, self.log_path = child, what, log_path
        self.stop_at_end, self.keep_hint = stop_at_end, keep_hint
        self.stopped_with: int | None = None  # the signal of gputop's that ended it
        self.forwarded = False   # a Ctrl-C or hang-up was passed on to it
        self.signalled = self.ended = self.said = False
        self.tries, self.grace_s = 0, 0.0

    def forward(self, signum: int) -> None:
        """The terminal's SIGINT and SIGHUP (the job has a session of its own: they reach gputop
        only) go on to the job's process group, as they would have reached the job started
        directly. Called in a signal handler."""
        if signum in (signal.SIGINT, signal.SIGHUP) and self.child.returncode is None:
            from gputop.session.launch import forward_signal

            forward_signal(self.child, signum)
            self.forwarded = True

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after the grace period (after a Ctrl-C or
        hang-up passed on, the job first has the grace period to end by itself); SIGKILL at once
        when a first stop was cut short (a second Ctrl-C while gputop waited)."""
        from gputop.session.launch import STOP_GRACE_S, stop_job

        self.tries += 1
        patient = self.tries == 1
        if patient and self.forwarded:
            try:
                self.child.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        if self.child.poll() is None:
            self.signalled = True  # (before stop_job: a Ctrl-C may cut it short)
        self.grace_s = STOP_GRACE_S if patient else 0.0
        ended_by = stop_job(self.child, grace_s=self.grace_s)
        self.stopped_with = ended_by or self.stopped_with or (signal.SIGTERM if self.signalled else None)
        self.ended = True

    def end(self) -> None:
        """The session ended: stop the job if it lives with the session."""
        if self.stop_at_end and not self.ended:
            self.stop()

    def say(self, quiet: bool = False) -> None:
        """One line on stderr: the job goes on (and how to stop it), gputop stopped it, or it
        ended by itself and how. ``quiet``: only the clean-up (an error said it already)."""
        from gputop.session.launch import job_group
        from gputop.sources.files import remove_dead_probe_sockets

        if self.said:
            return
        self.said = True
        child, what = self.child, self.what
        where = f"; its output is in {self.log_path}" if self.log_path else ""
        if child.poll() is None:
            group = job_group(child)
            how = (f"kill -TERM -{group} (its process group: the job and all it started)" if group
                   else f"kill {child.pid}")
            print(f"gputop: the {what} command (PID {child.pid}) goes on running{where}; stop it with: {how}",
                  file=sys.stderr, flush=True)
            return
        if not quiet:
            if self.stopped_with is not None:
                how = (" (SIGTERM to its process group)" if self.stopped_with == signal.SIGTERM else
                       f" (SIGKILL: it was still running {self.grace_s:g} s after SIGTERM)" if self.grace_s else
                       " (SIGKILL at once: gputop was interrupted while it waited for the job to end)")
                keep = "; --keep-running leaves it running" if self.keep_hint else ""
                print(f"gputop: the {what} command (PID {child.pid}) was stopped by gputop{how}{keep}{where}",
                      file=sys.stderr, flush=True)
            else:
                print(f"gputop: the {what} command ended ({_ending(child.returncode)}){where}",
                      file=sys.stderr, flush=True)
        # A job stopped by a signal skips its probe's atexit: its socket would stay behind.
        remove_dead_probe_sockets(_probe_dir_of_job())

    def exit_status(self) -> int:
        return job_exit_status(self.child.poll(), self.stopped_with is not None)


class _passing_on_signals:
    """Headless, around the whole watch of a started job: until the session catches its signals
    (and after), the terminal's SIGINT and SIGHUP are passed on to the job and end gputop as they
    would have (KeyboardInterrupt; exit 128+N), SIGTERM likewise; the job then ends with gputop
    (``_Job.end``) unless it is to go on."""

    def __init__(self, job: _Job):
        self.job = job

    def __enter__(self):
        def leave(signum, frame):
            self.job.forward(signum)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        self._old = {s: signal.signal(s, leave) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def _watch_child(argv: list[str], a, parent_argv: list[str], what: str, stop_with: bool) -> int:
    _check_attach_args(a)
    _need_terminal(a)  # before the job starts: a job started for nothing would run on
    log_path, log_fd = (None, None) if a.headless else _open_log(what)
    try:
        child = _start_child(argv, log_fd, a, stop_with)
    finally:
        if log_fd is not None:
            os.close(log_fd)
    if log_path:
        log_path = _name_log_after(log_path, child.pid)
    a.job_log = log_path  # the UI's Output view tails it
    # Headless, the job lives as long as the session (--duration, a signal) unless --keep-running;
    # in the UI it goes on when gputop quits; --stop-with-gputop (and the demo): it never outlives gputop.
    keep = getattr(a, "keep_running", False)
    job = _Job(child, what, log_path, stop_at_end=stop_with or (a.headless and not keep),
               keep_hint=what == "run" and a.headless and not stop_with)
    where = f"; its output is in {log_path}" if log_path else ""
    quiet = False
    with _passing_on_signals(job) if a.headless else contextlib.nullcontext():
        try:
            time.sleep(0.3)
            if child.poll() is not None:
                last = _last_line(log_path) if log_path else ""
                quiet = True
                raise CliError(f"the {what} command exited at once ({_ending(child.returncode)}){last}{where}",
                               exit_code=job.exit_status() or 1)
            try:
                return attach(child.pid, a, parent_argv, job=job)
            except CliError:
                job.stop()  # gputop could not watch it (a port in use, ...): it was started for that
                raise
        finally:
            try:
                job.end()
            except (KeyboardInterrupt, SystemExit):
                job.end()  # a second Ctrl-C while gputop waited for it: SIGKILL now
                raise
            finally:
                job.say(quiet=quiet)


def _no_pid(a, command: str) -> None:
    if a.pid is not None or a.sub_pid is not None:
        raise UsageError(f"--pid does not go with `gputop {command}`: it starts the process it watches")


def _torch_installed() -> bool:
    """Whether the demo's workload (same interpreter) can import torch; found, not imported."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["torch"] = None blocks the import
        return False


def cmd_demo(a, parent_argv) -> int:
    from gputop.demo.workload import NO_TORCH, NO_TORCH_HINT, SCENARIOS, needs_torch

    _no_pid(a, "demo")
    if a.list:
        for name, sc in SCENARIOS.items():
            need = " (needs a GPU)" if sc.needs_gpu else ""
            expect = f" -> {sc.expect}" if sc.expect else ""
            print(f"{name:<22} {sc.about}{need}{expect}")
        from gputop.demo.bundled import list_text

        sys.stdout.write(list_text())
        return 0
    if a.replay is not None:
        return _demo_replay(a)
    if a.scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {a.scenario!r}: choose one of {', '.join(SCENARIOS)} (gputop demo --list)")
    if a.scenario not in NO_TORCH and not _torch_installed():
        if a.scenario != "default":
            raise CliError(needs_torch(a.scenario))
        # The newcomer's first command must show gputop working on any machine: without torch,
        # the default becomes a pure-Python job whose main thread waits for the GIL. (The UI also
        # shows the hint when it starts: this line is hidden behind the screen until it quits.)
        print(f"gputop demo: {NO_TORCH_HINT}", file=sys.stderr)
        a.notice = NO_TORCH_HINT
        a.scenario = "python_gil"
    if SCENARIOS[a.scenario].needs_gpu and _nvidia_gpu_count() == 0:
        cpu_ok = ", ".join(n for n, s in SCENARIOS.items() if not s.needs_gpu)
        raise CliError(f"scenario {a.scenario} needs an NVIDIA GPU and this machine has none: "
                       f"try one of {cpu_ok}")
    argv = [sys.executable, "-m", "gputop.demo.workload", "--scenario", a.scenario]
    return _watch_child(argv, a, parent_argv, what="demo", stop_with=True)


def _demo_replay(a) -> int:
    """--replay [NAME]: the bundled recording in the replay UI, or with --headless its report."""
    from gputop.demo.bundled import RecordingNotFound, find_recording

    given = [o for o, v in (("--scenario", a.scenario != "default"), ("--duration", a.duration is not None),
                            ("--record", a.record), ("--prometheus", a.prometheus)) if v]
    if given:
        raise UsageError(f"{given[0]} does not go with --replay (it replays a recording)")
    if a.json and not a.headless:
        raise UsageError("--json only applies with --headless")
    try:
        path = find_recording(a.replay or None)
    except RecordingNotFound as e:
        raise UsageError(str(e)) from None
    if not a.headless and not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise CliError("no terminal here (stdin/stdout is not a TTY): add --headless for its report")
    rec = argparse.Namespace(file=path, json=a.json, speed=1.0, paused=False)
    return cmd_report(rec) if a.headless else cmd_replay(rec)


def _nvidia_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: no GPU to use
        return 0


def cmd_run(a, parent_argv) -> int:
    _no_pid(a, "run")
    cmd = list(a.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("gputop run needs a command after --, for example: gputop run -- python train.py")
    return _watch_child(cmd, a, parent_argv, what="run", stop_with=a.stop_with_gputop)


def _pick_pid(a) -> int | None:
    """No --pid: in a terminal, the picker (None if the user quits); else the list and exit 2."""
    if a.headless or not (sys.stdout.isatty() and sys.stdin.isatty()):
        from gputop.sources.candidates import find_candidates, format_list

        sys.stdout.write(format_list(find_candidates()))
        raise UsageError("nothing to watch: give --pid PID (candidates above), or a command "
                         "(demo, run, replay, report); see gputop --help")
    from gputop.ui.picker import pick_process

    return pick_process()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        a = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed its one-line usage error (or --help/--version)
        return int(e.code or 0)
    try:
        if a.command == "replay":
            return cmd_replay(a)
        if a.command == "report":
            return cmd_report(a)
        if a.command == "diff":
            from gputop.diff.command import run as cmd_diff

            return cmd_diff(a.file_a, a.file_b, a.json, a.fail_above)
        if a.command == "demo":
            return cmd_demo(a, argv)
        if a.command == "run":
            return cmd_run(a, argv)
        if a.command == "agent":
            from gputop.agent import main as agent_main

            try:
                return agent_main.cmd_agent(a, argv)
            except agent_main.UsageError as e:
                raise UsageError(str(e)) from None
            except agent_main.CliError as e:
                raise CliError(str(e)) from None
        if a.pid is None:
            a.pid = _pick_pid(a)
            if a.pid is None:
                return 0
        _check_attach_args(a)
        return attach(a.pid, a, argv)
    except UsageError as e:
        print(f"gputop: error: {e}", file=sys.stderr)
        return 2
    except CliError as e:
        print(f"gputop: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
