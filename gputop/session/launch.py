"""Start a command with gputop's in-process probe loaded (``gputop run -- cmd``, ``gputop demo``).

How: ``gputop/probe/boot`` goes first on ``PYTHONPATH``; its ``sitecustomize.py`` loads the
probe in every Python process of the command and then runs any ``sitecustomize`` the
environment already had. The first Python process (the script, or ``torchrun`` itself) listens
at once; Python processes it starts (ranks, DataLoader workers) only once they step an optimizer,
so ``torchrun`` gives one probe per rank and DataLoader workers none. A non-Python command runs
unchanged (nothing reads PYTHONPATH); so does ``python -I``/``-E``/``-S`` (they skip it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Mapping

import gputop.probe.boot as _boot

BOOT_DIR = os.path.dirname(os.path.abspath(_boot.__file__))
# The directory that holds the ``gputop`` package: the boot code imports the probe from there,
# so a command running another Python environment still gets this gputop's probe.
PACKAGE_HOME = os.path.dirname(os.path.dirname(os.path.dirname(BOOT_DIR)))  # .../gputop/probe/boot -> ...


class LaunchError(Exception):
    """The command cannot be started. The message is one line for the user."""


class CommandNotFound(LaunchError, FileNotFoundError):
    """No such program (also a FileNotFoundError, as subprocess would raise)."""


class CommandNotExecutable(LaunchError, PermissionError):
    """The program cannot be executed (also a PermissionError, as subprocess would raise)."""


def probe_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that loads the probe: ``env`` (default: this process's) plus
    PYTHONPATH (boot directory first, then what was there), GPUTOP_PROBE_HOME; and without
    GPUTOP_PROBE_ROOT, so the command's first Python process becomes the listening one."""
    out = dict(os.environ if env is None else env)
    old = out.get("PYTHONPATH", "")
    parts = [p for p in old.split(os.pathsep) if p and os.path.abspath(p) != BOOT_DIR]
    out["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *parts])
    out["GPUTOP_PROBE_HOME"] = PACKAGE_HOME
    out.pop("GPUTOP_PROBE_ROOT", None)
    out.pop("GPUTOP_PROBE_OFF", None)
    return out


def launch_with_probe(argv: list[str], env: Mapping[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
    """Start ``argv`` (e.g. ``["python", "train.py", "--lr", "3e-4"]`` or
    ``["torchrun", "--nproc-per-node", "8", "train.py"]``) with the probe loaded.

    ``env``: the command's environment (default: this process's); the probe variables are
    added to a copy. ``popen_kwargs`` go to ``subprocess.Popen`` unchanged (``stdout``,
    ``stderr``, ``cwd``, ``start_new_session``...). Returns the Popen; its ``pid`` is the target
    to watch (a ``ProbeClientSource`` on ``Target(pid)`` finds the probes of the whole tree).

    Raises ``LaunchError`` (one line) if the command is empty or cannot be started; a missing
    program is also a ``FileNotFoundError``, a non-executable one also a ``PermissionError``.
    """
    argv = [str(a) for a in argv]
    if not argv:
        raise LaunchError("no command given: use `gputop run -- python train.py ...`")
    full_env = probe_env(env)
    exe = argv[0]
    if os.sep not in exe and shutil.which(exe, path=full_env.get("PATH")) is None:
        raise CommandNotFound(f"command not found: {exe} (check the name, or give its full path)")
    try:
        return subprocess.Popen(argv, env=full_env, **popen_kwargs)
    except FileNotFoundError:
        raise CommandNotFound(f"command not found: {exe}") from None
    except PermissionError:
        raise CommandNotExecutable(f"cannot execute {exe}: permission denied") from None
    except OSError as e:
        raise LaunchError(f"cannot start {exe}: {e.strerror or e}") from None


STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL this long after (run --help promises 5 s)


def start_job(argv: list[str], *, with_probe: bool, log_fd: int | None, stdout_to_stderr: bool,
              stop_with_parent: bool) -> subprocess.Popen:
    """Start the command of ``gputop run`` / ``gputop demo`` (``run --help`` promises this):

    - Always in a session (and so a process group) of its own, whose ID is the job's PID: gputop
      (``stop_job``), or the user with ``kill -TERM -PGID``, stops the job with all it started
      (torchrun's ranks, DataLoader workers, a shell script's children), none left orphaned.
    - ``log_fd`` (the UI owns the terminal): stdin is /dev/null, stdout and stderr go to the log;
      a closing terminal does not reach the job.
    - no ``log_fd`` (headless): stdin, stdout and stderr are gputop's, unchanged (stdout goes to
      stderr with ``stdout_to_stderr``, so --json's stdout is the report alone). The terminal's
      Ctrl-C and hang-up reach gputop's process group only: gputop passes them on
      (``forward_signal``), so they reach the job as they would reach it started directly.
    - ``stop_with_parent``: the job gets SIGTERM when gputop dies, even of SIGKILL (Linux).
      Without it the job outlives a gputop killed with -9.

    Raises LaunchError (and its FileNotFoundError/PermissionError kinds) or OSError."""
    from gputop.sources.target import dies_with_parent

    kw: dict = {"start_new_session": True}
    if log_fd is not None:
        kw.update(stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd)
    elif stdout_to_stderr:
        kw.update(stdout=2)
    if stop_with_parent:
        kw.update(preexec_fn=dies_with_parent(signal.SIGTERM))
    child = launch_with_probe(argv, **kw) if with_probe else subprocess.Popen(argv, **kw)
    child.leads_group = True  # (its group outlives it while a straggler runs: known even once it is reaped)
    return child


def job_group(child: subprocess.Popen) -> int | None:
    """The process group the job leads (its PID), or None (it shares another's, or is gone)."""
    if getattr(child, "leads_group", False):
        return child.pid
    try:
        return child.pid if os.getpgid(child.pid) == child.pid else None
    except ProcessLookupError:
        return None


def _signal_group(child: subprocess.Popen, group: int | None, sig: int) -> None:
    try:
        if group is not None:
            os.killpg(group, sig)
        elif child.returncode is None:
            child.send_signal(sig)  # it shares another's group: only the job itself
    except (ProcessLookupError, PermissionError):
        pass


def forward_signal(child: subprocess.Popen, sig: int) -> None:
    """Pass a signal gputop got (the terminal's Ctrl-C, a hang-up) on to the job's process group.
    Safe in a signal handler: no wait, no lock."""
    _signal_group(child, job_group(child), sig)


def stop_job(child: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int | None:
    """Stop a job with everything it started (its process group: torchrun's workers, a shell
    script's children), SIGTERM then SIGKILL after ``grace_s``; stragglers of the group that
    outlive the job itself get SIGKILL too, so nothing of it writes after this returns.

    Returns the signal that ended the job (SIGTERM or SIGKILL), or None if it had already
    ended before (then only its stragglers, if any, were stopped)."""
    group = job_group(child)
    running = child.poll() is None
    _signal_group(child, group, signal.SIGTERM)
    ended_by = signal.SIGTERM if running else None
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(child, group, signal.SIGKILL)
        child.wait()
        ended_by = signal.SIGKILL
    if group is not None:
        _signal_group(child, group, signal.SIGKILL)  # stragglers that ignored SIGTERM
    return ended_by
