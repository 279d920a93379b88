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
