"""gputop attached to a torchrun launcher on the GPU machine: are all ranks found, on which GPU,
with what SM active?

    python benchmarks/ranks_h200.py OUT_DIR [--nproc 2] [--backend gloo|nccl] [--slow-rank 1]
                                            [--slow-ms 30] [--train-s 12] [--watch-s 25] [--device cpu]

Starts ``python -m torch.distributed.run --nproc-per-node N tests/workloads/ranks_train.py
--device cuda`` with gputop's in-process probe loaded (as ``gputop run`` would), every rank on
``cuda:(LOCAL_RANK % device count)`` -- on the one-H200 machine both ranks share GPU 0. The
backend is gloo on CUDA tensors by default: NCCL refuses two ranks of one communicator on the same
GPU ("Duplicate GPU detected"); ``--backend nccl`` tries it anyway and the log says what happened.
One rank (``--slow-rank``) sleeps ``--slow-ms`` per step before its metric all-reduce, so the
other ranks wait for it.

Right after the launch it runs ``python -m gputop --pid LAUNCHER --headless --duration WATCH_S
--record OUT_DIR/ranks.gtrec --json`` (which stops by itself ~1.5 s after the job exits), then
prints one line per rank: PID, rank, GPU (from NVML's process list, or "?" from the environment),
SM active (mean over the recording, and live from rank_table in the middle of training),
steps/s and the main thread's collective/idle shares. Writes OUT_DIR/ranks_h200.json (the
report's "ranks" section, the mid-training rank_table, timings), OUT_DIR/report.json,
OUT_DIR/job.log and OUT_DIR/gputop.err.

Never hangs: every wait has a timeout, the job runs in its own process group and is killed at
the end whatever happened; the whole run takes well under 60 s (job start-up ~10 s, training
``--train-s``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gputop.session.launch import launch_with_probe  # noqa: E402

HARD_LIMIT_S = 55.0


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def mid_training_table(path: str) -> tuple[float | None, list[dict]]:
    """rank_table in the middle of the recording's training (probe steps seen), from a replay."""
    from gputop.derive.ranks import rank_table
    from gputop.derive.threads import ThreadStateProcessor
    from gputop.session.recording import RecordingReader
    from gputop.session.replay import ReplaySession

    steps = [s.t for s in RecordingReader(path).all_samples() if s.kind == "probe_step" and s.get("steps")]
    if not steps:
        return None, []
    t = steps[int(len(steps) * 0.75)]
    session = ReplaySession(path, processors=[ThreadStateProcessor()], start_playing=False)
    try:
        session.seek(t)
        return t, rank_table(session.store, session.now())
    finally:
        session.stop()


