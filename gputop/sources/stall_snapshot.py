"""The stall snapshot: every thread's stack of every rank, and the GPU's state, at a stall.

A live-only source that also listens to the bus (``LiveSession`` subscribes a source that has
``on_samples``). When the stall detector's ``stall``/"job" sample turns stalled (a new
``since``), it runs ``py-spy dump --nonblocking --json`` on every rank the sample names, all at
once, on its own threads with a timeout each, and publishes one ``stall_snapshot``/"job"
sample: per rank its threads (name, TID, active, GIL, frames innermost first: function, file,
line), the latest ``gpu`` sample of each GPU the job uses (kernels running = util.gpu > 0, SM
active, memory), the last step's time and the median step.

``--nonblocking`` reads the target's memory without stopping it (py-spy's default pauses every
thread for the read); a stack read while the thread moves may be torn, which a stalled thread
does not do. ``--native`` cannot be combined with it, so the stacks are Python frames only.
A replay plays the recorded snapshot; it never dumps anything.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

from gputop.catalogue import KIND_GPU, KIND_STALL, KIND_STALL_SNAPSHOT
from gputop.model import KIND_HEALTH, Sample, health_data
from gputop.sources.nvml_fields import GPM_FIELDS, GPM_HOLD_S
from gputop.sources.pyspy import find_pyspy
from gputop.sources.target import dies_with_parent

DUMP_TIMEOUT_S = 10.0   # one py-spy dump; a stuck one is killed and the rank says so
MAX_THREADS = 64        # threads kept per rank
MAX_FRAMES = 48         # frames kept per thread (innermost first)
MAX_TEXT = 300          # characters of a file name or function name
GPU_FIELDS = ("util_gpu", "sm_active", "mem_used", "mem_total", "power_w", "tensor_active", "dram_bw")


def held_gpu_fields(prev: dict | None, prev_t: dict | None, s: Sample) -> tuple[dict, dict]:
    """The GPU readings a snapshot shows, from the newest ``gpu`` sample, and when each was read.
    GPM fields come in about 1 sample in 5 (every GPM_EVERY_S): one the newest sample left None
    keeps its previous value while that is at most GPM_HOLD_S old, so the snapshot says SM active
    whenever GPM gives it, not only when the stall landed on a GPM sample."""
    out: dict = {}
    when: dict = {}
    for f in GPU_FIELDS:
        v = s.data.get(f)
        if v is not None:
            when[f] = s.t
        elif f in GPM_FIELDS and prev and prev_t and prev.get(f) is not None and s.t - prev_t[f] <= GPM_HOLD_S:
            v, when[f] = prev[f], prev_t[f]
        out[f] = v
    return out, when


def _text(v) -> str:
    return str(v)[:MAX_TEXT]


def parse_dump(out: str, pid: int) -> list[dict]:
    """py-spy's ``dump --json`` output -> our bounded thread list (raises ValueError)."""
    raw = json.loads(out)
    if not isinstance(raw, list):
        raise ValueError("py-spy dump did not give a list of threads")
    threads = []
    for th in raw[:MAX_THREADS]:
        if not isinstance(th, dict):
            continue
        frames = []
        for f in (th.get("frames") or [])[:MAX_FRAMES]:
            if isinstance(f, dict):
                line = f.get("line")
                # [function, short file, line, full path]: a list, so a recording's nesting stays shallow
                frames.append([_text(f.get("name")), _text(f.get("short_filename") or f.get("filename")),
                               line if type(line) is int else None, _text(f.get("filename"))])
        tid = th.get("os_thread_id")
        threads.append({"pid": pid, "tid": tid if type(tid) is int else None,
                        "name": _text(th.get("thread_name") or ""),
                        "active": bool(th.get("active")), "owns_gil": bool(th.get("owns_gil")),
                        "main": tid == pid, "frames": frames})
    threads.sort(key=lambda t: not t["main"])
    return threads


