"""NVML's host PIDs mapped to the processes gputop sees, tested in a real PID namespace.

``unshare --pid --fork --mount-proc`` (as root) gives a fresh PID namespace with its own /proc:
the real situation of gputop in a container without hostPID. A view of the host's /proc is
passed in as an open directory descriptor (what ``-v /proc:/host/proc`` gives a container).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from gputop.sources import pid_namespace as pn

UNSHARE = shutil.which("unshare")

INNER = r"""
import json, subprocess, sys, time
from gputop.sources import pid_namespace as pn
child = subprocess.Popen(["sleep", "30"])
print(json.dumps({"child": child.pid, "host_ns": pn.in_host_namespace()}), flush=True)
host_child, outsider = json.loads(sys.stdin.readline())
nvml = {host_child: (1 << 30, {0}), outsider: (1 << 30, {0}), 1: (1 << 30, {0})}
view = pn.map_pids(nvml, host_proc="/proc/self/fd/" + sys.argv[1])
blind = pn.map_pids(nvml)
print(json.dumps({"view": [view.method, {str(k): v for k, v in view.visible.items()}, view.describe()],
                  "blind": [blind.method, {str(k): v for k, v in blind.visible.items()}, blind.describe()]}),
      flush=True)
child.kill()
"""


def _need_unshare():
    if UNSHARE is None or os.geteuid() != 0:
        pytest.fail("this test needs root and unshare(1) (util-linux) for a real PID namespace")


def test_host_namespace_seen_as_host():
    assert pn.in_host_namespace()
    m = pn.map_pids({os.getpid(): (None, {0})})
    assert m.method == pn.METHOD_SAME and m.get(os.getpid()) == os.getpid()
    ns = pn.read_nspid(os.getpid())
    assert ns == [os.getpid()]


@pytest.mark.timeout(30)
def test_real_pid_namespace_maps_by_nspid_and_never_by_number():
    _need_unshare()
    host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    p = subprocess.Popen([UNSHARE, "--pid", "--fork", "--mount-proc", sys.executable, "-c", INNER, str(host_proc)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=(host_proc,), env=env)
    try:
        first = json.loads(p.stdout.readline())
        assert first["host_ns"] is False          # inside: no kernel threads, PID 2 is not kthreadd
        inner_child = first["child"]
        # its host PID, seen from out here: the `sleep` below unshare
        deadline = time.monotonic() + 10
        host_child = None
        while host_child is None and time.monotonic() < deadline:
            for c in psutil.Process(p.pid).children(recursive=True):
                if c.name() == "sleep":
                    host_child = c.pid
            time.sleep(0.05)
        assert host_child is not None and host_child != inner_child
        assert pn.read_nspid(host_child) == [host_child, inner_child]  # the host's view: both numbers
        outsider = os.getpid()       # a process of the host namespace: "another container's"
        p.stdin.write(json.dumps([host_child, outsider]) + "\n")
        p.stdin.flush()
        out = json.loads(p.stdout.readline())
    finally:
        p.kill()
        p.wait()
        os.close(host_proc)
    method, visible, said = out["view"]
    assert method == pn.METHOD_NSPID
    assert visible[str(host_child)] == inner_child
    assert visible[str(outsider)] is None
    assert visible["1"] is None           # the host's PID 1 is not the namespace's PID 1
    assert "nspid (1 of 3" in said
    method, visible, said = out["blind"]
    # without a host view and with no GPU open here, nothing is mapped: never by equal numbers
    assert method == pn.METHOD_NONE and set(visible.values()) == {None}
    assert "no process here holds a GPU" in said


def test_elimination_pairs_only_unique_matches():
    gib = 1 << 30
    # GPU 0: one NVML entry, one process here -> paired. GPU 1: two entries (one another
    # container's), one process here whose reported memory matches one of them -> paired.
    # GPU 2: two entries, one process without a reported memory -> ambiguous, unmapped.
    nvml = {5001: (10 * gib, {0}), 5002: (20 * gib, {1}), 5003: (40 * gib, {1}),
            5004: (8 * gib, {2}), 5005: (9 * gib, {2})}
    users = {11: (None, {0}), 12: (int(19.8 * gib), {1}), 13: (None, {2})}
    m = pn.by_elimination(nvml, users)
    assert m.method == pn.METHOD_ELIMINATION
    assert m.visible == {5001: 11, 5002: 12, 5003: None, 5004: None, 5005: None}
    # memories that both match within the tolerance tell nothing apart
    close = pn.by_elimination({1: (10 * gib, {0}), 2: (int(10.2 * gib), {0})}, {7: (10 * gib, {0})})
    assert close.visible == {1: None, 2: None} and close.method == pn.METHOD_NONE


def test_gpus_held_reads_descriptors_of_a_real_process():
    p = subprocess.Popen([sys.executable, "-c", "import time; f = open('/dev/null'); time.sleep(10)"])
    try:
        time.sleep(0.5)
        assert pn.gpus_held(p.pid) == set()   # /dev/null is not a GPU
    finally:
        p.kill()
        p.wait()
    assert pn.gpus_held(p.pid) is None        # gone: unreadable, not "no GPU"
