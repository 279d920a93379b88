"""The node agent: finds every training job on the node, watches each, serves one /metrics.

Its loop (one thread, every ``scan_s``): discover (agent/discover.py), start a ``Job`` (a headless
live session at the agent's rates, agent/job.py) for each new one up to ``max_jobs``, stop and
forget the jobs whose process ended ``linger_s`` ago (long enough for a scrape to see
``gputop_target_running 0``), roll and prune recordings (agent/state.py). Each step of each job
is inside its own try: whatever one target does (vanish mid-start, deny us, break a source) is
logged once and costs only that job. A process that failed to start is not retried (it is known
by PID and start time, so a new process with a recycled PID is).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time

from gputop.agent.discover import Discovery, Found
from gputop.agent.job import Job, Rates

log = logging.getLogger("gputop.agent")

DEFAULT_MAX_JOBS = 16
DEFAULT_SCAN_S = 5.0
DEFAULT_LINGER_S = 15.0
PRUNE_EVERY_S = 60.0
MAPPING_EVERY_S = 30.0
FOUND_WORDS = {"gpu": "on a GPU", "probe": "with a gputop probe", "launcher": "a torch launcher",
               "launched": "a SLURM task", "match": "matched by --match"}
NAMED_OTHERS = 3    # Python processes named when none is a job


class Agent:
    def __init__(self, *, match: str | None = None, only_match: bool = False, max_jobs: int = DEFAULT_MAX_JOBS,
                 scan_s: float = DEFAULT_SCAN_S,
                 linger_s: float = DEFAULT_LINGER_S, rates: Rates | None = None, state=None,
                 host_proc: str | None = None, argv: list[str] | None = None) -> None:
        self.host = socket.gethostname()
        self.max_jobs = max(1, int(max_jobs))
        self.scan_s, self.linger_s = float(scan_s), float(linger_s)
        self.rates = rates or Rates()
        self.state = state
        self.host_proc = host_proc
        self.argv = list(argv or [])
        self.pid_mapping = "unavailable"   # until NVML lists a process
        self.nvml_note: str | None = None  # why NVML lists no GPU process (no driver, ...), or None
        self._said_found: int | None = None   # how many jobs the last "found" line said
        self._gpu_pids: set[int] = set()
        self._mapping_at = -1e9
        self.discovery = Discovery(match=match, gpu_pids=self._gpu_users, only_match=only_match)
        self._jobs: dict[tuple[int, int], Job] = {}
        self._refused: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prune_at = 0.0
        self.stats = {"started": 0, "ended": 0, "failed": 0, "over_cap": 0, "scans": 0}

    # -- what the collector reads ------------------------------------------------------------
    def jobs_snapshot(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    # -- GPU processes (NVML), mapped into our PID namespace ---------------------------------
    def _gpu_users(self) -> set[int]:
        now = time.monotonic()
        if now - self._mapping_at < MAPPING_EVERY_S and self.stats["scans"] > 1:
            return self._gpu_pids
        self._mapping_at = now
        try:
            from gputop.sources.candidates import _nvml_processes
            from gputop.sources.pid_namespace import map_pids

            raw, note = _nvml_processes()
            self.nvml_note = note
            if not raw:
                return set()
            m = map_pids({p: (mem, set(g)) for p, (mem, g) in raw.items()}, host_proc=self.host_proc)
            if m.method != self.pid_mapping:
                log.info("%s", m.describe())
            self.pid_mapping = m.method
            self._gpu_pids = {v for v in m.visible.values() if v is not None}
        except Exception as e:
            log.warning("NVML's process list failed: %s: %s", type(e).__name__, e)
        return self._gpu_pids

    # -- the loop ----------------------------------------------------------------------------
    def start(self) -> None:
        log.info("looking for jobs every %g s: %s", self.scan_s, self.discovery.criteria())
        self._thread = threading.Thread(target=self._loop, name="gputop-agent", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as e:   # a bug of the loop itself: said, and the loop goes on
                log.exception("agent step failed: %s", e)
            self._stop.wait(self.scan_s)

    def step(self) -> None:
        self.stats["scans"] += 1
        found = self.discovery.scan()
        self._say_found(found)
        now = time.monotonic()
        live = {f.ident for f in found}
        self._refused &= live
        self._retire(now)
        over = 0
        for f in found:
            if f.ident in self._jobs or f.ident in self._refused:
                continue
            if len(self._jobs) >= self.max_jobs:
                over += 1
                continue
            self._start(f)
        if over and over != self.stats["over_cap"]:
            log.warning("%d job(s) not watched: the agent watches %d already (--max-jobs)", over, self.max_jobs)
        self.stats["over_cap"] = over
        for job in self.jobs_snapshot():
            if job.recorder is not None:
                try:
                    job.recorder.maybe_roll()
                except Exception as e:
                    log.warning("job %s: rolling its recording failed: %s", job.label, e)
        if self.state is not None and now - self._prune_at >= PRUNE_EVERY_S:
            self._prune_at = now
            self.state.prune()

    # -- what it found, said when the count changes (stderr) -----------------------------------
    def _say_found(self, found: list[Found]) -> None:
        if len(found) == self._said_found:
            return
        self._said_found = len(found)
        if found:
            by: dict[str, int] = {}
            for f in found:
                by[f.why] = by.get(f.why, 0) + 1
            how = ", ".join(f"{n} {FOUND_WORDS.get(w, w)}" for w, n in sorted(by.items(), key=lambda kv: -kv[1]))
            log.info("found %d job%s (%s)", len(found), "" if len(found) == 1 else "s", how)
        else:
            log.info("%s", self.nothing_found())

    def nothing_found(self) -> str:
        """The line for a scan that found no job: what was looked for is in the start's line; this
        one says what is here instead, and how to name a job the rules miss (--match)."""
        d = self.discovery
        if d.only_match:
            out = f"found no job: no process's command line matches '{d.match.pattern}'"
        else:
            out = "found no job: no Python process on a GPU, with a gputop probe, under a torch launcher or SLURM"
            if self.nvml_note:
                out += f" (GPU contexts unknown: {self.nvml_note})"
        others = d.others
        if not others:
            return out + ("; no other Python process is running here; "
                          "--match REGEX watches any process by its command line")
        named = "; ".join(f"PID {f.pid}: {_cut(f.command, 80)}" for f in others[:NAMED_OTHERS])
        more = f"; and {len(others) - NAMED_OTHERS} more" if len(others) > NAMED_OTHERS else ""
        n = len(others)
        what = f"{n} Python process{'es' if n > 1 else ''} here {'are' if n > 1 else 'is'}"
        out += f"; {what} no job ({named}{more})"
        if d.only_match:
            return out
        return out + f": to watch one, add --match REGEX (its command line), e.g. --match {match_example(others[0])}"

    def _start(self, f: Found) -> None:
        try:
            job = Job(f, self.rates, self.state, self.argv)
        except Exception as e:
            self._refused.add(f.ident)
            self.stats["failed"] += 1
            log.warning("not watching PID %d (%s): %s", f.pid, f.command[:80], e)
            return
        with self._lock:
            self._jobs[f.ident] = job
        self.stats["started"] += 1
        log.info("watching job %s (PID %d, found by %s): %s", job.label, f.pid, f.why, f.command[:120])

    def _retire(self, now: float) -> None:
        for ident, job in list(self._jobs.items()):
            if job.ended_at is None and not job.alive():
                job.ended_at = now
            if job.ended_at is not None and now - job.ended_at >= self.linger_s:
                with self._lock:
                    self._jobs.pop(ident, None)
                    # counted as it leaves the job list: a reader that sees it gone sees it counted
                    # (its sources' stop below can take a second on a busy machine)
                    self.stats["ended"] += 1
                job.stop()
                log.info("job %s ended: forgotten", job.label)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            job.stop()


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def match_example(f: Found) -> str:
    """A --match for this process, shell-quoted: its script's name, else its command line's start."""
    words = f.command.split()
    script = next((w for w in words[1:] if w.endswith(".py")), None)
    if script is None and len(words) > 2 and words[1] == "-m":
        script = words[2]
    word = script.rsplit("/", 1)[-1] if script else " ".join(words[:2])
    return "'" + re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", word[:60]).replace("'", "'\\''") + "'"
