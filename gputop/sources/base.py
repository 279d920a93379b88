"""What the threaded sources share: their thread and stop event, one jittered interval, one
health heartbeat.

- ``ThreadedSource``: ``start(emit)`` runs ``self._main`` on one daemon thread named
  ``thread_name``; ``_stop_thread(timeout)`` sets the stop event and joins. Each source's own
  ``stop()`` calls it, then closes what it holds.
- ``jittered(mean_s, rng, floor, cap)``: one sampling gap, never periodic, so samples cannot
  lock onto a training step's period (or the GIL's 5 ms switch interval). Each source keeps its
  own bounds: host (floor 0.5, cap 3), stacks' kernel sampler (floor 0, cap 4: Poisson),
  NVML (floor 0.5, cap 4).
- ``Heartbeat``: a ``health`` sample on change and at least every ``every_s`` seconds (5 s),
  so the store's bounded window never loses the latest one.
- ``name_os_thread``: the kernel's name of a thread (what ``top -H`` and
  /proc/PID/task/TID/comm show) set to its Python name, so gputop's cost can be read per thread
  (benchmarks/cpu_profile.py); Python before 3.14 leaves every thread named like the process.

Sources must not import gputop.session: the clock is duck-typed (``clock.now()``).
"""

from __future__ import annotations

import random
import threading
import time

HEALTH_EVERY_S = 5.0
NAP_SLEEP_MAX_S = 0.25   # waits up to this long sleep instead of waiting on the stop event


def jittered(mean_s: float, rng: random.Random, floor: float = 0.5, cap: float = 3.0) -> float:
    """``mean_s * (floor + Exp(mean 1 - floor))``, capped at ``cap * mean_s``: the mean is about
    ``mean_s``, the floor bounds the rate (and so the cost) at ``1 / floor`` times the nominal
    one, the exponential tail breaks any lock-step with a periodic loop."""
    tail_mean = (1.0 - floor) * mean_s
    if tail_mean <= 0:
        return min(floor, cap) * mean_s
    return min(floor * mean_s + rng.expovariate(1.0 / tail_mean), cap * mean_s)


def name_os_thread(name: str, native_id: int | None = None) -> None:
    """Give a thread of this process its kernel name (at most 15 bytes: the kernel's limit)."""
    tid = native_id if native_id is not None else threading.get_native_id()
    try:
        with open(f"/proc/self/task/{tid}/comm", "w") as f:
            f.write(name[:15])
    except OSError:  # not Linux, or the thread is gone: only a name is lost
        pass


def name_os_threads(named: set[int]) -> None:
    """Name every live ``gputop-*`` thread not yet in ``named`` (native ids), then add it: the
    threads gputop starts that are not a ``ThreadedSource`` (recorder, exporter, NVML's slow
    loop) are named by the session this way."""
    for t in threading.enumerate():
        nid = t.native_id
        if nid is not None and nid not in named and t.name.startswith("gputop-"):
            name_os_thread(t.name, nid)
            named.add(nid)


class Heartbeat:
    """When to publish health: when what it says changed, or ``every_s`` after the last one.
    ``due`` asks, ``mark`` records a publication (the caller may compute more in between)."""

    __slots__ = ("every_s", "said", "at")

    def __init__(self, every_s: float = HEALTH_EVERY_S, at: float = -1e9) -> None:
        self.every_s = every_s
        self.said: object = None
        self.at = at

    def due(self, said, now: float, force: bool = False) -> bool:
        return force or said != self.said or now - self.at >= self.every_s

    def mark(self, said, now: float) -> None:
        self.said, self.at = said, now


class ThreadedSource:
    """Base of a source that runs one thread: ``name``, ``thread_name`` and ``_main()`` come
    from the subclass; ``_emit`` is the bus's publish function once started."""

    name = "source"
    thread_name = "gputop-source"

    def _init_thread(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._emit = None

    def start(self, emit) -> None:
        if self._thread is not None:
            return
        self._emit = emit
        self._thread = threading.Thread(target=self._named_main, name=self.thread_name, daemon=True)
        self._thread.start()

    def _named_main(self) -> None:
        name_os_thread(self.thread_name)
        self._main()

    def _nap(self, seconds: float) -> bool:
        """Wait ``seconds`` or until stopped; True when stopped. A short wait sleeps: half the
        CPU of ``Event.wait`` (which builds and times out a lock each call), and it matters in
        a 50 Hz loop; ``stop()`` then waits at most that short gap longer."""
        if seconds <= NAP_SLEEP_MAX_S:
            time.sleep(max(0.0, seconds))
            return self._stop.is_set()
        return self._stop.wait(seconds)

    def _stop_thread(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _main(self) -> None:  # pragma: no cover - every subclass has its own
        raise NotImplementedError
