"""What the agent benchmarks share: a training job to watch, the agent as a child, its CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# A small training loop: on a GPU, bf16 matmuls; on the CPU, a small MLP fed by a slow
# DataLoader (input-bound, cheap on a loaded machine). It prints nothing.
JOB = r"""
import sys, time, torch
seconds = float(sys.argv[1])
dev = "cuda" if torch.cuda.is_available() else "cpu"
if dev == "cuda":
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-6)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            (x @ w).float().square().mean().backward()
            opt.step(); opt.zero_grad()
        torch.cuda.synchronize()
else:
    class Slow(torch.utils.data.Dataset):
        def __len__(self): return 10**9
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.randn(64), torch.randn(1)
    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dl = torch.utils.data.DataLoader(Slow(), batch_size=16, num_workers=1)
    end = time.monotonic() + seconds
    for xb, yb in dl:
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step(); opt.zero_grad()
        if time.monotonic() > end:
            break
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(tmpdir: str, name: str, seconds: float, probe: bool = False) -> subprocess.Popen:
    """A job under a script of its own name (the agent's --match finds it by that)."""
    path = os.path.join(tmpdir, f"{name}.py")
    with open(path, "w") as f:
        f.write(JOB)
    argv = [sys.executable, path, str(seconds)]
    if probe:
        sys.path.insert(0, ROOT)
        from gputop.session.launch import launch_with_probe

        return launch_with_probe(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_agent(port: int, match: str, log_path: str, extra: list[str] | None = None, only_match: bool = True):
    argv = [sys.executable, "-m", "gputop", "agent", "--prometheus", f"127.0.0.1:{port}", "--match", match,
            *(["--only-match"] if only_match else []), *(extra or [])]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"), env=env, cwd=ROOT)


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children now (py-spy's windows, reaped, included)."""
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for c in p.children(recursive=True):
            try:
                ct = c.cpu_times()
                total += ct.user + ct.system
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return float("nan")


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def jobs_served(port: int) -> dict[str, str]:
    """training_job -> found_by, from gputop_agent_job_info."""
    out = {}
    try:
        text = scrape(port)
    except OSError:
        return out
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        if fam.name == "gputop_agent_job_info":
            for s in fam.samples:
                out[s.labels["training_job"]] = s.labels["found_by"]
    return out


def wait_until(cond, timeout: float, step: float = 0.5) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return False


def write_json(outdir: str, name: str, data: dict) -> str:
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, name)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    return path
