"""The kernel sampler parks threads that sat in one wait for a whole second (read every
PARK_CHECK_TICKS-th tick only) and unparks them when they wake: on a real process, with real
/proc reads (os.pread is only counted here, not replaced)."""

from __future__ import annotations

import os
import time

import pytest

from gputop.sources import kernel_wait
from gputop.sources.kernel_wait import KERNEL_COLUMNS, PARK_CHECK_TICKS, KernelSampler

from stacks_helpers import Proc

pytestmark = pytest.mark.timeout(60)

# a thread asleep all along, and one that sleeps WAKE_S then spins (against the main thread's
# spinning: it runs or waits for the GIL from then on); the sampler starts ~0.5 s after both
TARGET = """
import json, os, threading, time
def sleeper():
    time.sleep(1000)
def waker():
    time.sleep(float(os.environ["WAKE_S"]))
    while True:
        sum(range(1000))
a = threading.Thread(target=sleeper, name="sleeper", daemon=True); a.start()
b = threading.Thread(target=waker, name="waker", daemon=True); b.start()
# the GIL is free while this sleeps: the waker reaches its sleep before the sampler first looks
# (started under load, it could still be waiting for the GIL on the first ticks)
time.sleep(0.5)
print(json.dumps({"sleeper": a.native_id, "waker": b.native_id}), flush=True)
while True:
    sum(range(1000))
"""
WAKE_S = 3.5
TICK_S = 0.04


def _seconds(ks: KernelSampler, pid: int, n: int, reads: list) -> list[dict]:
    """n harvests, one a second, of ticks every TICK_S; each: {tid: row} plus the reads made."""
    out = []
    for i in range(n):
        t_end = time.monotonic() + 1.0
        reads.clear()
        ticks = 0
        while time.monotonic() < t_end:
            ks.tick()
            ticks += 1
            time.sleep(TICK_S)
        (got_pid, data), = ks.harvest(float(i + 1))
        assert got_pid == pid
        rows = {r[0]: dict(zip(KERNEL_COLUMNS, r)) for r in data["threads"]}
        out.append({"rows": rows, "ticks": ticks, "reads": dict(reads)})
    return out


def test_a_sleeping_thread_is_parked_and_a_waking_one_is_read_again(monkeypatch):
    monkeypatch.setenv("WAKE_S", str(WAKE_S))   # Proc's child inherits it
    p = Proc(["-c", TARGET])
    try:
        tids = p.first()
        fd_tid: dict[int, int] = {}
        reads: dict[int, int] = {}
        real_pread = os.pread

        def counting_pread(fd, n, off):
            tid = fd_tid.get(fd)
            if tid is not None:
                reads[tid] = reads.get(tid, 0) + 1
            return real_pread(fd, n, off)

        ks = KernelSampler()
        ks.refresh([p.pid], 0.0)
        for th in ks.procs[p.pid].threads.values():
            fd_tid[th.fd] = th.tid
        monkeypatch.setattr(kernel_wait.os, "pread", counting_pread)
        secs = _seconds(ks, p.pid, 7, reads)
    finally:
        p.kill()
    sl, wk = tids["sleeper"], tids["waker"]
    # the sleeper: every tick counted as sleep every second, read every tick only in the first
    for s in secs:
        assert s["rows"][sl]["sleep"] == s["ticks"], s["rows"][sl]
    assert secs[0]["reads"][sl] == secs[0]["ticks"]
    for s in secs[1:]:
        assert s["reads"].get(sl, 0) <= s["ticks"] // PARK_CHECK_TICKS + 1, (s["reads"], s["ticks"])
    # the waker: parked while asleep, then awake; every second after the one it woke in is
    # read every tick and shows it running or waiting for the GIL, never asleep
    woke = next(i for i, s in enumerate(secs) if s["rows"][wk]["sleep"] < s["ticks"])
    assert woke >= 2, "it slept through the first seconds (parked from the second one on)"
    assert secs[woke - 1]["reads"].get(wk, 0) <= secs[woke - 1]["ticks"] // PARK_CHECK_TICKS + 1
    # in the second it woke, at most PARK_CHECK_TICKS ticks after the wake are still counted asleep
    w = secs[woke]["rows"][wk]
    awake_ticks = secs[woke]["ticks"] - w["sleep"]
    assert awake_ticks >= 1 and w["run"] + w["gil"] == awake_ticks, w
    for s in secs[woke + 1:]:
        r = s["rows"][wk]
        assert r["sleep"] == 0 and r["run"] + r["gil"] == s["ticks"], r
        assert s["reads"][wk] == s["ticks"], "awake: read every tick"
        assert r["cpu_s"] > 0
