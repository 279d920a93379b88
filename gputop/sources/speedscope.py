"""py-spy's speedscope output folded into ``stacks`` sample data: de-duplicated stacks with
counts per thread, a frame table, the samples' order as run lengths, and the source text of the
innermost line of each stack (read from /proc/PID/root, so containers work)."""

from __future__ import annotations

import os
import re
import stat
from collections import Counter, OrderedDict

MAX_STACKS_PER_THREAD = 64    # distinct stacks kept per thread and window (the rest counted)
MAX_DEPTH = 128               # frames kept per stack (the middle of deeper ones is dropped)
MAX_SOURCE_BYTES = 4 << 20    # source files read for line text at most this big
MAX_LINE_CHARS = 160

# "Process 12 Thread 34 "name"" with --subprocesses, "Thread 34 "name"" without.
_PROFILE_NAME = re.compile(r'^(?:Process (\d+) )?Thread (\S+)(?: "(.*)")?$')


class SourceLines:
    """The text of a source line, as the target sees its files (/proc/PID/root/...).
    Only read, never run; bounded in file size and in the number of files cached."""

    def __init__(self, max_files: int = 256):
        self.max_files = max_files
        self._files: OrderedDict[str, list[str] | None] = OrderedDict()

    def line(self, pid: int, path: str, lineno: int) -> str | None:
        if not path or path.startswith("<") or lineno <= 0:
            return None
        key = f"{pid}\0{path}"
        lines = self._files.get(key, False)
        if lines is False:
            lines = self._load(pid, path)
            self._files[key] = lines
            while len(self._files) > self.max_files:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(key)
        if not lines or lineno > len(lines):
            return None
        return lines[lineno - 1].strip()[:MAX_LINE_CHARS]

    @staticmethod
    def _load(pid: int, path: str) -> list[str] | None:
        """The file's lines, if it is a regular file the target's own user could read. The target
        names the file (a code object's co_filename), and gputop may run as root: a FIFO would
        block this thread for good, /dev/zero would be read until memory ran out, and
        /etc/shadow would be read into the recording."""
        try:
            owner = os.stat(f"/proc/{pid}").st_uid   # (the process's user)
        except OSError:
            return None
        mine = owner == os.geteuid()
        for candidate in (f"/proc/{pid}/root{path}" if path.startswith("/") else None, path if mine else None):
            if not candidate:
                continue
            if not mine and not _dirs_searchable(pid, path, owner):
                return None
            try:
                # (stat before open: opening a device can act on it; the descriptor is checked
                # again, so a swap between the two is refused)
                st = os.stat(candidate)
                if not _plain_readable(st, owner):
                    return None
                fd = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                got = os.fstat(fd)
                if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino) or not _plain_readable(got, owner):
                    return None
                return f.read(MAX_SOURCE_BYTES).decode("utf-8", "replace").splitlines()
        return None

    def clear(self) -> None:
        self._files.clear()


def _plain_readable(st: os.stat_result, owner: int) -> bool:
    """A regular file of at most MAX_SOURCE_BYTES that user ``owner`` can read by its mode: its
    own with the owner's read bit, or anyone's with the others' read bit (a file only its group
    can read is left unread: the target's groups are not checked). gputop's own user reads
    what it can (it runs as the target's user, or watches its own job)."""
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE_BYTES:
        return False
    if owner == os.geteuid():
        return True
    return bool(st.st_mode & stat.S_IROTH or (st.st_uid == owner and st.st_mode & stat.S_IRUSR))


def _dirs_searchable(pid: int, path: str, owner: int) -> bool:
    """Whether user ``owner`` may pass through every directory above ``path`` (absolute, as the
    process sees it) by their modes: a 0644 file inside a 0700 directory of root's
    (/root/.ssh/known_hosts) is not the target's to read."""
    parts = path.split("/")[1:-1]
    d = f"/proc/{pid}/root"
    for part in parts:
        d = f"{d}/{part}"
        try:
            st = os.stat(d)
        except OSError:
            return False
        if not (st.st_mode & stat.S_IXOTH or (st.st_uid == owner and st.st_mode & stat.S_IXUSR)):
            return False
    return True


