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

Nothing read from a socket is executed: JSON only, every line bounded (wire.MAX_LINE), every
number checked, every string clipped. A peer that is not a probe is dropped with one line.
"""

from __future__ import annotations

import math
import os
import selectors
import socket
import threading
import time

import psutil

from gputop.model import KIND_EVENT, KIND_HEALTH, Sample, health_data
from gputop.probe import wire
from gputop.sources import ranks as _ranks
from gputop.sources.base import HEALTH_EVERY_S, Heartbeat, ThreadedSource

KIND_PROBE_STEP = "probe_step"
KIND_PROBE_CONFIG = "probe_config"
KIND_PROBE_MEMORY = "probe_memory"
KIND_PROBE_SYNC = "probe_sync"
PROBE_KINDS = (KIND_PROBE_STEP, KIND_PROBE_CONFIG, KIND_PROBE_MEMORY, KIND_PROBE_SYNC)

SOURCE_NAME = "probe"
RANK_END_WAIT_S = 30.0   # a probed rank whose probe detached but whose process lives on: ended after this
MAX_STR = 400

WHAT_IT_ADDS = ("the probe adds step time split into data wait / GPU time / other host time, steps, batches and "
                "samples per second, implicit device syncs per step with the line that caused them, and the "
                "DataLoader and speed settings")
HOW_TO_ENABLE = ("start the job with `gputop run -- python train.py ...`, or add "
                 "`import gputop.probe; gputop.probe.install()` to the training script")


def _num(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _int(x) -> int | None:
    if isinstance(x, bool) or not isinstance(x, int):
        return None
    return x


def _str(x) -> str | None:
    return x[:MAX_STR] if isinstance(x, str) else None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _clean(v, depth: int = 0):
    """A JSON value from a probe, made safe for a sample: bounded depth, sizes and strings."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v[:MAX_STR]
    if depth >= 4:
        return None
    if isinstance(v, list):
        return [_clean(x, depth + 1) for x in v[:64]]
    if isinstance(v, dict):
        return {str(k)[:80]: _clean(x, depth + 1) for k, x in list(v.items())[:64]}
    return None


