"""The agent's state directory: rolling recordings per job, bounded in size and age.

Safety (the agent often runs as root next to other users' jobs): the directory is made or
accepted only as a private directory of the agent's user, every directory above it owned by root
or that user and writable by nobody else (sources/files.py ``private_dir``, lstat checks: a
symlink is refused, never followed); files are created O_CREAT|O_EXCL|O_NOFOLLOW, 0600; pruning
looks only at regular files of this user there (lstat). The agent never writes into a job's
directory: everything it writes is here (and py-spy's windows in its own runtime directory).

Rolling: a job's recording is cut into segments (``<job>-<n>-<date>.gtrec``) of at most
``segment_bytes`` or ``segment_s``; each segment is a complete recording (its own metadata, its
own end frame), so any one can be replayed or reported alone. After every new segment and every
minute, the oldest closed segments go until the directory holds at most ``keep_bytes`` and
nothing closed older than ``keep_s``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import stat
import threading
import time

from gputop.session.recording import Recorder, RecordingError, RecordingWriter
from gputop.sources.files import FilesError, private_dir

log = logging.getLogger("gputop.agent")

SUFFIX = ".gtrec"


class StateDir:
    def __init__(self, path: str, keep_bytes: int, keep_s: float) -> None:
        try:
            self.path = private_dir(path, make_parents=True)
        except FilesError as e:
            raise FilesError(f"--state-dir: {e}") from None
        self.keep_bytes = int(keep_bytes)
        self.keep_s = float(keep_s)
        # a segment is at most a quarter of the budget (so pruning has something closed to drop)
        self.segment_bytes = max(1 << 20, self.keep_bytes // 4)
        self.segment_s = max(60.0, min(3600.0, self.keep_s / 4))
        self._open: set[str] = set()
        self._lock = threading.Lock()
        self.removed = 0

    def new_path(self, job: str, n: int) -> str:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        return os.path.join(self.path, f"{job}-{n}-{stamp}{SUFFIX}")

    def opened(self, path: str) -> None:
        with self._lock:
            self._open.add(path)

    def closed(self, path: str) -> None:
        with self._lock:
            self._open.discard(path)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) of recordings in the directory."""
        files = self._files()
        return len(files), sum(size for _m, size, _p in files)

    def _files(self) -> list[tuple[float, int, str]]:
        out = []
        try:
            names = os.listdir(self.path)
        except OSError:
            return out
        me = os.geteuid()
        for name in names:
            if not name.endswith(SUFFIX):
                continue
            p = os.path.join(self.path, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_uid == me:   # never a symlink, never someone else's
                out.append((st.st_mtime, st.st_size, p))
        out.sort()
        return out

    def prune(self, now: float | None = None) -> list[str]:
        """Closed segments beyond the age limit, then the oldest closed ones beyond the size
        limit: what was removed."""
        now = time.time() if now is None else now
        files = self._files()
        total = sum(size for _m, size, _p in files)
        with self._lock:
            open_now = set(self._open)
        removed = []
        for mtime, size, p in files:   # oldest first
            if p in open_now:
                continue
            if now - mtime > self.keep_s or total > self.keep_bytes:
                try:
                    os.unlink(p)
                except OSError:
                    continue
                total -= size
                removed.append(p)
        self.removed += len(removed)
        return removed


class RollingRecorder:
    """A bus subscriber that records into the state directory, one segment after another."""

    def __init__(self, state: StateDir, job: str, meta: dict, seed=None) -> None:
        self.state, self.job, self.meta = state, job, dict(meta)
        self.seed = seed   # -> samples sent only on change (GPU facts, ranks...), for a new segment
        self.segments = 0
        self.error: str | None = None
        self._rec: Recorder | None = None
        self._opened_at = 0.0
        self._lock = threading.Lock()
        self._open_segment()

    def _open_segment(self) -> None:
        self.segments += 1
        path = self.state.new_path(self.job, self.segments)
        try:
            rec = Recorder(RecordingWriter(path, {**self.meta, "segment": self.segments}))
        except RecordingError as e:
            self.error = str(e)
            log.warning("job %s: cannot record: %s", self.job, e)
            self._rec = None
            return
        self.state.opened(path)
        rec.start()
        self._rec, self._opened_at = rec, time.monotonic()

    @property
    def path(self) -> str | None:
        rec = self._rec
        return rec.path if rec is not None else None

    def on_samples(self, samples) -> None:
        rec = self._rec
        if rec is not None:
            rec.on_samples(samples)

    def on_reset(self) -> None:
        pass

    def maybe_roll(self) -> bool:
        """On the agent's thread: a full or old segment is closed and a new one opened."""
        rec = self._rec
        if rec is None:
            return False
        young = time.monotonic() - self._opened_at < self.state.segment_s
        if rec.writer.bytes_written < self.state.segment_bytes and young:
            return False
        with self._lock:
            old = self._rec
            self._open_segment()   # samples go to the new segment from here on
            if self._rec is not None and self.seed is not None:
                try:
                    self._rec.on_samples(self.seed())
                except Exception as e:   # a segment without its facts is still a recording
                    log.warning("job %s: new segment without its start facts: %s", self.job, e)
        if old is not None:
            old.stop({"clean": True, "rolled": True})
            self.state.closed(old.path)
        self.state.prune()
        return True

    def close(self, end: dict) -> None:
        with self._lock:
            rec, self._rec = self._rec, None
        if rec is not None:
            try:
                rec.stop({"clean": True, **end})
            finally:
                self.state.closed(rec.path)
