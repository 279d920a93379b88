"""Files gputop creates for itself: where they go, how they are opened, when they go away.

gputop often runs as root on machines where other users can write /tmp, so a predictable path
there (``/tmp/gputop-run-<pid>.log``) is an invitation to plant a symlink or a file. Hence:

- Directories: per user, made by gputop. ``runtime_dir()`` holds short-lived working files
  (py-spy windows): ``$XDG_RUNTIME_DIR/gputop``, or ``<tmp>/gputop-<uid>-work`` (tmp: $TMPDIR, else
  /tmp) when XDG_RUNTIME_DIR is unset or not this user's private directory (``sudo -E`` keeps
  the invoking user's). ``state_dir()`` holds what outlives a session (headless recordings, the
  job logs of ``gputop run``): ``$XDG_STATE_HOME/gputop``, else ``~/.local/state/gputop``.
  A directory is used only if lstat says it is a real directory owned by this user with no
  access for group or others, and every directory above it is owned by root or this user and
  writable by nobody else (or sticky, like /tmp); otherwise ``FilesError``, one line, and
  nothing is written.
- Files: ``create_file`` opens with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600: an existing file or
  symlink is an error, never followed, appended to or read; the directories above it (a
  ``--record`` path the user chose) are checked by ``check_dir_chain``: no other user's link,
  no group- or world-writable directory unless sticky.
- Lifetime: names carry the PID of the gputop that made them, so what a crash (kill -9) left
  behind is recognised by its dead PID and removed at the next start (``clean_stale``); kept
  files (logs, recordings) are bounded by ``prune``.

Standard library only; below the session layer so that sources (py-spy windows) use it too.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import stat
import tempfile

from gputop.probe import wire

RUNTIME_NAME = "gputop"
STATE_NAME = "gputop"

_OWNED_NAME = re.compile(r"^(?P<kind>[a-z]+)-(?P<pid>\d+)-")


class FilesError(Exception):
    """A directory or file gputop would create is not safe to use. One line for the user."""


def _euid() -> int:
    return os.geteuid()


def _check_above(path: str) -> None:
    """``path`` (already resolved) and every directory above it: owned by root or us, and
    writable by nobody else unless sticky, so nobody else can swap what is below."""
    me = _euid()
    cur = path
    while True:
        try:
            st = os.lstat(cur)
        except OSError as e:
            raise FilesError(f"cannot inspect {cur}: {e.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise FilesError(f"{cur} is not a directory")
        if st.st_uid not in (0, me):
            raise FilesError(f"{cur} belongs to uid {st.st_uid}: gputop keeps its files only under "
                             f"directories of root or uid {me}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise FilesError(f"{cur} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                             f"gputop will not keep its files under it")
        parent = os.path.dirname(cur)
        if parent == cur:
            return
        cur = parent


def check_private(path: str) -> str | None:
    """Why ``path`` is not a private directory of this user, or None. Never follows a symlink."""
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
    if st.st_uid != _euid():
        return f"{path} belongs to uid {st.st_uid}, not {_euid()} (remove it)"
    if st.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): chmod 700 {path}"
    return None


_MAX_LINKS = 40   # symbolic links followed in one path (the kernel's own limit)


def resolve_dir(path: str) -> str:
    """``path``, a directory, with its symbolic links resolved one component at a time: a link
    is followed only when root or this user owns it (another user's link in /tmp, or anywhere
    above, is refused: realpath followed it and only the result was checked, so ``--state-dir
    /tmp/astate/rec`` wrote where the link's owner chose). Raises FilesError."""
    me, links = _euid(), 0
    # (no abspath: it folds "a/link/.." to "a" as text, where the kernel goes to the link's
    # target's parent; ".." is applied below, after each link is followed)
    full = path if path.startswith("/") else os.path.join(os.getcwd(), path)
    todo = [p for p in full.split("/") if p]
    done = "/"
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        cur = os.path.join(done, name)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise FilesError(f"{cur} does not exist") from None
        except OSError as e:
            raise FilesError(f"cannot inspect {cur}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, me):
                raise FilesError(f"{cur} is a symbolic link owned by uid {st.st_uid}: gputop follows only links "
                                 f"of root or uid {me}")
            links += 1
            if links > _MAX_LINKS:
                raise FilesError(f"{path}: too many symbolic links")
            target = os.readlink(cur)
            if target.startswith("/"):
                done = "/"
            todo = [p for p in target.split("/") if p] + todo
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise FilesError(f"{cur} is not a directory")
        done = cur
    return done


def check_dir_chain(path: str) -> str:
    """The directory that a file the user named (``--record``) goes into, checked: no link of
    another user at any level (``resolve_dir``), and no directory above it writable by group
    (unless the group is this user's own private one) or others, unless sticky (/tmp). A
    directory owned by another user is accepted (root recording into a user's project
    directory): its owner could rename what is in it, but every link on the way was checked
    and the file is created O_EXCL|O_NOFOLLOW. Returns it resolved; raises FilesError."""
    real = resolve_dir(path)
    cur = real
    while True:
        st = os.lstat(cur)
        if (st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _private_group(st))) \
                and not st.st_mode & stat.S_ISVTX:
            raise FilesError(f"{cur} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): gputop will "
                             f"not write a file under it")
        parent = os.path.dirname(cur)
        if parent == cur:
            return real
        cur = parent


def private_dir(path: str, make_parents: bool = False) -> str:
    """Make (or accept) ``path`` as a private directory of this user; return its path with the
    directories above it resolved. Raises FilesError."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if make_parents:
        _make_parents(parent)
    parent = resolve_dir(parent)
    _check_above(parent)
    path = os.path.join(parent, os.path.basename(path))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise FilesError(f"cannot create {path}: {e.strerror}") from None
    why = check_private(path)
    if why is not None:
        raise FilesError(why)
    return path


def runtime_dir() -> str:
    """Short-lived working files (see the module docstring)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg) and check_private(xdg) is None:
        try:
            return private_dir(os.path.join(xdg, RUNTIME_NAME))
        except FilesError:
            pass  # e.g. a path above it is not ours: fall back to the temp directory
    tmp = os.environ.get("TMPDIR", "")
    if not (os.path.isabs(tmp) and os.path.isdir(tmp)):
        tmp = tempfile.gettempdir()  # (cached by tempfile: read TMPDIR first, it may have changed)
    return private_dir(os.path.join(tmp, f"gputop-{_euid()}-work"))