def _is_pseudo(frame: dict) -> bool:
    """py-spy's own frames for the process and the thread (no file)."""
    name = frame.get("name") or ""
    return not frame.get("file") and (name.startswith("process ") or name.startswith("thread ("))


def run_lengths(order: list[tuple], index: dict[tuple, int]) -> list[int]:
    """The samples' stacks in time order as run lengths: [stack index, count, stack index,
    count, ...], the index into the thread's ``stacks`` (-1 for a stack that was dropped).
    py-spy samples every thread at each tick, so sample i of a window of n samples fell at
    about t0 + (i + 0.5) * dur_s / n: this is what lets the time budget join a thread's state
    with the GPU's at the moment it was in it."""
    out: list[int] = []
    for key in order:
        i = index.get(key, -1)
        if out and out[-2] == i:
            out[-1] += 1
        else:
            out += [i, 1]
    return out


def fold_speedscope(doc: dict, pid: int, lines: SourceLines | None = None) -> dict[int, dict]:
    """A py-spy speedscope document -> {pid: stacks-sample data (without t0/dur_s)}.
    ``pid``: the process py-spy was pointed at (profiles without a process are its own).

    Per process: a frame table ``frames`` ([name, file, line]), ``code`` (frame index -> the
    text of that line, for frames that are the innermost of some stack), and ``threads``:
    [{"tid", "name", "n", "stacks": [[count, [frame index, root first...]], ...], "seq", "dropped"}],
    ``seq`` being the samples' order (``run_lengths``).
    """
    shared = doc.get("shared") or {}
    sframes = shared.get("frames") or []
    pseudo = [_is_pseudo(f) if isinstance(f, dict) else True for f in sframes]
    procs: dict[int, dict] = {}
    target_pid = pid
    for prof in doc.get("profiles") or []:
        m = _PROFILE_NAME.match(str(prof.get("name", "")))
        if not m:
            continue
        pid = int(m[1]) if m[1] else target_pid
        tid_s = m[2]
        tid: int | str = int(tid_s) if tid_s.isdigit() else tid_s
        name = m[3] or ""
        p = procs.setdefault(pid, {"_index": {}, "frames": [], "code": {}, "threads": []})
        index, frames = p["_index"], p["frames"]
        folded: Counter = Counter()
        order: list[tuple] = []   # each sample's stack, in time order (for the time budget)
        n = 0
        for stack in prof.get("samples") or []:
            n += 1
            out = []
            for i in stack:
                if not isinstance(i, int) or i < 0 or i >= len(sframes) or pseudo[i]:
                    continue
                j = index.get(i)
                if j is None:
                    f = sframes[i]
                    j = index[i] = len(frames)
                    frames.append([str(f.get("name") or "?"), str(f.get("file") or ""), int(f.get("line") or 0)])
                out.append(j)
            if len(out) > MAX_DEPTH:
                half = MAX_DEPTH // 2
                out = out[:half] + out[-half:]
            key = tuple(out)
            folded[key] += 1
            order.append(key)
        stacks = folded.most_common()
        kept, dropped = stacks[:MAX_STACKS_PER_THREAD], sum(c for _, c in stacks[MAX_STACKS_PER_THREAD:])
        th = {"tid": tid, "name": name, "n": n, "stacks": [[c, list(s)] for s, c in kept],
              "seq": run_lengths(order, {s: i for i, (s, _c) in enumerate(kept)})}
        if dropped:
            th["dropped"] = dropped
        p["threads"].append(th)
        if lines is not None:
            for s, _c in kept:
                if s and str(s[-1]) not in p["code"]:
                    _n, path, line = frames[s[-1]]
                    text = lines.line(pid, path, line)
                    if text is not None:
                        p["code"][str(s[-1])] = text
    for p in procs.values():
        del p["_index"]
    return procs