def dump_threads(pyspy: str, pid: int, timeout_s: float = DUMP_TIMEOUT_S) -> dict:
    """One rank's threads now, never pausing it: {"threads": [...], "dump_ms"} or {"error"}."""
    t0 = time.monotonic()
    try:
        out = subprocess.run([pyspy, "dump", "--pid", str(pid), "--nonblocking", "--json"], capture_output=True,
                             text=True, timeout=timeout_s, preexec_fn=dies_with_parent(signal.SIGKILL))
    except subprocess.TimeoutExpired:
        return {"error": f"py-spy dump took longer than {timeout_s:.0f} s"}
    except OSError as e:
        return {"error": f"py-spy could not run: {e}"}
    ms = round((time.monotonic() - t0) * 1000.0, 1)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[0]
        return {"error": f"py-spy dump failed: {last[:200]}", "dump_ms": ms}
    try:
        return {"threads": parse_dump(out.stdout, pid), "dump_ms": ms}
    except ValueError as e:
        return {"error": f"py-spy dump gave unreadable output: {e}", "dump_ms": ms}


class StallSnapshotSource:
    name = "stall_snapshot"

    def __init__(self, clock, pyspy: str | None = None, timeout_s: float = DUMP_TIMEOUT_S) -> None:
        self.clock = clock
        self.pyspy = pyspy or find_pyspy()
        self.timeout_s = timeout_s
        self._emit = None
        self._gpu: dict[str, dict] = {}     # the newest readings of each GPU
        self._gpu_t: dict[str, dict] = {}   # when each of them was read
        self._done_since = None             # the stall already snapshotted
        self._busy = threading.Lock()
        self.taken = 0

    # -- Source ----------------------------------------------------------------------------
    def start(self, emit) -> None:
        self._emit = emit
        if self.pyspy is None:
            emit(Sample(self.clock.now(), KIND_HEALTH, self.name,
                        health_data("degraded", "py-spy not found: a stall is named without its stacks")))

    def stop(self) -> None:
        self._emit = None

    def describe(self) -> dict:
        return {"pyspy": self.pyspy, "timeout_s": self.timeout_s, "snapshots": self.taken}

    # -- Subscriber: called on the publisher's thread, so it only looks and hands off -----------
    def on_samples(self, samples: list[Sample]) -> None:
        for s in samples:
            if s.kind == KIND_GPU:
                self._gpu[s.key], self._gpu_t[s.key] = held_gpu_fields(self._gpu.get(s.key), self._gpu_t.get(s.key), s)
            elif s.kind == KIND_STALL and s.key == "job" and s.get("stalled") and self._emit is not None:
                since = s.get("since")
                if since != self._done_since and not self._busy.locked():
                    self._done_since = since
                    threading.Thread(target=self._take, args=(s,), name="gputop-stall-dump", daemon=True).start()

    def on_reset(self) -> None:
        self._done_since = None

    def _take(self, stall: Sample) -> None:
        with self._busy:
            ranks = [r for r in stall.get("ranks") or [] if isinstance(r, dict)]
            t = self.clock.now()
            results: dict[int, dict] = {}

            def one(i: int, pid: int) -> None:
                results[i] = (dump_threads(self.pyspy, pid, self.timeout_s) if self.pyspy
                              else {"error": "py-spy not found"})

            workers = []
            for i, r in enumerate(ranks):
                try:
                    pid = int(r.get("pid"))
                except (TypeError, ValueError):
                    results[i] = {"error": "no PID"}
                    continue
                w = threading.Thread(target=one, args=(i, pid), daemon=True)
                w.start()
                workers.append(w)
            for w in workers:
                w.join(self.timeout_s + 2.0)
            newest = dict(self._gpu)   # a copy: the publisher thread adds GPUs while we read
            gpus = set(stall.get("gpus") or []) or set(newest)
            data = {
                "t": round(t, 2), "since": stall.get("since"), "reason": stall.get("reason"),
                "last_step_t": stall.get("last_step_t"), "median_step_s": stall.get("median_step_s"),
                "threshold_s": stall.get("threshold_s"), "phase": stall.get("phase"),
                "gpus": {k: dict(v) for k, v in newest.items() if k in gpus},
                "ranks": [], "threads": [],
                "dump_ms": round((self.clock.now() - t) * 1000.0, 1),
            }
            for i, r in enumerate(ranks):
                got = results.get(i, {"error": "py-spy dump did not finish"})
                data["ranks"].append({"pid": r.get("pid"), "rank": r.get("rank"), "last_step_t": r.get("last_step_t"),
                                      "error": got.get("error"), "dump_ms": got.get("dump_ms")})
                data["threads"].extend(got.get("threads") or [])
            emit = self._emit
            if emit is not None:
                self.taken += 1
                emit(Sample(self.clock.now(), KIND_STALL_SNAPSHOT, "job", data))
