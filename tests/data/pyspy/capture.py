"""Capture real py-spy output of small scenes, as test data for the frame classification rules.

    python tests/data/pyspy/capture.py [--out tests/data/pyspy] [--gpu] [--scenes waits,item,...]

For each scene (tests/workloads/stacks_scenes.py, stacks_dataloader.py) it runs the real
``py-spy record --nonblocking --idle --threads -f speedscope -r 20 -d 2`` against the scene and
writes, untouched, ``SCENE.speedscope.json``, plus ``SCENE.meta.json``: the scene's PID, its
threads' native ids by name, the category each thread is *known* to be in (from what the
scene does, not from the classifier), and the source text of every line in the capture (so
the line rules can be tested on a machine where those files live elsewhere).

``--gpu`` adds the CUDA scenes (torch.cuda.synchronize(), loss.item()): run it on the GPU
machine and commit the files it writes; tests/test_threads_rules.py picks them up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
from gputop.sources.stacks import find_pyspy, pyspy_version  # noqa: E402

WL = ROOT / "tests" / "workloads"

# scene -> (command, thread name -> known category, py-spy --subprocesses?)
SCENES = {
    "waits": ([str(WL / "stacks_scenes.py"), "waits"],
              {"sleeper": "idle", "queue_get": "idle", "event_wait": "idle", "lock_acquire": "idle",
               "select": "idle", "socket_accept": "idle", "pipe_read": "python", "spinner": "python",
               "main": "python"}, False),
    "dataloader": ([str(WL / "stacks_dataloader.py"), "--workers", "2", "--batch", "8", "--sample-ms", "5",
                    "--step-ms", "1"], {"main": "data"}, True),
    "item": ([str(WL / "stacks_scenes.py"), "item"], {"main": "cuda"}, False),
    "gloo": ([str(WL / "stacks_scenes.py"), "gloo"], {"main": "collective"}, False),
    "cuda": ([str(WL / "stacks_scenes.py"), "cuda"], {"main": "cuda"}, False),
    "cuda-item": ([str(WL / "stacks_scenes.py"), "cuda-item"], {"main": "cuda"}, False),
}
GPU_SCENES = ("cuda", "cuda-item")


def capture(name: str, out: pathlib.Path, pyspy: str) -> None:
    cmd, expect, subs = SCENES[name]
    proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        first = json.loads(proc.stdout.readline() or "{}")
        if "pid" not in first:
            raise RuntimeError(f"{name}: scene did not start: {proc.stderr.read()[-2000:]}")
        pid = first["pid"]
        threads = first.get("threads") or {"main": pid}
        time.sleep(3.0 if name == "dataloader" else 1.0)
        path = out / f"{name}.speedscope.json"
        args = [pyspy, "record", "--nonblocking", "--idle", "--threads", "-f", "speedscope", "-r", "20", "-d", "2",
                "-o", str(path), "-p", str(pid)]
        if subs:
            args.append("--subprocesses")
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{name}: py-spy failed: {r.stderr[-1000:]}")
        doc = json.loads(path.read_text())
        lines = {}
        for f in doc["shared"]["frames"]:
            file, line = f.get("file") or "", f.get("line") or 0
            if file and line > 0 and f"{file}:{line}" not in lines:
                try:
                    text = pathlib.Path(file).read_text(errors="replace").splitlines()[line - 1].strip()
                except (OSError, IndexError):
                    continue
                lines[f"{file}:{line}"] = text
        meta = {"scene": name, "pid": pid, "threads": threads, "expect": expect, "lines": lines,
                "command": " ".join(["python", *[pathlib.Path(c).name if "/" in c else c for c in cmd]]),
                "pyspy_version": ".".join(map(str, pyspy_version(pyspy) or ())), "python": platform.python_version(),
                "captured": datetime.date.today().isoformat()}
        (out / f"{name}.meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {path} ({path.stat().st_size} bytes)")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--scenes", default="")
    a = ap.parse_args()
    pyspy = find_pyspy()
    if not pyspy:
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 1
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [s for s in a.scenes.split(",") if s] or [s for s in SCENES if a.gpu or s not in GPU_SCENES]
    for name in names:
        capture(name, out, pyspy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
