"""The probe's wire format and socket-directory rules, shared by the probe and the monitor.

Standard library only: the probe (inside the training process) and gputop's probe client
(``gputop/sources/probe_client.py``) both import this module. docs/probe.md describes it for
humans; this file is the definition.

Transport: one Unix stream socket per probed process, ``<dir>/<pid>.sock``. ``<dir>`` is
``$GPUTOP_PROBE_DIR`` if set in the target's environment, else ``/tmp/gputop-<uid>``. The
directory must be a real directory (not a symlink) owned by the process's user with no access
for group or others (0700); the probe creates it so. If it cannot be used so (another user made
it first, a symlink), the probe listens in ``fallback_dir`` (``$HOME/.cache/gputop-probe``)
instead, and says so on stderr; gputop looks in both. The socket file is 0600.

Messages: UTF-8 JSON objects, one per line (``\\n``-terminated), at most ``MAX_LINE`` bytes.
Every message has ``"type"`` and ``"mono"`` (the probe's ``time.monotonic()`` when it was sent).
The first message on a connection is ``hello`` with ``"v": WIRE_VERSION``; a monitor refuses a
different major version with one line and ignores message types and fields it does not know
(that is how the format grows without a major bump). The monitor sends nothing required; the
probe reads and discards whatever it sends, and takes EOF as "detached".
"""

from __future__ import annotations

import json
import math
import os
import stat

WIRE_VERSION = 1
MAX_LINE = 1 << 20          # a probe line is a few KiB; anything near this is not a probe
SOCKET_SUFFIX = ".sock"
ENV_DIR = "GPUTOP_PROBE_DIR"
# Longest path a sockaddr_un takes on Linux (108 bytes including the NUL).
MAX_SOCKET_PATH = 107

# Message types (probe -> monitor).
MSG_HELLO = "hello"      # who: pid, argv, rank, versions; once per connection, first
MSG_CONFIG = "config"    # settings that matter for speed; on connect and when they change
MSG_WINDOW = "window"    # one aggregation window (~1 s): steps, data wait, GPU time, syncs
MSG_MEMORY = "memory"    # CUDA caching-allocator memory, ~1 Hz while CUDA is in use
MSG_SYNCS = "syncs"      # cumulative implicit-sync counts per source line, on change, <= 0.5 Hz
MSG_NOTE = "note"        # something happened: a hook failed and was switched off, ...


class WireError(Exception):
    """A peer sent something that is not this protocol. One line for the user."""


def default_dir(uid: int) -> str:
    return f"/tmp/gputop-{uid}"


def probe_dir(env: dict | None = None, uid: int | None = None) -> str:
    """The socket directory a process with environment ``env`` and user ``uid`` uses."""
    env = os.environ if env is None else env
    return env.get(ENV_DIR) or default_dir(os.getuid() if uid is None else uid)


def fallback_dir(env: dict, uid: int) -> str | None:
    """Where the probe listens when its socket directory cannot be used safely (another user
    created ``/tmp/gputop-<uid>`` first, say): ``$HOME/.cache/gputop-probe`` of the process
    (its ``HOME``, else its user's home), which other users cannot pre-create. gputop looks
    there too."""
    home = env.get("HOME")
    if not home:
        try:
            import pwd
            home = pwd.getpwuid(uid).pw_dir
        except (KeyError, ImportError):
            return None
    return os.path.join(home, ".cache", "gputop-probe") if home and os.path.isabs(home) else None


def ensure_private_dir(path: str) -> str | None:
    """``ensure_dir`` for the fallback: its parent (``~/.cache``) is created too if missing."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    except OSError as e:
        return f"cannot create {os.path.dirname(path)}: {e.strerror}"
    return ensure_dir(path)


def socket_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}{SOCKET_SUFFIX}")


def pid_of_socket_name(name: str) -> int | None:
    if not name.endswith(SOCKET_SUFFIX):
        return None
    stem = name[: -len(SOCKET_SUFFIX)]
    return int(stem) if stem.isdigit() else None


def check_dir(path: str, uid: int) -> str | None:
    """Why ``path`` is not a safe socket directory for user ``uid``, or None if it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as e:
        return f"cannot inspect {path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link: refusing to follow it (remove it)"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (remove it)"
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not {uid}: refusing it (remove it, or set {ENV_DIR})"
    if st.st_mode & 0o077:
        return (f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others could read it or plant sockets "
                f"(chmod 700 it, or remove it)")
    return None


def ensure_dir(path: str) -> str | None:
    """Create the socket directory (0700) if missing. Returns why it cannot be used, or None."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot create {path}: {e.strerror}"
    return check_dir(path, os.getuid())


def check_socket_file(path: str, uid: int | None = None) -> str | None:
    """Why ``path`` is not a probe socket to connect to, or None. Never follows a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"cannot inspect {path}: {e.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    if uid is not None and st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not the process's uid {uid}"
    return None


def _finite(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    return v


def encode(msg: dict) -> bytes:
    """One message -> one line. NaN/inf become null (JSON has no NaN; null means "no value")."""
    try:
        text = json.dumps(msg, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:
        text = json.dumps(_finite(msg), separators=(",", ":"), allow_nan=False, default=str)
    return text.encode() + b"\n"


class _IntTooLarge(ValueError):
    pass


def _int64(text: str) -> int:
    """A JSON integer, refused past 64 bits: json.loads makes ints of any size, and float() of
    one past ~1e308 raises where the reader takes a number (a probe never sends one)."""
    if len(text) > 21:   # (a sign and 20 digits: 2**64 has 20)
        raise _IntTooLarge(text[:24])
    v = int(text)
    if not -(1 << 63) <= v < (1 << 64):
        raise _IntTooLarge(text)
    return v


class LineReader:
    """Splits a byte stream into messages. Bounded: a line longer than MAX_LINE is refused."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        out = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self._max:
                    raise WireError(f"a line longer than {self._max} bytes: not a gputop probe")
                return out
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if not line.strip():
                continue
            try:
                msg = json.loads(line, parse_int=_int64)
            except _IntTooLarge:
                raise WireError("an integer past 64 bits: not a gputop probe") from None
            except (ValueError, UnicodeDecodeError):
                raise WireError("a line that is not JSON: not a gputop probe") from None
            if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                raise WireError("a message without a type: not a gputop probe")
            out.append(msg)


# Step-time histogram: 8 buckets per octave of microseconds (bucket width ~9%), so percentiles
# over a whole run come back within ~4.5% from a few integers per window.
HIST_PER_OCTAVE = 8
MAX_HIST_BUCKET = 400   # 2**(400/8) us is 36 years: a bucket past it is damage (and its time overflows a float)


def hist_bucket(seconds: float) -> int:
    us = max(seconds * 1e6, 1.0)
    return int(math.floor(math.log2(us) * HIST_PER_OCTAVE))


def hist_value(bucket: int) -> float:
    """The geometric middle of a bucket, in seconds."""
    return 2.0 ** ((bucket + 0.5) / HIST_PER_OCTAVE) / 1e6