def _make_parents(path: str) -> None:
    """``os.makedirs`` of ``path``, 0700, each existing component checked first (resolve_dir) so
    that no directory is made through another user's link."""
    missing = []
    cur = path
    while not os.path.lexists(cur):
        missing.append(cur)
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    base = resolve_dir(cur)
    for d in reversed(missing):
        base = os.path.join(base, os.path.basename(d))
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            base = resolve_dir(base)
        except OSError as e:
            raise FilesError(f"cannot create {base}: {e.strerror}") from None


def _own_dir(path: str) -> bool:
    """``path`` is (or would be made under) this user's own: it, or its nearest existing
    ancestor, resolved (links only of root or this user: ``resolve_dir``), is owned by this user."""
    cur = path
    while not os.path.lexists(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            return False
        cur = parent
    try:
        return os.lstat(resolve_dir(cur)).st_uid == _euid()
    except (FilesError, OSError):
        return False


def _private_group(st: os.stat_result) -> bool:
    """A directory of this user whose group is this user's own private group (Fedora/RHEL make one
    per user, umask 002): its group-write bit lets nobody else in."""
    if st.st_uid != _euid():
        return False
    try:
        import grp
        import pwd

        me = pwd.getpwuid(_euid())
        g = grp.getgrgid(st.st_gid)
    except (ImportError, KeyError):
        return False
    return g.gr_gid == me.pw_gid and g.gr_name == me.pw_name and not [m for m in g.gr_mem if m != me.pw_name]


def home_dir() -> str:
    """This user's home: $HOME when it is this user's own, else the password database's (a
    ``sudo`` that keeps another user's HOME must not put root's files there)."""
    home = os.environ.get("HOME", "")
    if os.path.isabs(home) and _own_dir(home):
        return home
    try:
        import pwd

        return pwd.getpwuid(_euid()).pw_dir
    except (ImportError, KeyError):
        return home or "/"


def state_base() -> str:
    """Where state_dir() lives, without creating anything (for --help and messages):
    $XDG_STATE_HOME/gputop when that directory is this user's own, else ~/.local/state/gputop."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg) and _own_dir(xdg):
        base = xdg
    else:
        base = os.path.join(home_dir(), ".local", "state")
    return os.path.join(base, STATE_NAME)


def state_dir(sub: str | None = None) -> str:
    """Files that outlive a session (see the module docstring); ``sub``: a directory in it."""
    top = private_dir(state_base(), make_parents=True)
    return private_dir(os.path.join(top, sub)) if sub else top


def owned_name(kind: str, suffix: str = "", pid: int | None = None) -> str:
    """``<kind>-<pid>-<date-time><suffix>``: the PID marks whose it is (clean_stale)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{os.getpid() if pid is None else pid}-{stamp}{suffix}"


def create_file(path: str, flags: int = os.O_WRONLY) -> int:
    """A new file, 0600, never an existing file or a symlink (its directory checked by
    check_dir_chain: no other user's link or writable directory above it): its descriptor.
    FilesError."""
    path = os.path.join(check_dir_chain(os.path.dirname(path) or "."), os.path.basename(path))
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise FilesError(f"{path} already exists: refusing to reuse it") from None
    except OSError as e:
        raise FilesError(f"cannot create {path}: {e.strerror}") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, someone else's
    return True


def clean_stale(directory: str, kind: str) -> list[str]:
    """Remove ``<kind>-<pid>-...`` entries of ``directory`` whose gputop (pid) is gone and that
    belong to us; what was removed. A symlink is removed, never followed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _OWNED_NAME.match(name)
        if m is None or m["kind"] != kind or _alive(int(m["pid"])):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
            if st.st_uid != _euid():
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)  # fd-based on Linux: does not follow symlinks inside
            else:
                os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def private_tempdir(kind: str) -> str:
    """A fresh 0700 directory for this process in runtime_dir(), after removing those of dead
    gputops; the caller removes it (shutil.rmtree) when done."""
    base = runtime_dir()
    clean_stale(base, kind)
    return tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=base)


def prune(directory: str, suffix: str, keep: int, max_bytes: int | None = None) -> list[str]:
    """Remove the oldest regular files ending in ``suffix`` that are ours, beyond the newest
    ``keep`` or beyond ``max_bytes`` in all; what was removed."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not name.endswith(suffix):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == _euid():
            found.append((st.st_mtime, name, st.st_size, path))
    found.sort(reverse=True)
    removed, total = [], 0
    for i, (_mtime, _name, size, path) in enumerate(found):
        total += size
        if i >= keep or (max_bytes is not None and total > max_bytes):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def remove_dead_probe_sockets(directory: str) -> list[str]:
    """Sockets of probes whose process is gone (a job stopped with SIGTERM skips its atexit),
    in a probe directory that is ours: what was removed."""
    if wire.check_dir(directory, os.getuid()) is not None:
        return []
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        pid = wire.pid_of_socket_name(name)
        if pid is None or _alive(pid):
            continue
        path = os.path.join(directory, name)
        if wire.check_socket_file(path, os.getuid()) is None:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed
