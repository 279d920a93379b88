"""The probe thread's window: the step records drained into one window message, finished
CUDA events read with ``query()`` (never waiting for the GPU), the config and sync-line messages.

Imports: the standard library only (the probe is duck-typed: gputop/probe/core.py's ``Probe``).
"""

from __future__ import annotations

from gputop.probe import wire
from gputop.probe.util import _mono

MAX_FREE_EVENTS = 256       # finished CUDA events kept for reuse


class _WindowState:
    """What the probe thread carries from one window to the next."""

    def __init__(self, probe) -> None:
        self.p = probe
        self.restart()
        self.memory_at = 0.0
        self.config_at = 0.0
        self.syncs_at = 0.0
        self.config_sent: dict | None = None
        self.hooks_version = -1
        self.last_syncs: dict | None = None

    def restart(self) -> None:
        p = self.p
        self.t0 = _mono()
        self.batch_total = p.batch_total
        self.sample_total = p.sample_total
        self.unsized_total = p.unsized_total
        self.wait_total = p.wait_total
        self.sync_total = p.sync_total
        self.last_step = p.step_total
        self.sync_lines_prev = dict(p.sync_lines)
        self.rd_prev_end = None
        watch = getattr(p.torch_hooks, "compiles", None)
        if watch is not None:
            watch.baseline()   # (a fresh window: compiles before it are not its own)

    def window_msg(self, now: float) -> dict:
        p = self.p
        recs = []
        pop = p.records.popleft
        while True:
            try:
                recs.append(pop())
            except IndexError:
                break
        dropped = 0
        if recs:
            # Records are numbered: a gap means the bounded buffer dropped the oldest.
            dropped = max(0, recs[0][0] - self.last_step - 1)
            self.last_step = recs[-1][0]
        timed = [r for r in recs if r[2] is not None]
        durs = sorted(r[2] for r in timed)
        hist: dict[str, int] = {}
        for d in durs:
            b = str(wire.hist_bucket(d))
            hist[b] = hist.get(b, 0) + 1
        gpu = self._read_gpu() if p.torch_hooks is not None else []
        # Syncs count only for a window that sync counting covered from its start: a window in
        # which counting began (or stopped and began again) would report too few, so it gets None.
        since = p.sync_capture_since
        syncs_counted = p.sync_capture and since is not None and since <= self.t0
        if syncs_counted:
            sync_off = None
        elif p.sync_capture:
            sync_off = "sync counting was off for part of this window"
        else:
            sync_off = _why_off(p, "syncs")
        batch_total, sample_total, wait_total, sync_total = p.batch_total, p.sample_total, p.wait_total, p.sync_total
        unsized_total = p.unsized_total
        msg = {
            "type": wire.MSG_WINDOW, "mono": now, "t0": self.t0, "t1": now,
            "steps": len(recs), "step_total": p.step_total, "dropped": dropped,
            "step_source": p.step_source,
            "step_n": len(durs), "step_sum": sum(durs) if durs else None,
            "step_min": durs[0] if durs else None, "step_max": durs[-1] if durs else None,
            "step_p50": durs[len(durs) // 2] if durs else None, "step_hist": hist,
            "step_wait": sum(r[3] for r in timed) if timed else None,
            "step_batches": sum(r[4] for r in recs), "step_samples": sum(r[5] for r in recs),
            # (and only if counting also covered the first step, which began before the window)
            "step_syncs": sum(r[6] for r in timed) if (timed and syncs_counted and timed[0][1] - timed[0][2] >= since)
            else None,
            "batches": batch_total - self.batch_total, "batch_total": batch_total,
            "samples": sample_total - self.sample_total, "sample_total": sample_total,
            "unsized": unsized_total - self.unsized_total,
            "wait": wait_total - self.wait_total,
            "gpu_n": len(gpu), "gpu_sum": sum(gpu) if gpu else None, "gpu_max": max(gpu) if gpu else None,
            "gpu_off": None if p.cuda_events_on else _why_off(p, "cuda_events"),
            "gpu_skipped": p.ev_skipped,
            "syncs": (sync_total - self.sync_total) if syncs_counted else None, "sync_total": sync_total,
            "sync_off": sync_off,
            "sync_top": self._sync_top_delta(),
            "other_optimizer_steps": p.other_optimizer_steps,
            "monitors": len(p._monitors), "dropped_msgs": sum(m.dropped for m in p._monitors),
            "probe_cpu_s": p.thread_cpu_s,
            "flops": p.flops.message() if p.flops is not None else {"off": "torch is not imported (yet)"},
            "kernel": p.kernel_sampler.message(now),   # the kernels' time per step (kernel_sample.py)
        }
        scaler = getattr(p.torch_hooks, "scaler", None)
        if scaler is not None:
            msg["amp"] = scaler.totals()      # GradScaler's steps and skips, since load (amp_scaler.py)
        watch = getattr(p.torch_hooks, "compiles", None)
        # torch.compile's compilations (gputop/probe/compiles.py); None: torch not imported (yet)
        msg["compile"] = watch.window() if watch is not None else None
        coll = getattr(p.torch_hooks, "collectives", None)
        if coll is not None:
            msg.update(coll.window_fields())   # coll_*: DDP/FSDP collectives (gputop/probe/collectives.py)
        self.t0 = now
        self.unsized_total = unsized_total
        self.batch_total, self.sample_total, self.wait_total, self.sync_total = (
            batch_total, sample_total, wait_total, sync_total)
        return msg

    def _read_gpu(self) -> list[float]:
        """GPU span of each finished step, read with query() only: never waits for the GPU."""
        p = self.p
        out: list[float] = []
        pending = p.ev_pending
        while pending:
            n, start, end = pending[0]
            try:
                if not end.query():
                    break
                secs = None
                if start is not None and start.query():
                    secs = start.elapsed_time(end) / 1000.0
            except Exception:
                secs = None  # e.g. events on two devices: no span for this step
            pending.popleft()
            if secs is not None and secs >= 0:
                out.append(secs)
            prev = self.rd_prev_end
            if start is not None and start is not prev:
                self._free(start)   # a data event, used once
            if prev is not None:
                self._free(prev)    # the previous boundary: no later step can start at it now
            self.rd_prev_end = end
        return out

    def _free(self, ev) -> None:
        if len(self.p.ev_free) < MAX_FREE_EVENTS and self.p.cuda_events_on:
            self.p.ev_free.append(ev)

    def _sync_top_delta(self) -> list:
        p = self.p
        if not p.sync_lines:
            return []
        cur = dict(p.sync_lines)
        prev = self.sync_lines_prev
        delta = [(k, v - prev.get(k, 0)) for k, v in cur.items() if v > prev.get(k, 0)]
        self.sync_lines_prev = cur
        delta.sort(key=lambda kv: -kv[1])
        return [[k, v] for k, v in delta[:3]]

    def syncs_msg(self) -> dict | None:
        top = sorted(dict(self.p.sync_lines).items(), key=lambda kv: -kv[1])[:10]
        msg = {"type": wire.MSG_SYNCS, "lines": [[k, v] for k, v in top], "total": self.p.sync_total}
        if self.last_syncs is not None and self.last_syncs["lines"] == msg["lines"]:
            return None
        self.last_syncs = msg
        return msg

    def config_msg(self, force: bool) -> dict | None:
        p = self.p
        self.config_at = _mono()
        self.hooks_version = p._hooks_version
        cfg = p.torch_hooks.config() if p.torch_hooks is not None else {
            "torch": None, "torch_info": "torch is not imported in this process (yet): steps only from gputop.probe.step() markers; no data, sync or GPU timing"}
        # dict(...) copies in one C call: the training thread may add an entry meanwhile.
        cfg["hooks"] = {k: list(v) for k, v in dict(p.hooks).items()}
        cfg["step_source"] = p.step_source
        if not force and cfg == self.config_sent:
            return None
        self.config_sent = cfg
        return {"type": wire.MSG_CONFIG, "mono": _mono(), "config": cfg}


def _why_off(p, hook: str) -> str:
    h = p.hooks.get(hook)
    if h is not None and h[1]:
        return h[1]
    if p.torch is None:
        return "torch is not imported"
    return "off"
