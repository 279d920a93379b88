"""One /metrics for every watched job: the exporter's own families, with a ``training_job`` label.

Each job's session is read by ``gputop.export.prometheus.collect_families`` exactly as a single
``gputop --pid`` exporter reads its one session (so the series, their units and help are the same
and documented once, docs/prometheus.md); this collector only adds ``training_job="<name>-<pid>"`` to every
sample and merges families of the same name (the text format allows one HELP/TYPE per name).
A job whose collection fails is counted in ``gputop_agent_job_errors_total`` and left out of that
scrape; the other jobs are served.
"""

from __future__ import annotations

import logging
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gputop.export.prometheus import PREFIX, collect_families

log = logging.getLogger("gputop.agent")
# Not "job": Prometheus sets "job" (the scrape job) on every series it stores, and renames an
# exposed "job" to "exported_job" unless the scrape config says honor_labels.
JOB_LABEL = "training_job"


def _with_label(families, by_name: dict[str, Metric], label: str, value: str) -> None:
    for fam in families:
        merged = by_name.get(fam.name)
        if merged is None:
            merged = by_name[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        for s in fam.samples:
            merged.add_sample(s.name, {**s.labels, label: value}, s.value, s.timestamp, s.exemplar)


class AgentCollector:
    """A prometheus_client collector over the agent's jobs (``agent.jobs_snapshot()``)."""

    session = None   # the exporter's health hook looks for a session's bus: the agent has none

    def __init__(self, agent) -> None:
        self.agent = agent
        self.job_errors: dict[str, int] = {}

    def collect(self) -> Iterable:
        by_name: dict[str, Metric] = {}
        jobs = self.agent.jobs_snapshot()
        for job in jobs:
            try:
                s = job.session
                fams = collect_families(s.store, s.now(), dict(s.meta), "live", derive_every_s=job.derive_every_s)
            except Exception as e:   # one job's bug must not cost the others their scrape
                n = self.job_errors[job.label] = self.job_errors.get(job.label, 0) + 1
                if n == 1:
                    log.warning("job %s: collecting its metrics failed: %s: %s", job.label, type(e).__name__, e)
                continue
            _with_label(fams, by_name, JOB_LABEL, job.label)
        out = list(by_name.values())
        out.extend(self._agent_families(jobs))
        return out

    def _agent_families(self, jobs) -> list:
        a = self.agent
        info = GaugeMetricFamily(PREFIX + "agent_job_info", "A job the node agent watches now: its root PID, why it "
                                 "was picked (gpu, probe, launcher, launched, match), the scheduler's job id. "
                                 "Always 1.", labels=["host", JOB_LABEL, "pid", "found_by", "cluster_job", "command"])
        for j in jobs:
            info.add_metric([a.host, j.label, str(j.found.pid), j.found.why, j.cluster_job, j.found.command[:120]], 1)
        watched = GaugeMetricFamily(PREFIX + "agent_jobs_watched", "Jobs the node agent watches now.", labels=["host"])
        watched.add_metric([a.host], len(jobs))
        cap = GaugeMetricFamily(PREFIX + "agent_max_jobs", "The agent's cap on watched jobs (--max-jobs).",
                                labels=["host"])
        cap.add_metric([a.host], a.max_jobs)
        agent_info = GaugeMetricFamily(PREFIX + "agent_info", "The node agent itself: how NVML's PIDs are mapped to "
                                       "the processes it sees (same, nspid, elimination, none). Always 1.",
                                       labels=["host", "pid_mapping"])
        agent_info.add_metric([a.host, a.pid_mapping], 1)
        started = CounterMetricFamily(PREFIX + "agent_jobs_started", "Jobs the agent started watching.",
                                      labels=["host"])
        started.add_metric([a.host], a.stats["started"])
        ended = CounterMetricFamily(PREFIX + "agent_jobs_ended", "Jobs the agent stopped watching (they ended).",
                                    labels=["host"])
        ended.add_metric([a.host], a.stats["ended"])
        failed = CounterMetricFamily(PREFIX + "agent_job_errors", "Jobs the agent could not watch or that failed "
                                     "inside it (start, stop, a scrape); each is logged once.", labels=["host"])
        failed.add_metric([a.host], a.stats["failed"] + sum(self.job_errors.values()))
        skipped = GaugeMetricFamily(PREFIX + "agent_jobs_over_cap", "Jobs found but not watched because the "
                                    "agent watches --max-jobs already.", labels=["host"])
        skipped.add_metric([a.host], a.stats["over_cap"])
        return [info, watched, cap, agent_info, started, ended, failed, skipped]
