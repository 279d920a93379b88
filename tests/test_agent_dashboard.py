"""The shipped Grafana dashboard and Prometheus rules: valid, and naming only series gputop serves.

Every PromQL expression of deploy/grafana/gputop.json (panels and template variables) and of
deploy/prometheus/gputop-rules.yml is parsed for the series it names; each must be a series the
exporter really serves (the families of replayed H200 recordings, with GPU, GPM, probe, verdicts
and the time budget; the node agent's own families; gputop's process collector) or a recording
rule of the shipped file. ``promtool check rules`` must pass on the shipped file, whose
verdict alert keeps its 5 minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "deploy", "prometheus", "gputop-rules.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "gputop.json")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset"}


def series_names(expr: str) -> set[str]:
    """The series an expression selects: identifiers outside strings, label matchers, ranges and
    grouping clauses that are neither functions, aggregations nor keywords."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    out = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group(0) in PROMQL_WORDS:
            continue
        out.add(m.group(0))
    return out


def dashboard_exprs() -> list[str]:
    d = json.load(open(DASHBOARD))
    out = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), *\w+\)", v["query"]["query"])
            assert m, v["query"]
            out.append(m.group(1))
    return out


def rules():
    """The shipped rules file read by a small reader of its own layout (no YAML library in the
    test dependencies; promtool, below, checks it as Prometheus reads it): {"groups": [{"rules":
    [{record|alert, expr, for, annotations: {summary}}]}]}."""
    groups, rule, block = [], None, None
    for line in open(RULES).read().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        m = re.match(r"^(\s*)(- )?([a-z_]+):\s*(.*)$", line)
        if block is not None and (m is None or len(m.group(1)) > block[0]):
            rule["expr"] += " " + line.strip()
            continue
        block = None
        if m is None:
            continue
        indent, key, value = len(m.group(1)), m.group(3), m.group(4).strip()
        if key == "name" and m.group(2):
            groups.append({"rules": []})
        elif key in ("record", "alert") and m.group(2):
            rule = {key: value, "annotations": {}}
            groups[-1]["rules"].append(rule)
        elif rule is not None and key == "expr":
            if value == "|":
                rule["expr"], block = "", (indent,)
            else:
                rule["expr"] = value
        elif rule is not None and key in ("for", "summary", "severity"):
            v = value[1:-1] if value.startswith('"') else value
            (rule["annotations"] if key == "summary" else rule)[key] = v
    return {"groups": groups}


def recorded_names() -> set[str]:
    return {r["record"] for g in rules()["groups"] for r in g["rules"] if "record" in r}


@pytest.fixture(scope="module")
def served() -> set[str]:
    """Sample names gputop's exporter and agent really serve."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gputop.agent.agent import Agent
    from gputop.agent.collector import AgentCollector
    from gputop.export.prometheus import collect_families
    from tests.test_prometheus import DATA, replay

    names = set()
    for rec in ("gpu_bound", "input_bound"):
        s = replay(DATA / "h200" / f"{rec}.gtrec", at=20.0)
        try:
            for fam in collect_families(s.store, s.now(), s.meta, "replay"):
                names |= {x.name for x in fam.samples}
        finally:
            s.stop()
    for fam in AgentCollector(Agent()).collect():
        names |= {x.name for x in fam.samples}
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(namespace="gputop_self", registry=reg)
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        names |= {x.name for x in fam.samples}
    assert "gputop_gpu_sm_active_ratio" in names and "gputop_time_budget_share" in names
    return names


def test_series_names_parser():
    assert series_names('max by (host, gpu) (gputop_gpu_power_watts{host=~"$host", a="b{c}"})') == {
        "gputop_gpu_power_watts"}
    assert series_names("gputop:x < 0.5 * gputop:x:avg1h and on (host) rate(y_total[5m]) > 1e3") == {
        "gputop:x", "gputop:x:avg1h", "y_total"}


def test_dashboard_is_valid_json_with_panels_per_node_job_rank():
    d = json.load(open(DASHBOARD))
    titles = [p["title"] for p in d["panels"]]
    assert {"Node", "Jobs: verdicts and throughput", "GPUs", "Ranks"} <= set(titles)
    assert {v["name"] for v in d["templating"]["list"]} >= {"host", "job"}
    exprs = " ".join(dashboard_exprs())
    for needed in ("gputop:job_verdict_active", "gputop:job_time_budget_share", "gputop_gpu_utilization_ratio",
                   "gputop:job_steps_per_second", "gputop_probe_steps_per_second"):
        assert needed in exprs
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


def test_every_dashboard_and_rule_query_names_served_series(served):
    known = served | recorded_names()
    for expr in dashboard_exprs():
        unknown = series_names(expr) - known
        assert not unknown, f"dashboard query {expr!r} names series gputop does not serve: {unknown}"
    for g in rules()["groups"]:
        for r in g["rules"]:
            unknown = series_names(r["expr"]) - known
            assert not unknown, f"rule {r.get('record') or r.get('alert')} names unknown series: {unknown}"
            if "alert" in r:
                assert "training_job" in r["annotations"]["summary"]


def test_promtool_checks_the_shipped_rules():
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        pytest.fail("promtool not found: apt-get install prometheus (scripts/test.sh does)")
    out = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    alerts = {r["alert"]: r for g in rules()["groups"] for r in g["rules"] if "alert" in r}
    assert alerts["GputopVerdictActive"]["for"] == "5m"
    assert 'verdict="stalled"' in alerts["GputopJobStalled"]["expr"]
    assert {"GputopStepsFalling", "GputopGpuIdleWhileJobRuns"} <= set(alerts)