class _ProbeConn:
    def __init__(self, pid: int, sock: socket.socket, path: str) -> None:
        self.pid = pid
        self.sock = sock
        self.path = path
        self.reader = wire.LineReader()
        self.hello: dict | None = None
        self.offset: float | None = None
        self.rank: int | None = None
        self.torch: str | None = None
        self.hooks: dict = {}
        self.last_window: float | None = None
        self.last_cpu: tuple[float, float] | None = None  # (probe thread CPU s, t1)


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
                if not sel.get_map():
                    self._stop.wait(max(0.0, min(0.2, next_scan - time.monotonic())))
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
        try:
            env = proc.environ()
            env_dir = env.get(wire.ENV_DIR)
            self._env_rank[proc.pid] = _ranks.rank_env(env) is not None
        except (psutil.Error, OSError):
            env_dir = None
        if env_dir:
            dirs.append(env_dir)
        for d in (*self.extra_dirs, wire.default_dir(uid)):
            if d not in dirs:
                dirs.append(d)
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
        try:
            data = c.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._detach(sel, c, None)
            return
        try:
            msgs = c.reader.feed(data)
            for msg in msgs:
                self._handle(c, msg)
        except wire.WireError as e:
            self._detach(sel, c, f"PID {c.pid} ({c.path}): {e}")

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
    def _t(self, c: _ProbeConn, mono) -> float:
        m = _num(mono)
        if m is None or c.offset is None:
            return self.clock.now()
        return m + c.offset

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
            self._maybe_rank(c, info)
            self._publish(KIND_EVENT, SOURCE_NAME, {"message": f"probe attached: {who}", "level": "info"})
            self._maybe_health(force=True)
            return
        if typ == wire.MSG_WINDOW:
            self._publish(KIND_PROBE_STEP, str(c.pid), self._step_data(c, msg), self._t(c, msg.get("t1")))
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
                self._publish(KIND_PROBE_CONFIG, str(c.pid), data, self._t(c, mono))
                with self._lock:
                    if c.pid in self._seen:
                        self._seen[c.pid]["torch"] = c.torch
                        self._seen[c.pid]["rank"] = c.rank
                self._maybe_rank(c, {"rank": c.rank, "local_rank": _int(cfg.get("local_rank")),
                                     "world_size": _int(cfg.get("world_size"))})
        elif typ == wire.MSG_MEMORY:
            data = {"rank": c.rank, "device": _int(msg.get("device"))}
            for k in ("allocated", "reserved", "peak_allocated", "peak_reserved", "alloc_retries", "ooms"):
                data[k] = _int(msg.get(k))
            self._publish(KIND_PROBE_MEMORY, str(c.pid), data, self._t(c, mono))
        elif typ == wire.MSG_SYNCS:
            lines = []
            for item in (msg.get("lines") or [])[:10]:
                if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _int(item[1]) is not None:
                    lines.append([item[0][:MAX_STR], item[1]])
            self._publish(KIND_PROBE_SYNC, str(c.pid), {"rank": c.rank, "total": _int(msg.get("total")), "lines": lines},
                          self._t(c, mono))
        elif typ == wire.MSG_NOTE:
            text = _str(msg.get("text"))
            if text:
                self._publish(KIND_EVENT, SOURCE_NAME, {"message": f"PID {c.pid}: {text}", "level": "warn"})
        # other types: a newer probe; ignored on purpose

    def _maybe_rank(self, c: _ProbeConn, facts: dict) -> None:
        """A ``rank`` sample (source "probe") for a probed process that reports a rank its
        environment does not name (or that gputop may not read)."""
        if c.rank is None or self._env_rank.get(c.pid):
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

    def _step_data(self, c: _ProbeConn, w: dict) -> dict:
        t0, t1 = _num(w.get("t0")), _num(w.get("t1"))
        window_s = (t1 - t0) if (t0 is not None and t1 is not None and t1 > t0) else None
        steps = _int(w.get("steps")) or 0
        step_n = _int(w.get("step_n")) or 0
        step_sum = _num(w.get("step_sum"))
        mean = step_sum / step_n if (step_n and step_sum is not None) else None
        wait = _num(w.get("step_wait"))
        wait_ms = wait / step_n * 1000 if (step_n and wait is not None) else None
        share = wait / step_sum if (wait is not None and step_sum) else None
        gpu_n = _int(w.get("gpu_n")) or 0
        gpu_sum = _num(w.get("gpu_sum"))
        gpu_ms = gpu_sum / gpu_n * 1000 if (gpu_n and gpu_sum is not None) else None
        step_ms = mean * 1000 if mean is not None else None
        other_ms = None
        if step_ms is not None and wait_ms is not None:
            other_ms = max(0.0, step_ms - wait_ms - (gpu_ms or 0.0))
        batches = _int(w.get("batches"))
        samples = _int(w.get("samples"))
        if _int(w.get("unsized")):
            # Some batches had no tensor and the loader no batch_size: the count would be short.
            samples = None
        syncs = _int(w.get("step_syncs"))
        top = w.get("sync_top") if isinstance(w.get("sync_top"), list) else []
        top0 = top[0] if top and isinstance(top[0], list) and len(top[0]) == 2 else None
        hist = w.get("step_hist") if isinstance(w.get("step_hist"), dict) else {}
        hist = {str(k)[:8]: v for k, v in list(hist.items())[:200] if _int(v) is not None}

        def per_s(n):
            return _r(n / window_s) if (n is not None and window_s) else None

        cpu, probe_cpu_pct = _num(w.get("probe_cpu_s")), None
        if cpu is not None and t1 is not None:
            if c.last_cpu is not None and t1 > c.last_cpu[1] and cpu >= c.last_cpu[0]:
                probe_cpu_pct = _r((cpu - c.last_cpu[0]) / (t1 - c.last_cpu[1]) * 100, 3)
            c.last_cpu = (cpu, t1)

        return {
            "rank": c.rank,
            "window_s": _r(window_s),
            "steps": steps,
            "step_total": _int(w.get("step_total")),
            "steps_per_s": per_s(steps),
            "step_n": step_n,
            "step_s_sum": _r(step_sum, 6),
            "step_ms_mean": _r(step_ms),
            "step_ms_p50": _r(_num(w.get("step_p50")) * 1000) if _num(w.get("step_p50")) is not None else None,
            "step_ms_max": _r(_num(w.get("step_max")) * 1000) if _num(w.get("step_max")) is not None else None,
            "step_hist": hist,
            "data_wait_ms": _r(wait_ms),
            "data_wait_s_sum": _r(wait, 6),
            "data_wait_share": _r(share, 4),
            "gpu_ms_mean": _r(gpu_ms),
            "gpu_n": gpu_n,
            "gpu_s_sum": _r(gpu_sum, 6),
            "other_ms": _r(other_ms),
            "batches": batches,
            "batches_per_s": per_s(batches),
            "samples": samples,
            "samples_per_s": per_s(samples),
            "batch_total": _int(w.get("batch_total")),
            "sample_total": _int(w.get("sample_total")),
            "step_batches": _int(w.get("step_batches")),
            "step_samples": None if samples is None else _int(w.get("step_samples")),
            "syncs": syncs,
            "syncs_per_step": _r(syncs / step_n) if (syncs is not None and step_n) else None,
            "sync_top": top0[0][:MAX_STR] if top0 and isinstance(top0[0], str) else None,
            "sync_top_count": _int(top0[1]) if top0 else None,
            "dropped": _int(w.get("dropped")),
            "probe_cpu_pct": probe_cpu_pct,
        }

    # -- health --------------------------------------------------------------------------------
    def _health(self) -> tuple[str, str, dict]:
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
