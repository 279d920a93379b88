"""A real Prometheus server scrapes a live gputop session, and the test asks Prometheus for it.

The chain, all real and all on loopback: the bundled input-bound workload (torch on the CPU,
two DataLoader workers) started with the in-process probe and ``RANK=3`` in its environment;
``gputop --pid PID --headless --prometheus 127.0.0.1:PORT`` watching it; Debian's ``prometheus``
(``/usr/bin/prometheus``) started with a temporary config that scrapes gputop every second and a
temporary storage directory. Then the test queries Prometheus's HTTP API (``/api/v1/query``) for
gputop's series: host metrics, thread states, probe timings with their rank, a verdict.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from gputop.session.launch import launch_with_probe
from gputop.verdicts.rules import VERDICT_IDS

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RANK = "3"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prom:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = json.load(urllib.request.urlopen(url, timeout=5))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait(self, expr: str, ok, timeout: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.query(expr)
                if ok(last):
                    return last
            except OSError as e:  # Prometheus still starting
                last = e
            time.sleep(0.5)
        raise AssertionError(f"{what}: Prometheus never answered {expr!r} as expected in {timeout:g} s; last: {last}")


def val(series: dict) -> float:
    return float(series["value"][1])


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} not found: this test needs a real Prometheus server (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("prom")
    gport, pport = _free_port(), _free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: gputop\n    static_configs:\n      - targets: ['127.0.0.1:{gport}']\n")
    workload = launch_with_probe([sys.executable, "-m", "gputop.demo.workload", "--scenario", "input_bound",
                                  "--duration", "240"], env=dict(os.environ, RANK=RANK),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gputop = subprocess.Popen([sys.executable, "-m", "gputop", "--pid", str(workload.pid), "--headless",
                               "--duration", "210", "--prometheus", f"127.0.0.1:{gport}",
                               "--record", str(tmp / "live.gtrec")],
                              stdout=subprocess.DEVNULL, stderr=open(tmp / "gputop.err", "w"))
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{pport}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))
    try:
        yield {"prom": Prom(pport), "pid": str(workload.pid), "instance": f"127.0.0.1:{gport}", "tmp": tmp,
               "gputop": gputop}
    finally:
        for p in (prom, gputop, workload):
            if p.poll() is None:
                p.terminate()
        for p in (prom, gputop, workload):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.mark.timeout(240)   # the waits below, on a loaded machine; gputop and its target outlast them
def test_prometheus_scrapes_gputop(chain):
    prom, pid = chain["prom"], chain["pid"]
    up = prom.wait('up{job="gputop"}', lambda r: r and val(r[0]) == 1, 30, "the scrape of gputop")
    assert up[0]["metric"]["instance"] == chain["instance"]

    # host metrics, in Prometheus units
    host = prom.wait("gputop_host_cpu_utilization_ratio", lambda r: len(r) == 1, 15, "host CPU")
    assert 0 <= val(host[0]) <= 1
    assert host[0]["metric"]["host"] == socket.gethostname()
    cores = prom.query("gputop_host_cpus")
    assert val(cores[0]) == os.cpu_count()
    # gputop's health: no NVIDIA driver here, and it says so instead of serving GPU zeros
    assert val(prom.query('gputop_source_up{source="nvml"}')[0]) == 0
    assert val(prom.query('gputop_source_up{source="host"}')[0]) == 1
    assert prom.query('{__name__=~"gputop_gpu_.*"}') == []

    # the probe's timings, with the rank the job runs as; DataLoader workers inherit it
    steps = prom.wait(f'gputop_probe_steps_per_second{{pid="{pid}"}}', lambda r: r and val(r[0]) > 0, 40,
                      "probe steps/s")
    assert steps[0]["metric"]["rank"] == RANK
    workers = prom.wait('gputop_process_cpu_seconds_per_second{role="dataloader_worker"}', lambda r: len(r) == 2,
                        20, "two DataLoader workers")
    assert {w["metric"]["rank"] for w in workers} == {RANK}
    total = prom.query(f'gputop_probe_steps_total{{pid="{pid}"}}')
    assert val(total[0]) >= 1
    if importlib.util.find_spec("gputop.sources.ranks") is not None:  # ranks from the environment (issue 5)
        info = prom.wait(f'gputop_rank_info{{pid="{pid}"}}', lambda r: len(r) == 1, 20, "rank info")
        assert info[0]["metric"]["rank"] == RANK

    # thread states of the main thread: shares of one window, summing to 1
    shares = prom.wait(f'gputop_thread_state_ratio{{pid="{pid}",tid="{pid}"}}', lambda r: len(r) == 8, 20,
                       "main thread states")
    assert sum(val(s) for s in shares) == pytest.approx(1.0, abs=0.02)
    assert {s["metric"]["state"] for s in shares} == {"running", "gil", "data", "cuda", "collective", "idle",
                                                       "cpu_wait", "unknown"}

    # verdicts: every known id has a series; the workload's own bottleneck turns on
    ids = prom.wait("gputop_verdict_active", lambda r: len(r) >= len(VERDICT_IDS), 20, "verdict gauges")
    assert {s["metric"]["verdict"] for s in ids} >= set(VERDICT_IDS)
    # (on a 2-core box running the rest of the suite beside it, the workload's main thread also
    # waits for a core, and its data-wait share took longer than 45 s to hold: 2 runs of 5 here)
    active = prom.wait('gputop_verdict_active{verdict="input_bound"} == 1', lambda r: len(r) == 1, 90,
                       "the input_bound verdict")
    assert active[0]["metric"]["pid"] == pid
    share = prom.query('gputop_verdict_lost_share_ratio{verdict="input_bound"}')
    assert 0 < val(share[0]) <= 1
