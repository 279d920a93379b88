"""The monitor side of the in-process probe: finds the probes of the target's process tree,
connects to their Unix sockets and turns their messages into samples.

Kinds (docs/metrics.md, "In-process probe", lists every field):

| kind | key | when |
|---|---|---|
| ``probe_step`` | PID of the probed process | one per probe window (~1 s): steps, step time, data wait, GPU time, syncs |
| ``probe_config`` | PID | on attach and when a setting changes: versions, AMP, TF32, compile, DataLoader settings, hooks |
| ``probe_memory`` | PID | ~1 Hz while the job uses CUDA: allocator memory |
| ``probe_sync`` | PID | on change, <= 0.5 Hz: implicit syncs per source line since the probe loaded |
| ``health`` | ``probe`` | on change and every 5 s: found or not, and how to enable it |
| ``event`` | ``probe`` | a probe attached or detached, a hook failed |

Time: the probe stamps messages with its own ``time.monotonic()``. Per connection we keep
``offset = min over messages of (session time at receipt - probe time at send)`` and place
every probe time ``x`` at ``x + offset``. The minimum is the message that waited least in the
socket, so the error is that message's delivery time (well under a millisecond on one machine),
and it also holds where the two processes' monotonic clocks differ (a container's time namespace).

Nothing read from a socket is executed: JSON only, every line bounded (``MAX_MESSAGE_BYTES``),
every number checked, every string clipped. A peer that is not a probe is dropped with one line.

What one probe can cost gputop is bounded too (issue 13: whoever runs the watched job can put
anything on that socket, and gputop may run as root): bytes read per second (beyond
``READ_BYTES_PER_S`` gputop stops reading that socket for a while, so a flood costs its sender,
not gputop's CPU or memory), messages and samples per second (token buckets; the excess is
dropped), and time order (a sample's time is clamped to the last ``MAX_LAG_S`` seconds, never
later than now, and one earlier than the previous of its kind is dropped, so the store never
re-sorts). The ``probe`` health says what was dropped, per PID.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time

import psutil

from gputop.catalogue import KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_STEP, KIND_PROBE_SYNC, SOURCE_PROBE
from gputop.model import KIND_EVENT, KIND_HEALTH, Sample, health_data
from gputop.probe import wire
from gputop.sources import ranks as _ranks
from gputop.sources.base import HEALTH_EVERY_S, Heartbeat, ThreadedSource
from gputop.sources.probe_limits import (DROPS_RECENT_S, MAX_LAG_S, MAX_MESSAGE_BYTES, MESSAGE_BURST, MESSAGES_PER_S,
                                         READ_BURST_BYTES, READ_BYTES_PER_S, SAMPLE_BURST, SAMPLES_PER_S, Bucket, Drops)
from gputop.sources.probe_fields import MEMORY_FIELDS
from gputop.sources.probe_messages import MAX_STR, _clean, _int, _num, _str, step_data

PROBE_KINDS = (KIND_PROBE_STEP, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_SYNC)

SOURCE_NAME = SOURCE_PROBE
RANK_END_WAIT_S = 30.0   # a probed rank whose probe detached but whose process lives on: ended after this

WHAT_IT_ADDS = ("the probe adds step time split into data wait / GPU time / other host time, steps, batches and "
                "samples per second, implicit device syncs per step with the line that caused them, and the "
                "DataLoader and speed settings")
HOW_TO_ENABLE = ("start the job with `gputop run -- python train.py ...`, or add "
                 "`import gputop.probe; gputop.probe.install()` to the training script")


def _env_names_rank(pid: int) -> bool | None:
    """Whether the process's environment names a rank, read as the host source reads it
    (ranks.read_environ); False where it cannot be read, None where not yet (mid-exec)."""
    try:
        return _ranks.rank_env(_ranks.read_environ(pid)) is not None
    except _ranks.EnvironNotReady:
        return None
    except OSError:
        return False


class _ProbeConn:
    def __init__(self, pid: int, sock: socket.socket, path: str) -> None:
        self.pid = pid
        self.sock = sock
        self.path = path
        self.reader = wire.LineReader(MAX_MESSAGE_BYTES)
        now = time.monotonic()
        self.read_budget = Bucket(READ_BYTES_PER_S, READ_BURST_BYTES, now)
        self.msg_budget = Bucket(MESSAGES_PER_S, MESSAGE_BURST, now)
        self.sample_budget = Bucket(SAMPLES_PER_S, SAMPLE_BURST, now)
        self.paused_until: float | None = None     # not read until then (over its byte budget)
        self.last_t: dict[str, float] = {}         # kind -> time of the last sample published
        self.hello: dict | None = None
        self.offset: float | None = None
        self.rank: int | None = None
        self.env_rank: bool | None = None   # its environment names a rank (read once connected)
        self.torch: str | None = None
        self.hooks: dict = {}
        self.last_window: float | None = None
        self.last_cpu: tuple[float, float] | None = None  # (probe thread CPU s, t1)
        self.last_amp: dict | None = None  # GradScaler totals of the last window (probe_messages.amp_data)


# Message types that become samples (or events): each takes one from the probe's sample budget.
_SAMPLE_TYPES = frozenset({wire.MSG_WINDOW, wire.MSG_CONFIG, wire.MSG_MEMORY, wire.MSG_SYNCS, wire.MSG_NOTE})


class ProbeClientSource(ThreadedSource):
    """A Source (gputop.model.Source): ``ProbeClientSource(clock, target)``.

    ``clock`` has ``now()`` (session seconds); ``target`` is a gputop.sources.target.Target.
    ``probe_dirs``: extra socket directories to look in (tests); the target's own
    ``GPUTOP_PROBE_DIR`` (read from its environment) and ``/tmp/gputop-<uid>`` are always tried.
    """

    name = SOURCE_NAME
    thread_name = "gputop-probe-client"

    def __init__(self, clock, target, probe_dirs: list[str] | None = None, scan_interval_s: float = 1.0) -> None:
        self.clock = clock
        self.target = target
        self.extra_dirs = list(probe_dirs or [])
        self.scan_interval_s = scan_interval_s
        self._init_thread()
        self._lock = threading.Lock()
        self._conns: dict[int, _ProbeConn] = {}
        self._seen: dict[int, dict] = {}          # pid -> facts from hello (kept after detach)
        self._bad: dict[int, str] = {}            # pid -> why its socket was dropped
        self._dirs_of: dict[int, tuple[int, list[str]]] = {}
        self._dir_problems: dict[str, str] = {}
        self._stale: set[str] = set()
        self._hook_problems: dict[int, str] = {}
        self._detached: set[int] = set()
        self._drops: dict[int, Drops] = {}       # pid -> what was refused from its probe
        self._closed_early: dict[int, str] = {}   # pid -> socket that closed before its hello
        self._heartbeat = Heartbeat(HEALTH_EVERY_S, at=0.0)
        self._scans = 0
        # Ranks the probe reports, for processes whose environment names none (or cannot be
        # read): those get ``rank`` samples from here (source "probe"); the host source
        # publishes the others (gputop/sources/ranks.py).
        self._env_rank: dict[int, bool] = {}      # pid -> its environment names a rank
        self._rank_said: dict[int, dict] = {}
        self._rank_said_at: dict[int, float] = {}
        self._rank_ending: dict[int, float] = {}  # pid -> when its probe detached
        self._node = _ranks.node_name()

    # -- Source protocol ----------------------------------------------------------------------
    def stop(self) -> None:
        self._stop_thread(timeout=3.0)
        with self._lock:
            for c in self._conns.values():
                try:
                    c.sock.close()
                except OSError:
                    pass
            self._conns.clear()

    def describe(self) -> dict:
        with self._lock:
            probes = {str(pid): dict(info) for pid, info in self._seen.items()}
            return {"wire_version": wire.WIRE_VERSION, "scan_interval_s": self.scan_interval_s,
                    "time": "probe monotonic + clock_offset_s = session seconds", "probes": probes}

    def connected_pids(self) -> list[int]:
        with self._lock:
            return sorted(pid for pid, c in self._conns.items() if c.hello is not None)

    # -- thread -------------------------------------------------------------------------------
    def _main(self) -> None:
        sel = selectors.DefaultSelector()
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_scan:
                    try:
                        self._scan(sel)
                    except Exception as e:  # a machine problem must not kill the source
                        self._publish(KIND_EVENT, SOURCE_NAME, {"message": f"probe scan failed: {type(e).__name__}: {e}", "level": "warn"})
                    next_scan = now + self.scan_interval_s
                    self._maybe_health()
                self._resume_paused(sel)
                if not sel.get_map():
                    # no probe connected: nothing to read or resume until the next scan (stop()
                    # sets the event), one wake-up a scan, not five a second, for the common job
                    # without the probe; a connection paused over its byte budget resumes soon
                    wait = next_scan - time.monotonic()
                    if self._conns:
                        wait = min(wait, 0.2)
                    self._stop.wait(max(0.0, wait))
                    continue
                for key, _ in sel.select(timeout=max(0.0, min(0.2, next_scan - time.monotonic()))):
                    self._read(sel, key.data)
        finally:
            sel.close()

    def _dirs_for(self, proc: psutil.Process) -> tuple[int | None, list[str]]:
        got = self._dirs_of.get(proc.pid)
        if got is not None:
            return got
        try:
            uid = proc.uids().real
        except psutil.Error:
            return None, []
        dirs: list[str] = []
        env: dict = {}
        mid_exec = False
        try:
            env = proc.environ()
            env_dir = env.get(wire.ENV_DIR)
            mid_exec = not env   # (ranks.EnvironNotReady): not cached, read again at the next scan
            if not mid_exec:
                self._env_rank[proc.pid] = _ranks.rank_env(env) is not None
        except (psutil.Error, OSError):
            env_dir = None
        if env_dir:
            dirs.append(env_dir)
        # the probe's fallback when its directory was not safe to use (wire.fallback_dir)
        for d in (*self.extra_dirs, wire.default_dir(uid), wire.fallback_dir(env, uid)):
            if d and d not in dirs:
                dirs.append(d)
        if not mid_exec:
            self._dirs_of[proc.pid] = (uid, dirs)
        return uid, dirs

    def _scan(self, sel) -> None:
        self._scans += 1
        self._end_ranks()
        try:
            procs = self.target.tree()
        except Exception:
            procs = []
        live = {p.pid for p in procs}
        for pid in [p for p in self._dirs_of if p not in live]:
            del self._dirs_of[pid]
            self._env_rank.pop(pid, None)
        for proc in procs:
            pid = proc.pid
            if pid in self._conns or pid in self._bad:
                continue
            uid, dirs = self._dirs_for(proc)
            if uid is None:
                continue
            for d in dirs:
                problem = wire.check_dir(d, uid)
                if problem is not None:
                    if os.path.lexists(d):
                        self._dir_problems[d] = problem
                    continue
                self._dir_problems.pop(d, None)
                path = wire.socket_path(d, pid)
                bad = wire.check_socket_file(path, uid)
                if bad == "missing":
                    continue
                if bad is not None:
                    self._dir_problems[path] = bad
                    continue
                if self._connect(sel, pid, path):
                    break

    def _connect(self, sel, pid: int, path: str) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(0.5)
        try:
            s.connect(path)
        except OSError:
            s.close()
            self._stale.add(path)  # left by a process killed before it could remove it
            return False
        self._stale.discard(path)
        s.setblocking(False)
        c = _ProbeConn(pid, s, path)
        with self._lock:
            self._conns[pid] = c
        sel.register(s, selectors.EVENT_READ, c)
        return True

    def _read(self, sel, c: _ProbeConn) -> None:
        now = time.monotonic()
        budget = int(c.read_budget.refill(now))
        if budget < 4096:
            self._pause(sel, c, now)
            return
        try:
            data = c.sock.recv(min(1 << 16, budget))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._detach(sel, c, None)
            return
        c.read_budget.tokens -= len(data)
        try:
            msgs = c.reader.feed(data)
            for msg in msgs:
                if c.hello is not None and not c.msg_budget.take(1, now):
                    self._dropped(c, "rate")
                    continue
                self._handle(c, msg)
        except wire.WireError as e:
            self._detach(sel, c, f"PID {c.pid} ({c.path}): {e}")
        except Exception as e:   # (a message no check foresaw costs its connection, not the source's thread)
            # (worded for both causes: a probe's odd message, or a bug of gputop's own while it
            # handled one -- its samples' subscribers run on this thread too)
            self._detach(sel, c, f"PID {c.pid} ({c.path}): gputop failed to handle one of its messages "
                                 f"({type(e).__name__}: {str(e)[:120]}): stopped reading this probe")

    def _pause(self, sel, c: _ProbeConn, now: float) -> None:
        """Over its byte budget: leave the socket unread until the budget holds 64 KiB again
        (the probe's own queue then fills and drops its oldest messages, as for a slow monitor)."""
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            return
        c.paused_until = now + max(0.05, ((1 << 16) - c.read_budget.tokens) / READ_BYTES_PER_S)
        self._drops_of(c.pid).paused += 1

    def _resume_paused(self, sel) -> None:
        now = time.monotonic()
        for c in list(self._conns.values()):
            if c.paused_until is not None and now >= c.paused_until:
                c.paused_until = None
                try:
                    sel.register(c.sock, selectors.EVENT_READ, c)
                except (KeyError, ValueError, OSError):
                    pass

    def _drops_of(self, pid: int) -> Drops:
        d = self._drops.get(pid)
        if d is None:
            d = self._drops[pid] = Drops()
        return d

    def _dropped(self, c: _ProbeConn, why: str) -> None:
        d = self._drops_of(c.pid)
        setattr(d, why, getattr(d, why) + 1)
        d.at = time.monotonic()

    def _detach(self, sel, c: _ProbeConn, problem: str | None) -> None:
        try:
            sel.unregister(c.sock)
        except Exception:
            pass
        try:
            c.sock.close()
        except OSError:
            pass
        with self._lock:
            self._conns.pop(c.pid, None)
        if problem is None and c.hello is None:
            self._closed_early[c.pid] = c.path   # a probe that has all the monitors it takes
        if problem is not None:
            self._bad[c.pid] = problem
            self._publish(KIND_EVENT, SOURCE_NAME, {"message": f"dropped a probe socket: {problem}", "level": "warn"})
        elif c.hello is not None:
            # The probe closed (the process is exiting, or it uninstalled its probe). Its socket
            # file is gone with it; a new probe in that process would be found by the next scan.
            self._detached.add(c.pid)
            self._publish(KIND_EVENT, SOURCE_NAME, {"message": f"probe in PID {c.pid} detached (process exiting?)", "level": "info"})
            said = self._rank_said.get(c.pid)
            if said is not None and said["state"] == _ranks.STATE_RUNNING:
                # A probe closes its socket as its process exits, but the exit (DataLoader
                # workers, process groups, interpreter teardown) can take seconds: say "exited"
                # once the process is gone (_end_ranks, at every scan).
                self._rank_ending[c.pid] = time.monotonic()
                self._end_ranks()
        self._maybe_health(force=True)

    # -- messages -> samples ------------------------------------------------------------------
    def _t(self, c: _ProbeConn, mono, kind: str) -> float | None:
        """Session time of a probe time, kept within [now - MAX_LAG_S, now]; None (the message
        is dropped) if it is earlier than the last sample of ``kind`` from this probe."""
        now = self.clock.now()
        m = _num(mono)
        t = now if (m is None or c.offset is None) else m + c.offset
        if t > now or t < now - MAX_LAG_S:
            # A message cannot come from the future (the offset is a minimum over deliveries);
            # both only come from a peer that makes its times up.
            self._dropped(c, "clamped")
            t = min(now, max(t, now - MAX_LAG_S))
        last = c.last_t.get(kind)
        if last is not None and t < last:
            self._dropped(c, "order")
            return None
        c.last_t[kind] = t
        return t

    def _publish_at(self, c: _ProbeConn, kind: str, data: dict, mono) -> None:
        t = self._t(c, mono, kind)
        if t is not None:
            self._publish(kind, str(c.pid), data, t)

    def _handle(self, c: _ProbeConn, msg: dict) -> None:
        mono = _num(msg.get("mono"))
        if mono is not None:
            est = self.clock.now() - mono
            c.offset = est if c.offset is None else min(c.offset, est)
        typ = msg["type"]
        if c.hello is not None and c.offset is not None:
            self._seen[c.pid]["clock_offset_s"] = round(c.offset, 6)
        if c.hello is None:
            if typ != wire.MSG_HELLO:
                raise wire.WireError("the first message is not a hello")
            v = msg.get("v")
            if v != wire.WIRE_VERSION:
                raise wire.WireError(f"the probe speaks wire version {v!r}, this gputop reads {wire.WIRE_VERSION}: "
                                     "run the job and gputop from the same gputop version")
            c.hello = msg
            c.rank = _int(msg.get("rank"))
            c.torch = _str(msg.get("torch"))
            info = {"pid": c.pid, "rank": c.rank, "local_rank": _int(msg.get("local_rank")),
                    "world_size": _int(msg.get("world_size")), "python": _str(msg.get("python")),
                    "torch": c.torch, "origin": _str(msg.get("origin")),
                    "argv": [a for a in (_clean(msg.get("argv")) or []) if isinstance(a, str)][:16],
                    "socket": c.path}
            with self._lock:
                self._seen[c.pid] = info
            who = f"PID {c.pid}" + (f" (rank {c.rank})" if c.rank is not None else "")
            self._detached.discard(c.pid)
            self._closed_early.pop(c.pid, None)
            self._maybe_rank(c, info)
            self._publish(KIND_EVENT, SOURCE_NAME, {"message": f"probe attached: {who}", "level": "info"})
            self._maybe_health(force=True)
            return
        if typ in _SAMPLE_TYPES and not c.sample_budget.take(1, time.monotonic()):
            self._dropped(c, "rate")
            return
        if typ == wire.MSG_WINDOW:
            self._publish_at(c, KIND_PROBE_STEP, step_data(c, msg), msg.get("t1"))
            said = self._rank_said.get(c.pid)
            if said is not None and self.clock.now() - self._rank_said_at.get(c.pid, 0.0) >= _ranks.REPEAT_S:
                self._say_rank(said)  # again now and then, for a replay that seeks far
        elif typ == wire.MSG_CONFIG:
            cfg = _clean(msg.get("config"))
            if isinstance(cfg, dict):
                if _int(cfg.get("rank")) is not None:
                    c.rank = cfg["rank"]
                c.torch = _str(cfg.get("torch"))
                hooks = cfg.get("hooks") if isinstance(cfg.get("hooks"), dict) else {}
                self._note_hooks(c, hooks)
                data = {"rank": c.rank, **cfg}
                self._publish_at(c, KIND_PROBE_CONFIG, data, mono)
                with self._lock:
                    if c.pid in self._seen:
                        self._seen[c.pid]["torch"] = c.torch
                        self._seen[c.pid]["rank"] = c.rank
                self._maybe_rank(c, {"rank": c.rank, "local_rank": _int(cfg.get("local_rank")),
                                     "world_size": _int(cfg.get("world_size"))})
        elif typ == wire.MSG_MEMORY:
            data = {"rank": c.rank, "device": _int(msg.get("device"))}
            for k in MEMORY_FIELDS:   # (device_allocs/device_frees were left out by a hand list here once)
                data[k] = _int(msg.get(k))
            self._publish_at(c, KIND_PROBE_MEMORY, data, mono)
        elif typ == wire.MSG_SYNCS:
            lines = []
            for item in (msg.get("lines") or [])[:10]:
                if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _int(item[1]) is not None:
                    lines.append([item[0][:MAX_STR], item[1]])
            self._publish_at(c, KIND_PROBE_SYNC, {"rank": c.rank, "total": _int(msg.get("total")), "lines": lines}, mono)
        elif typ == wire.MSG_NOTE:
            text = _str(msg.get("text"))
            if text:
                self._publish(KIND_EVENT, SOURCE_NAME, {"message": f"PID {c.pid}: {text}", "level": "warn"})
        # other types: a newer probe; ignored on purpose

    def _maybe_rank(self, c: _ProbeConn, facts: dict) -> None:
        """A ``rank`` sample (source "probe") for a probed process that reports a rank its
        environment does not name (or that gputop may not read)."""
        if c.rank is None:
            return
        if c.env_rank is None:
            # Read again now that its probe is connected: the scan may have read the environment
            # between the process's fork and its exec (a launcher's: no RANK), and then the host
            # source names the rank from the real one while this one said it too, and two sources
            # of one rank's state raced (a rank's "exited" sorted before this one's "running").
            c.env_rank = _env_names_rank(c.pid)
            if c.env_rank is None:
                return   # mid-exec: its next message reads it again
        if c.env_rank or self._env_rank.get(c.pid):
            return
        facts = {**(self._rank_said.get(c.pid) or {}), **{k: v for k, v in facts.items() if v is not None},
                 "rank": c.rank}
        launcher = self.target.pid if c.pid != self.target.pid else _int((c.hello or {}).get("ppid"))
        data = _ranks.rank_data(c.pid, facts, _ranks.SOURCE_PROBE, _ranks.STATE_RUNNING, self._node, launcher)
        if data != self._rank_said.get(c.pid):
            self._say_rank(data)

    def _end_ranks(self) -> None:
        for pid, since in list(self._rank_ending.items()):
            said = self._rank_said.get(pid)
            if said is None or pid in self._conns:   # gone from our books, or a new probe came
                del self._rank_ending[pid]
            elif not _ranks.still_running(pid):
                del self._rank_ending[pid]
                self._say_rank({**said, "state": _ranks.STATE_EXITED, "why": "exited"})
            elif time.monotonic() - since > RANK_END_WAIT_S:
                del self._rank_ending[pid]
                self._say_rank({**said, "state": _ranks.STATE_EXITED,
                                "why": "its probe detached (the process still runs, without a probe)"})

    def _say_rank(self, data: dict) -> None:
        self._rank_said[data["pid"]] = data
        self._rank_said_at[data["pid"]] = self.clock.now()
        self._publish(_ranks.KIND_RANK, str(data["pid"]), data)

    def _note_hooks(self, c: _ProbeConn, hooks: dict) -> None:
        c.hooks = hooks
        failed = [f"{name}: {v[1]}" for name, v in hooks.items()
                  if isinstance(v, list) and len(v) == 2 and v[0] in ("failed", "unavailable") and name != "compile"]
        if failed:
            self._hook_problems[c.pid] = "; ".join(failed)
        else:
            self._hook_problems.pop(c.pid, None)
        self._maybe_health()

    # -- health --------------------------------------------------------------------------------
    def _health(self) -> tuple[str, str, dict]:
        state, message, extra = self._health_of_probes()
        drops = {pid: d for pid, d in self._drops.items() if d.describe()}
        if drops:
            extra["dropped_msgs"] = sum(d.total() for d in drops.values())
            extra["clamped_times"] = sum(d.clamped for d in drops.values())
            recent = [pid for pid, d in drops.items() if time.monotonic() - d.at < DROPS_RECENT_S
                      or (d.paused and pid in self._conns)]
            if recent:
                message += "; gputop refused part of what a probe sent (not what a gputop probe sends): " + \
                    "; ".join(f"PID {pid}: {drops[pid].describe()}" for pid in sorted(recent))
                if state == "ok":
                    state = "degraded"
        return state, message, extra

    def _health_of_probes(self) -> tuple[str, str, dict]:
        with self._lock:
            conns = [c for c in self._conns.values() if c.hello is not None]
        extra = {"found": bool(conns), "probes": sorted(c.pid for c in conns),
                 "ranks": sorted(c.rank for c in conns if c.rank is not None)}
        if conns:
            who = ", ".join(f"PID {c.pid}" + (f" (rank {c.rank})" if c.rank is not None else "")
                            for c in sorted(conns, key=lambda c: (c.rank is None, c.rank or 0, c.pid)))
            no_torch = [c.pid for c in conns if not c.torch]
            problems = [f"PID {pid}: {p}" for pid, p in self._hook_problems.items() if pid in {c.pid for c in conns}]
            if no_torch and len(no_torch) == len(conns):
                return "degraded", (f"probe attached ({who}) but torch is not imported there: steps only from "
                                    "gputop.probe.step() markers; no data, sync or GPU timing"), extra
            if problems:
                return "degraded", f"probe attached ({who}); " + "; ".join(problems), extra
            return "ok", f"probe attached: {who}", extra
        if self._scans == 0:
            return "off", "looking for a probe", extra
        alive = True
        try:
            alive = self.target.alive()
        except Exception:
            pass
        if not alive:
            return "off", f"target PID {self.target.pid} has exited", extra
        dir_notes = "; ".join(f"{v}" for v in self._dir_problems.values())
        bad = list(self._bad.values())
        if bad:
            return "failed", "a probe socket could not be read: " + "; ".join(bad)[:600], extra
        if dir_notes:
            return "failed", (f"no probe found: the probe's socket directory cannot be used ({dir_notes}). "
                              f"Then {HOW_TO_ENABLE}"), extra
        if self._detached:
            pids = ", ".join(str(p) for p in sorted(self._detached))
            return "off", (f"the probe in PID {pids} detached (the process is exiting or stopped its probe); "
                           "waiting for a probe to come back"), extra
        if self._closed_early:
            where = "; ".join(f"PID {pid} ({path})" for pid, path in sorted(self._closed_early.items()))
            return "off", (f"a probe listens in {where} but closed the connection before its hello: it has as many "
                           "monitors as it takes (other gputops, or clients that do not read); retrying"), extra
        python = True
        try:
            python = self.target.is_python()
        except Exception:
            pass
        lead = f"no probe in PID {self.target.pid}'s process tree" if python else \
            f"PID {self.target.pid} is not a Python process and no probe is in its tree"
        stale = f" (ignored {len(self._stale)} stale socket(s) of exited processes)" if self._stale else ""
        return "off", f"{lead}{stale}: {WHAT_IT_ADDS}. To enable it, {HOW_TO_ENABLE}.", extra

    def _maybe_health(self, force: bool = False) -> None:
        state, message, extra = self._health()
        now = time.monotonic()
        key = (state, message, tuple(extra["probes"]))
        if self._heartbeat.due(key, now, force):
            self._heartbeat.mark(key, now)
            self._publish(KIND_HEALTH, SOURCE_NAME, health_data(state, message, rate_hz=None, **extra))

    def _publish(self, kind: str, key: str, data: dict, t: float | None = None) -> None:
        emit = self._emit
        if emit is None:
            return
        emit(Sample(self.clock.now() if t is None else t, kind, key, data))
