"""The rules that say which processes are ranks, over process trees and environments as launchers
make them (torchrun, a wrapper shell, mpirun with a C++ program, srun starting torchrun, a
Kubernetes PyTorchJob pod), and rank_table's joins over given samples.

The trees here are input data for ``RankFinder.update`` (PIDs above any real one, environments
handed in through its ``read_env`` parameter): the real-process tests are in tests/test_ranks.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from gputop.derive.ranks import rank_table
from gputop.model import Sample
from gputop.sources.host import HostSource
from gputop.sources.ranks import EnvironNotReady, RankFinder, gpu_hint, rank_env
from gputop.sources.target import Target

BASE = 4_000_000_000   # no real PID is this big: /proc has nothing for these


def pid(n: int) -> int:
    return BASE + n


PY = ["/usr/bin/python3", "train.py"]
TORCHRUN = ["/usr/bin/python3", "-m", "torch.distributed.run"]
ELASTIC = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0", "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}


class Tree:
    """A process tree and the environments of its processes, as RankFinder would read them."""

    def __init__(self) -> None:
        self.procs: dict[int, tuple] = {}
        self.envs: dict[int, dict] = {}

    def add(self, n: int, parent: int | None, cmdline: list[str], env: dict | None = None, name: str | None = None):
        self.procs[pid(n)] = (pid(parent) if parent is not None else 1, name or os.path.basename(cmdline[0]), cmdline)
        self.envs[pid(n)] = env or {}

    def remove(self, n: int) -> None:
        self.procs.pop(pid(n))

    def read_env(self, p: int) -> dict:
        env = self.envs[p]
        if env is PermissionError:
            raise PermissionError(13, "Permission denied")
        if isinstance(env, list):   # reads in turn (EnvironNotReady: a read mid-exec)
            got = env.pop(0) if len(env) > 1 else env[0]
            if got is EnvironNotReady:
                raise EnvironNotReady("mid-exec")
            return got
        return env


def finder(tree: Tree, **kw) -> RankFinder:
    return RankFinder(pid(0), node="n1", read_env=tree.read_env, **kw)


def ranks_of(samples) -> dict[int, tuple]:
    return {s.data["pid"] - BASE: (s.data["rank"], s.data["state"]) for s in samples}


# ---------------------------------------------------------------------------------------------
# Environments


def test_rank_env_families():
    e = rank_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", **{
        "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_RESTART_COUNT": "2", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}})
    assert (e["family"], e["rank"], e["world_size"], e["local_rank"], e["local_world_size"]) == ("torch", 3, 8, 1, 4)
    assert e["certain"] and e["restart_count"] == 2 and e["cuda_visible_devices"] == "0,1,2,3"
    assert rank_env({"RANK": "3"})["certain"] is False          # could be a PyTorchJob pod's launcher
    o = rank_env({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                  "OMPI_COMM_WORLD_LOCAL_SIZE": "8"})
    assert (o["family"], o["rank"], o["world_size"], o["local_rank"], o["local_world_size"], o["certain"]) == \
        ("openmpi", 5, 16, 1, 8, True)
    p = rank_env({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"})
    assert (p["family"], p["rank"], p["world_size"], p["local_rank"], p["certain"]) == ("pmi", 2, 4, 0, False)
    # Slurm: only inside a job step; a batch script has SLURM_PROCID=0 as well.
    assert rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is None
    s = rank_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"})
    assert (s["family"], s["rank"], s["world_size"], s["local_rank"]) == ("slurm", 1, 2, 1)
    # torchrun under srun: torch's own RANK wins.
    assert rank_env({"RANK": "5", "WORLD_SIZE": "8", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"})["rank"] == 5
    for bad in ({}, {"RANK": ""}, {"RANK": "-1"}, {"RANK": "x"}, {"LOCAL_RANK": "0"}):
        assert rank_env(bad) is None, bad
    assert rank_env({"RANK": "0", "WORLD_SIZE": "two"})["world_size"] is None   # not a made-up number


def test_gpu_hint():
    assert gpu_hint(2, None) == "2"                      # the usual cuda:LOCAL_RANK
    assert gpu_hint(2, "5") == "5"                       # one visible device: that one
    assert gpu_hint(1, "4,5,6,7") == "5"
    assert gpu_hint(5, "4,5") is None                    # not enough devices: no guess
    assert gpu_hint(0, "GPU-8fa1c2d3-aaaa") == "GPU-8fa1c2d3-aaaa"
    assert gpu_hint(0, "") is None and gpu_hint(0, "-1") is None and gpu_hint(None, None) is None


# ---------------------------------------------------------------------------------------------
# Trees


def test_torchrun_workers_are_ranks_at_once_and_their_dataloader_workers_are_not():
    t = Tree()
    t.add(0, None, TORCHRUN)
    for r in range(2):
        t.add(10 + r, 0, PY, {**ELASTIC, "RANK": str(r), "LOCAL_RANK": str(r)})
        t.add(20 + r, 10 + r, PY, {**ELASTIC, "RANK": str(r), "LOCAL_RANK": str(r)}, name="pt_data_worker")
    f = finder(t)
    out = f.update(0.0, t.procs)
    assert ranks_of(out) == {10: (0, "running"), 11: (1, "running")}
    d = out[0].data
    assert (d["launcher_pid"], d["node"], d["source"], d["local_world_size"], d["gpu"], d["gpu_hint"]) == \
        (pid(0), "n1", "env", 2, None, "0")
    assert f.update(0.5, t.procs) == []                  # nothing changed: nothing said
    assert f.env_reads == 5                               # each process's environment once


def test_a_wrapper_shell_is_not_the_rank_its_python_child_is():
    t = Tree()
    t.add(0, None, TORCHRUN)
    t.add(10, 0, ["/bin/bash", "wrap.sh"], {**ELASTIC, "RANK": "0"})
    f = finder(t)
    assert f.update(0.0, t.procs) == [] and f.update(1.0, t.procs) == []   # waiting for its Python child
    t.add(11, 10, PY, {**ELASTIC, "RANK": "0"})
    assert ranks_of(f.update(1.5, t.procs)) == {11: (0, "running")}


def test_mpirun_ranks_without_python_are_declared_after_the_wrapper_grace():
    t = Tree()
    t.add(0, None, ["/usr/bin/mpirun", "-np", "2", "./solver"])
    for r in range(2):
        t.add(10 + r, 0, ["./solver"], {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2"})
    f = finder(t)
    assert f.update(0.0, t.procs) == [] and f.update(1.9, t.procs) == []
    assert ranks_of(f.update(2.1, t.procs)) == {10: (0, "running"), 11: (1, "running")}


def test_a_launcher_that_carries_a_rank_is_not_one():
    # srun starts one torchrun per node: it has SLURM_PROCID (the node's index) in a job step.
    t = Tree()
    t.add(0, None, ["/usr/bin/srun", "torchrun"])
    t.add(1, 0, TORCHRUN, {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"})
    f = finder(t)
    assert f.update(0.0, t.procs) == [] and f.update(3.0, t.procs) == []   # it might start ranks: wait
    for r in range(2):
        t.add(10 + r, 1, PY, {**ELASTIC, "RANK": str(r), "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"})
    assert ranks_of(f.update(3.5, t.procs)) == {10: (0, "running"), 11: (1, "running")}
    assert f.update(9.0, t.procs) == []                  # and torchrun never becomes one
    # A PyTorchJob pod: torchrun has RANK = the node's rank; with one process per node its
    # worker has the same RANK and WORLD_SIZE, plus torchrun's own markers.
    t = Tree()
    t.add(1, None, TORCHRUN, {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0"})
    f = finder(t)
    assert f.update(0.0, t.procs) == []
    t.add(10, 1, PY, {**ELASTIC, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    assert ranks_of(f.update(3.0, t.procs)) == {10: (1, "running")}
    assert f.update(9.0, t.procs) == []


def test_a_rank_set_by_hand_waits_the_grace_then_counts():
    t = Tree()
    t.add(0, None, ["/bin/sh", "launch.sh"])
    t.add(10, 0, PY, {"RANK": "0", "WORLD_SIZE": "1"})
    f = finder(t)
    assert f.update(0.0, t.procs) == [] and f.update(4.9, t.procs) == []
    assert ranks_of(f.update(5.1, t.procs)) == {10: (0, "running")}


def test_ranks_end_restart_and_are_repeated_for_replays():
    t = Tree()
    t.add(0, None, TORCHRUN)
    t.add(10, 0, PY, {**ELASTIC, "RANK": "0"})
    f = finder(t, repeat_s=30.0)
    assert ranks_of(f.update(0.0, t.procs)) == {10: (0, "running")}
    again = f.update(31.0, t.procs)                      # the same facts, said again after repeat_s
    assert ranks_of(again) == {10: (0, "running")}
    t.remove(10)                                         # torchrun restarts the worker: a new process
    t.add(11, 0, PY, {**ELASTIC, "RANK": "0", "TORCHELASTIC_RESTART_COUNT": "1"})
    out = f.update(32.0, t.procs)
    assert ranks_of(out) == {10: (0, "exited"), 11: (0, "running")}
    ended = next(s.data for s in out if s.data["pid"] == pid(10))
    assert ended["why"] == "exited"
    assert next(s.data for s in out if s.data["pid"] == pid(11))["restart_count"] == 1
    assert f.running == [pid(11)]
    out = f.end_all(40.0)
    assert ranks_of(out) == {11: (0, "exited")}


def test_unreadable_environments_are_counted_not_guessed():
    t = Tree()
    t.add(0, None, TORCHRUN)
    t.add(10, 0, PY)
    t.envs[pid(10)] = PermissionError
    f = finder(t)
    assert f.update(0.0, t.procs) == [] and f.denied == {pid(10)}
    t.remove(10)
    f.update(1.0, t.procs)
    assert f.denied == set()


def test_host_health_says_when_an_environment_cannot_be_read(tmp_path):
    """The host source on a real tree. This kernel lets root read every /proc/PID/environ, even
    without CAP_SYS_PTRACE and of a non-dumpable process of another user (tried), so the refusal
    is handed in at the read: the rest (health, no guessed rank) is the real source."""
    child = [sys.executable, "-c", "import time; time.sleep(30)"]
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess,sys; subprocess.run(sys.argv[1:])", *child],
                            env=dict(os.environ, RANK="0", WORLD_SIZE="1"))
    kid = None
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not psutil.Process(proc.pid).children():
            time.sleep(0.05)
        kid = psutil.Process(proc.pid).children()[0].pid
        samples: list = []

        class Clock:
            t0 = time.monotonic()

            def now(self):
                return time.monotonic() - self.t0

        host = HostSource(Clock(), Target(proc.pid), interval_s=0.2)
        real = host.ranks.read_env

        def read_env(p):
            if p == kid:
                raise PermissionError(13, "Permission denied")
            return real(p)
        host.ranks.read_env = read_env
        host.start(samples.append)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                s.kind == "health" and "not readable" in (s.get("message") or "") for s in list(samples)):
            time.sleep(0.1)
        host.stop()
    finally:
        for p in (kid, proc.pid):   # the child first: killing its parent first would orphan it
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
        proc.wait()
    msgs = [s.get("message") for s in samples if s.kind == "health"]
    assert any(f"environment of PID {kid} not readable" in (m or "") and "probe" in m for m in msgs), msgs
    # The launcher (RANK=0 in its readable environment, no rank below it that we could see)
    # is declared only after the grace: within this short run nothing is a rank.
    assert not [s for s in samples if s.kind == "rank"]


# ---------------------------------------------------------------------------------------------
# rank_table over given samples


def _rank(t, p, rank, state="running", **kw):
    d = {"pid": p, "rank": rank, "local_rank": rank, "world_size": 2, "local_world_size": 2, "node": "n1",
         "gpu": None, "gpu_hint": None, "cuda_visible_devices": None, "source": "env", "rank_var": "RANK",
         "restart_count": 0, "state": state, "launcher_pid": 1, "name": "python", "why": None}
    d.update(kw)
    return Sample(t, "rank", str(p), d)


def test_rank_table_gpu_from_nvml_then_the_environment():
    samples = [
        _rank(1.0, 100, 0), _rank(1.0, 101, 1, gpu_hint="GPU-8fa1c2d3"),
        Sample(1.0, "gpu_info", "0", {"uuid": "GPU-1111aaaa-0000"}),
        Sample(1.0, "gpu_info", "1", {"uuid": "GPU-8fa1c2d3-4444"}),
        # rank 0 runs on GPU 1 (NVML says so) and holds a little memory on GPU 0 too
        Sample(9.5, "gpu_procs", "1", {"procs": {"100": {"mem": 8 << 30, "sm_pct": None}}}),
        Sample(9.5, "gpu_procs", "0", {"procs": {"100": {"mem": 500 << 20, "sm_pct": None}}}),
        Sample(9.8, "gpu", "1", {"sm_active": 71.0, "util_gpu": 99.0}),
        Sample(9.9, "gpu", "1", {"sm_active": None, "util_gpu": 98.0}),   # GPM not read this time
    ]
    rows = {r["rank"]: r for r in rank_table(samples, 10.0)}
    assert (rows[0]["gpu"], rows[0]["gpu_from"], rows[0]["gpus"], rows[0]["gpu_mem"]) == ("1", "nvml", ["1", "0"], 8 << 30)
    assert rows[0]["sm_active"] == 71.0 and rows[0]["util_gpu"] == 98.0
    assert (rows[1]["gpu"], rows[1]["gpu_from"]) == ("1", "env")    # UUID prefix from CUDA_VISIBLE_DEVICES
    # Without any GPU in the session the hint is not shown as a GPU.
    rows = rank_table([_rank(1.0, 100, 0, gpu_hint="0")], 2.0)
    assert rows[0]["gpu"] is None and rows[0]["sm_active"] is None
    # A stale GPU sample is no current value.
    rows = {r["rank"]: r for r in rank_table(samples, 30.0)}
    assert rows[0]["sm_active"] is None and rows[0]["gpu"] is None


def test_rank_table_exited_rank_keeps_its_last_values_and_sorts_after():
    ts = lambda t, p, coll: Sample(t, "thread_state", f"{p}:{p}", {"collective_pct": coll, "running_pct": 10.0})  # noqa: E731
    samples = [
        _rank(1.0, 100, 0), ts(4.0, 100, 50.0), ts(6.0, 100, 60.0),
        _rank(6.5, 100, 0, state="exited", why="exited"),
        ts(8.0, 100, 5.0),          # derived after the exit over a shrinking window: not the rank's state
        _rank(7.0, 102, 0, restart_count=1), ts(8.0, 102, 1.0),
        Sample(7.5, "probe_step", "102", {"steps_per_s": 0.0, "step_ms_mean": None, "data_wait_share": None}),
    ]
    rows = rank_table(samples, 8.5)
    assert [(r["pid"], r["state"]) for r in rows] == [(102, "running"), (100, "exited")]
    assert rows[1]["collective_pct"] == 60.0 and rows[1]["why"] == "exited"
    assert rows[0]["steps_per_s"] == 0.0 and rows[0]["step_ms"] is None   # a real zero stays a zero
    assert rows[0]["restart_count"] == 1


def test_an_environment_read_mid_exec_is_read_again_at_the_next_tick():
    """A read of /proc/PID/environ inside the process's exec gives nothing (ranks.EnvironNotReady):
    not "no rank" for the process's life (its name and command line do not change again), but a
    read again at the next tick, which names the rank."""
    t = Tree()
    t.add(0, None, TORCHRUN)
    t.add(1, 0, PY, {"RANK": "0", "LOCAL_RANK": "0", **ELASTIC})
    t.envs[pid(1)] = [EnvironNotReady, {"RANK": "0", "LOCAL_RANK": "0", **ELASTIC}]
    f = finder(t)
    assert ranks_of(f.update(0.0, t.procs)) == {}
    assert ranks_of(f.update(1.0, t.procs)) == {1: (0, "running")}
