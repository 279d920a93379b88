"""Shared by the stack-source tests: real target processes and a session-like clock."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

WORKLOADS = pathlib.Path(__file__).resolve().parent / "workloads"


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


class Proc:
    """A target program in its own session (so killing it takes its children too), with its
    JSON stdout lines collected on a thread."""

    def __init__(self, args: list[str], python: str | None = None):
        self.popen = subprocess.Popen([python or sys.executable, *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.pid = self.popen.pid
        self.lines: list[dict] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def first(self, timeout: float = 60.0) -> dict:
        end = time.monotonic() + timeout
        while not self.lines:
            if self.popen.poll() is not None:
                raise RuntimeError(f"target exited: {self.popen.stderr.read()[-3000:]}")
            if time.monotonic() > end:
                raise RuntimeError("target gave no output")
            time.sleep(0.02)
        return self.lines[0]

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()
        self.popen.stdout.close()
        self.popen.stderr.close()


def workload(name: str, *args: str) -> list[str]:
    return [str(WORKLOADS / name), *args]


def wait_for(pred, timeout: float, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return pred()


# A Python process with one forked child named like a DataLoader worker (torch's pt_data_worker),
# which prints {"pid", "child"} and idles: the stack source samples such children in short windows.
WORKER_PARENT = ("import ctypes, multiprocessing as mp, os, time, json\n"
                 "def work():\n    ctypes.CDLL(None).prctl(15, b'pt_data_worker', 0, 0, 0)\n"
                 "    while True: sum(range(1000))\n"
                 "if __name__ == '__main__':\n"
                 "    c = mp.get_context('fork').Process(target=work, daemon=True); c.start()\n"
                 "    print(json.dumps({'pid': os.getpid(), 'child': c.pid}), flush=True)\n"
                 "    while True: time.sleep(0.1)\n")
