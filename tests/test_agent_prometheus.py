"""Two node agents, each watching a real CPU training job, scraped by one real Prometheus that
evaluates the shipped rules; the alert for the input-bound job fires (the alerts API says so).

All real and on loopback: two bundled torch workloads (CPU, DataLoader workers) started with the
probe, each under a script whose name only it has; two ``gputop agent --only-match NAME`` at their
default rates; Debian's ``prometheus`` with deploy/prometheus/gputop-rules.yml, its ``for:``
durations and group interval shortened in a test copy (the shipped file keeps 5 minutes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid

import pytest

from gputop.session.launch import launch_with_probe
from tests.test_prometheus_live import PROMETHEUS, Prom, _free_port, val

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "deploy", "prometheus", "gputop-rules.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "gputop.json")
JOB_SCRIPT = "import sys\nfrom gputop.demo.workload import main\nsys.exit(main(sys.argv[1:]))\n"


def short_rules(text: str) -> str:
    """The shipped rules with every ``for:`` at 5 s and the recording group every 1 s."""
    text = re.sub(r"for: \d+[smh]", "for: 5s", text)
    return text.replace("interval: 15s", "interval: 1s")


def dashboard_series() -> set[str]:
    from tests.test_agent_dashboard import dashboard_exprs, series_names

    return {n for e in dashboard_exprs() for n in series_names(e)}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} not found: this test needs a real Prometheus server (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("fleet")
    tok = uuid.uuid4().hex[:8]
    jobs, agents, ports = {}, [], []
    procs = []
    try:
        for name, scenario in (("input", "input_bound"), ("mlp", "default")):
            script = tmp / f"job_{name}_{tok}.py"
            script.write_text(JOB_SCRIPT)
            p = launch_with_probe([sys.executable, str(script), "--scenario", scenario, "--duration", "240"],
                                  env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            procs.append(p)
            jobs[name] = (p.pid, script.name)
            port = _free_port()
            ports.append(port)
            a = subprocess.Popen([sys.executable, "-m", "gputop", "agent", "--prometheus", f"127.0.0.1:{port}",
                                  "--match", re.escape(script.name), "--only-match", "--scan", "1",
                                  "--state-dir", str(tmp / f"state-{name}"), "--duration", "230"],
                                 stdout=subprocess.DEVNULL, stderr=open(tmp / f"agent-{name}.err", "w"))
            procs.append(a)
            agents.append(a)
        (tmp / "rules.yml").write_text(short_rules(open(RULES).read()))
        pport = _free_port()
        targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
        (tmp / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: ['{tmp / 'rules.yml'}']\n"
            f"scrape_configs:\n  - job_name: gputop\n    static_configs:\n      - targets: [{targets}]\n")
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{pport}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))
        procs.append(prom)
        yield {"prom": Prom(pport), "jobs": jobs, "ports": ports, "tmp": tmp, "agents": agents}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def alerts(prom: Prom) -> list[dict]:
    body = json.load(urllib.request.urlopen(f"{prom.base}/api/v1/alerts", timeout=5))
    assert body["status"] == "success", body
    return body["data"]["alerts"]


@pytest.mark.timeout(240)
def test_two_agents_one_prometheus_the_input_bound_alert_fires(fleet):
    prom, jobs = fleet["prom"], fleet["jobs"]
    prom.wait('up{job="gputop"} == 1', lambda r: len(r) == 2, 30, "both agents scraped")
    # each agent watches its one job, named <script>-<pid>, found by --match
    info = prom.wait("gputop_agent_job_info", lambda r: len(r) == 2, 30, "one job per agent")
    want = {f"{script}-{pid}": str(pid) for pid, script in jobs.values()}
    assert {s["metric"]["training_job"]: s["metric"]["pid"] for s in info} == want
    assert {s["metric"]["found_by"] for s in info} == {"match"}
    assert {s["metric"]["instance"] for s in info} == {f"127.0.0.1:{p}" for p in fleet["ports"]}
    input_job = f"{jobs['input'][1]}-{jobs['input'][0]}"
    # the recording rules see both jobs' steps/s (on a loaded 2-core box a step may take seconds,
    # and a probe window without a step has no steps/s: any value in the last minute)
    steps = prom.wait("max_over_time(gputop:job_steps_per_second[1m]) > 0", lambda r: len(r) == 2, 90,
                      "steps/s of both jobs")
    assert {s["metric"]["training_job"] for s in steps} == set(want)

    def firing(got):
        return [a for a in got if a["labels"].get("alertname") == "GputopVerdictActive"
                and a["labels"].get("verdict") == "input_bound" and a["labels"].get("training_job") == input_job
                and a["state"] == "firing"]

    import time
    deadline = time.monotonic() + 90
    got = []
    while time.monotonic() < deadline and not firing(got):
        got = alerts(prom)
        time.sleep(1)
    assert firing(got), f"no firing input_bound alert for {input_job}: {got}"
    a = firing(got)[0]
    assert a["labels"]["host"] and a["labels"]["severity"] == "warning"
    assert input_job in a["annotations"]["summary"]
    # the verdict gauges of the other agent's job carry its own label, never the first job's
    mlp = f"{jobs['mlp'][1]}-{jobs['mlp'][0]}"
    per_job = prom.query("count by (training_job, instance) (last_over_time(gputop_verdict_active[30s]))")
    assert {(s["metric"]["training_job"], s["metric"]["instance"]) for s in per_job} == {
        (input_job, f"127.0.0.1:{fleet['ports'][0]}"), (mlp, f"127.0.0.1:{fleet['ports'][1]}")}
    # the time budget exists once the agent's first py-spy window (20 s) has landed: the alert
    # can fire before that from the probe's data wait
    prom.wait("gputop:job_time_budget_share", lambda r: len(r) > 0, 60, "a time budget")
    # the dashboard's series (those a CPU job has) resolve against what Prometheus scraped;
    # the GPU ones are checked against an H200 replay in tests/test_agent_dashboard.py
    missing = [n for n in sorted(dashboard_series()) if not n.startswith(("gputop_gpu_", "gputop:job_gpu"))
               and not prom.query(f'count(last_over_time({{__name__="{n}"}}[1m]))')]
    assert missing == [], f"dashboard series Prometheus has no data for: {missing}"
    # rolling recordings went into the state directories, nowhere near the jobs' directory
    for name in ("input", "mlp"):
        recs = list((fleet["tmp"] / f"state-{name}").glob("*.gtrec"))
        assert len(recs) == 1 and recs[0].stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in fleet["tmp"].glob("*.gtrec")) == []
    # (over the last 30 s: on a loaded box a scrape may miss its 1 s timeout)
    assert val(prom.query("sum(max_over_time(gputop_agent_jobs_watched[30s]))")[0]) == 2