def fmt(v, unit="", nd=0):
    return "n/a" if v is None else f"{v:.{nd}f}{unit}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--slow-ms", type=float, default=30.0)
    ap.add_argument("--train-s", type=float, default=12.0)
    ap.add_argument("--watch-s", type=float, default=25.0)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--gpu-matmuls", type=int, default=6)
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only to try the script without a GPU")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.monotonic()
    rec = os.path.join(a.out, "ranks.gtrec")
    if os.path.exists(rec):
        os.unlink(rec)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--monitor-interval", "0.2", "--nproc-per-node", str(a.nproc),
           os.path.join(ROOT, "tests", "workloads", "ranks_train.py"), "--device", a.device, "--backend", a.backend,
           "--dim", str(a.dim), "--batch-size", "128", "--gpu-matmuls", str(a.gpu_matmuls), "--step-ms", "0",
           "--slow-rank", str(a.slow_rank), "--slow-ms", str(a.slow_ms), "--duration", str(a.train_s),
           "--out", os.path.join(a.out, "own")]
    log = open(os.path.join(a.out, "job.log"), "w")
    job = launch_with_probe(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    result: dict = {"command": cmd, "launcher_pid": job.pid, "backend": a.backend, "nproc": a.nproc}
    try:
        gcmd = [sys.executable, "-m", "gputop", "--pid", str(job.pid), "--headless", "--duration", str(a.watch_s),
                "--record", rec, "--json"]
        err = open(os.path.join(a.out, "gputop.err"), "w")
        try:
            g = subprocess.run(gcmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                               timeout=max(5.0, HARD_LIMIT_S - 10 - (time.monotonic() - t0)))
            result["gputop_rc"] = g.returncode
            report = json.loads(g.stdout) if g.returncode == 0 and g.stdout.strip() else None
        except subprocess.TimeoutExpired:
            result["gputop_rc"] = "timeout"
            report = None
        finally:
            err.close()
        try:
            job.wait(timeout=max(1.0, HARD_LIMIT_S - 8 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            pass
        result["job_rc"] = job.poll()
    finally:
        kill_group(job)
        log.close()
    result["wall_s"] = round(time.monotonic() - t0, 1)
    if report is None:
        print(f"gputop gave no report (rc {result.get('gputop_rc')}): see {a.out}/gputop.err and job.log")
        tail = open(os.path.join(a.out, "job.log")).read()[-1500:]
        print(tail)
        json.dump(result, open(os.path.join(a.out, "ranks_h200.json"), "w"), indent=2)
        return 1
    json.dump(report, open(os.path.join(a.out, "report.json"), "w"), indent=2)
    sec = report.get("ranks") or {}
    result["report_ranks"] = sec
    result["gpus"] = [{"index": g.get("index"), "name": g.get("name"),
                       "sm_active_mean": ((g.get("metrics") or {}).get("sm_active") or {}).get("mean")}
                      for g in report.get("gpus") or []]
    t_mid, rows = (None, [])
    if time.monotonic() - t0 < HARD_LIMIT_S - 3:
        try:
            t_mid, rows = mid_training_table(rec)
        except Exception as e:   # a broken replay must not lose the rest
            result["mid_error"] = f"{type(e).__name__}: {e}"
    result["mid_t"] = t_mid
    result["mid_rows"] = rows
    own = {}
    for r in range(a.nproc):
        try:
            own[r] = json.load(open(os.path.join(a.out, f"own.{r}")))
        except (OSError, ValueError):
            pass
    result["own"] = own
    json.dump(result, open(os.path.join(a.out, "ranks_h200.json"), "w"), indent=2, default=str)

    print(f"torchrun --nproc-per-node {a.nproc} ({a.backend}, slow rank {a.slow_rank} +{a.slow_ms:g} ms/step); "
          f"gputop rc {result['gputop_rc']}, job rc {result['job_rc']}, wall {result['wall_s']} s")
    print(f"ranks found: {sec.get('distinct_ranks')} in {sec.get('processes')} process(es), world size "
          f"{sec.get('world_sizes')}, ended {sec.get('ended')} (expected {a.nproc})")
    live = {x["pid"]: x for x in rows}
    print(f"{'rank':>4} {'pid':>8} {'gpu':>4} {'from':>5} {'SM mean':>8} {'SM live':>8} {'steps/s':>8} "
          f"{'own st/s':>8} {'coll':>6} {'idle':>6} {'sync':>6}  state")
    for x in sec.get("ranks") or []:
        m = live.get(x["pid"], {})
        mine = own.get(x.get("rank"), {})
        print(f"{x.get('rank')!s:>4} {x['pid']:>8} {x.get('gpu')!s:>4} {x.get('gpu_from')!s:>5} "
              f"{fmt(x.get('sm_active_mean'), '%'):>8} {fmt(m.get('sm_active'), '%'):>8} "
              f"{fmt(x.get('steps_per_s'), '', 2):>8} {fmt(mine.get('steps_per_s'), '', 2):>8} "
              f"{fmt(x.get('collective_pct'), '%'):>6} {fmt(x.get('idle_pct'), '%'):>6} {fmt(x.get('cuda_pct'), '%'):>6}"
              f"  {x.get('state')}")
    ok = sec.get("distinct_ranks") == a.nproc and (a.device != "cuda" or all(
        x.get("gpu") is not None for x in sec.get("ranks") or []))
    what = "every rank found" + (" with its GPU" if a.device == "cuda" else "")
    print(f"OK: {what}" if ok else f"NOT OK: not {what} (see ranks_h200.json)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
