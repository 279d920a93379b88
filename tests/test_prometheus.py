"""The Prometheus export (gputop/export/prometheus.py): what a scrape says, and the --prometheus flag.

Data: real recordings replayed through the same processors a live session runs —
tests/data/h200/*.gtrec (made on the H200 by benchmarks/h200.sh: GPU, GPM, probe, stacks,
verdicts) and tests/data/host_cpu_demo.gtrec (this CPU machine: no NVIDIA driver). Every scrape
is parsed with prometheus_client's own parser and compared with the samples in the store.
The flag is tested by running the real command line; the UI mode under a real pseudo-terminal.
A real Prometheus server scrapes a live session in tests/test_prometheus_live.py.
"""

from __future__ import annotations

import os
import pathlib
import pty
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gputop.export.prometheus import (NOT_EXPORTED, STALE_S, PrometheusExporter, SessionCollector,
                                      exported_fields, parse_address)
from gputop.session.replay import ReplaySession
from gputop.sources import metric_specs
from gputop.verdicts import default_processors
from gputop.verdicts.rules import VERDICT_IDS

DATA = pathlib.Path(__file__).parent / "data"
H200 = sorted(p for p in (DATA / "h200").glob("*.gtrec") if p.stem != "ranks")  # one per scenario
CPU_FIXTURE = DATA / "host_cpu_demo.gtrec"


def replay(path, at: float | None = None) -> ReplaySession:
    s = ReplaySession(str(path), processors=default_processors(), start_playing=False)
    s.seek(s.t_end if at is None else at)
    return s


def scrape_text(session) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SessionCollector(session))
    return generate_latest(reg).decode()


def parse(text: str) -> dict:
    """name -> family (counters are keyed by their name with _total, as served)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = fam
    return out


def values(fams: dict, name: str, **labels) -> list[float]:
    fam = fams.get(name)
    if fam is None:
        return []
    return [s.value for s in fam.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def one(fams: dict, name: str, **labels) -> float:
    got = values(fams, name, **labels)
    assert len(got) == 1, (name, labels, got)
    return got[0]


# ---------------------------------------------------------------------------------------------
# GPU recordings from the H200


@pytest.fixture(scope="module")
def gpu_bound():
    s = replay(DATA / "h200" / "gpu_bound.gtrec", at=20.0)
    yield s, parse(scrape_text(s))
    s.stop()


def test_h200_recordings_are_present():
    assert len(H200) >= 4, "tests/data/h200/*.gtrec (real H200 recordings) are missing"


def test_gpu_metrics_match_the_samples_and_name_their_dcgm_field(gpu_bound):
    s, fams = gpu_bound
    gpu = s.store.latest("gpu", "0").data
    info = s.store.latest("gpu_info", "0").data
    lab = {"gpu": "0", "gpu_uuid": info["uuid"], "gpu_name": info["name"], "host": s.meta["host"]}
    # plain NVML fields: the newest sample, in Prometheus base units
    assert one(fams, "gputop_gpu_power_watts", **lab) == gpu["power_w"]
    assert one(fams, "gputop_gpu_sm_clock_hertz", **lab) == gpu["clock_sm_mhz"] * 1e6
    assert one(fams, "gputop_gpu_temperature_celsius", **lab) == gpu["temp_c"]
    assert one(fams, "gputop_gpu_memory_used_bytes", **lab) == gpu["mem_used"]
    assert one(fams, "gputop_gpu_utilization_ratio", **lab) == pytest.approx(gpu["util_gpu"] / 100)
    # GPM: the newest non-None value, as a 0-1 ratio like DCGM's profiling fields
    sm = s.store.latest_value("gpu", "0", "sm_active", max_age_s=2.0)
    assert sm is not None and sm > 50, "gpu_bound should keep the SMs busy"
    assert one(fams, "gputop_gpu_sm_active_ratio", **lab) == pytest.approx(sm / 100)
    rx = s.store.latest_value("gpu", "0", "pcie_rx_mibs", max_age_s=2.0)
    assert one(fams, "gputop_gpu_pcie_rx_bytes_per_second", **lab) == pytest.approx(rx * 1024 * 1024)
    # DCGM equivalents are named in the help text, with their field ids
    for name, dcgm in [("gputop_gpu_utilization_ratio", "DCGM_FI_DEV_GPU_UTIL (field 203)"),
                       ("gputop_gpu_power_watts", "DCGM_FI_DEV_POWER_USAGE (field 155)"),
                       ("gputop_gpu_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK (field 100)"),
                       ("gputop_gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP (field 150)"),
                       ("gputop_gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED (field 252)"),
                       ("gputop_gpu_sm_active_ratio", "DCGM_FI_PROF_SM_ACTIVE (field 1002)"),
                       ("gputop_gpu_tensor_active_ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (field 1004)"),
                       ("gputop_gpu_dram_active_ratio", "DCGM_FI_PROF_DRAM_ACTIVE (field 1005)"),
                       ("gputop_gpu_pcie_rx_bytes_per_second", "DCGM_FI_PROF_PCIE_RX_BYTES (field 1010)")]:
        assert dcgm in fams[name].documentation, (name, fams[name].documentation)


def test_clock_events_one_series_per_reason(gpu_bound):
    s, fams = gpu_bound
    events = s.store.latest("gpu", "0").data["clock_events"]
    assert "sw_power_cap" in events, "the H200 GEMM runs at its power cap"
    served = {smp.labels["reason"]: smp.value for smp in fams["gputop_gpu_clock_event"].samples}
    assert served["sw_power_cap"] == 1 and served["gpu_idle"] == 0
    assert {r for r, v in served.items() if v == 1} == set(events)


def test_missing_values_are_left_out_never_zero(gpu_bound):
    s, fams = gpu_bound
    # this H200 has no NVLink: gpu_info says why, and no NVLink series is served at all
    assert "nvlink_tx_mibs" in s.store.latest("gpu_info", "0").data["na"]
    assert "gputop_gpu_nvlink_tx_bytes_per_second" not in fams
    assert "gputop_gpu_nvlink_rx_bytes_per_second" not in fams


def test_gpm_value_survives_samples_without_gpm():
    """GPM is read on ~60% of samples; a scrape that lands on a sample without it still serves
    the newest GPM value instead of dropping the series."""
    s = replay(DATA / "h200" / "gpu_bound.gtrec", at=5.0)
    try:
        gpu = [x for x in s.reader.all_samples() if x.kind == "gpu" and 10 < x.t < 25]
        at = next(x.t for i, x in enumerate(gpu) if x.data["sm_active"] is None and gpu[i - 1].data["sm_active"] is not None)
        s.seek(at)
        assert s.store.latest("gpu", "0").data["sm_active"] is None
        fams = parse(scrape_text(s))
        expect = s.store.latest_value("gpu", "0", "sm_active", max_age_s=2.0)
        assert one(fams, "gputop_gpu_sm_active_ratio") == pytest.approx(expect / 100)
    finally:
        s.stop()


@pytest.mark.parametrize("path", H200, ids=lambda p: p.stem)
def test_verdict_gauges_follow_the_engine(path):
    s = replay(path, at=20.0)
    try:
        fams = parse(scrape_text(s))
        active = {smp.labels["verdict"]: smp.value for smp in fams["gputop_verdict_active"].samples}
        assert set(active) >= set(VERDICT_IDS), "one series per known verdict id, active or not"
        assert set(active.values()) <= {0.0, 1.0}
        engine = {k for k, v in s.store.latest_of_kind("verdict").items()
                  if v.data.get("active") and s.now() - v.t <= STALE_S}
        assert {v for v, x in active.items() if x == 1} == engine
        assert path.stem in engine, f"the {path.stem} scenario's own verdict"
        primary = [smp.labels["verdict"] for smp in fams["gputop_primary_verdict"].samples if smp.value == 1]
        assert primary == [s.store.latest("verdict_primary", "primary").data["id"]]
        for vid in engine:
            d = s.store.latest("verdict", vid).data
            assert one(fams, "gputop_verdict_lost_share_ratio", verdict=vid) == d["lost_share"]
            assert one(fams, "gputop_verdict_confidence_ratio", verdict=vid) == d["confidence"]
        assert {smp.labels["verdict"] for smp in fams["gputop_verdict_lost_share_ratio"].samples} == engine
    finally:
        s.stop()


def test_thread_states_and_probe_timings():
    s = replay(DATA / "h200" / "input_bound.gtrec", at=20.0)
    try:
        fams = parse(scrape_text(s))
        pid = str(s.meta["target"]["pid"])
        # the main thread waits for the DataLoader most of the time: the shares say so, and sum to 1
        states = {smp.labels["state"]: smp.value for smp in fams["gputop_thread_state_ratio"].samples
                  if smp.labels["pid"] == pid and smp.labels["tid"] == pid}
        assert states["data"] > 0.5
        assert sum(states.values()) == pytest.approx(1.0, abs=0.01)
        step = s.store.latest("probe_step", pid).data
        assert one(fams, "gputop_probe_steps_per_second", pid=pid) == step["steps_per_s"]
        assert one(fams, "gputop_probe_step_seconds_mean", pid=pid) == pytest.approx(step["step_ms_mean"] / 1000)
        assert one(fams, "gputop_probe_data_wait_ratio", pid=pid) == step["data_wait_share"]
        assert fams["gputop_probe_steps_total"].type == "counter"
        assert one(fams, "gputop_probe_steps_total", pid=pid) == step["step_total"]
        assert values(fams, "gputop_probe_steps_total", pid=pid, rank="") == [step["step_total"]], \
            "a single-process job has no rank: the label is empty"
        # every process of the tree, with its role
        roles = {smp.labels["pid"]: smp.labels["role"] for smp in fams["gputop_process_cpu_seconds_per_second"].samples}
        assert roles[pid] == "main" and list(roles.values()).count("dataloader_worker") == 2
    finally:
        s.stop()


@pytest.mark.parametrize("name", ["periodic_stall-pid", "checkpoint_stall-pid"])
def test_time_budget_shares_and_phase_match_the_budget_sample(name):
    """Real training loops (tests/data/h200/real): one series per budget category, equal to the
    window budget the replay recomputed; the help names every category's label; the phase is 1."""
    from gputop.derive import budget as bd

    s = replay(DATA / "h200" / "real" / f"{name}.gtrec", at=None)
    s.seek(s.t_start + 25.0)
    try:
        window = s.store.latest("budget", "window").data
        fams = parse(scrape_text(s))
    finally:
        s.stop()
    lab = {"host": s.meta["host"], "pid": window["pid"]}
    fam = fams["gputop_time_budget_share"]
    assert {x.labels["category"] for x in fam.samples} == set(bd.CATEGORIES)
    for c in bd.CATEGORIES:
        assert one(fams, "gputop_time_budget_share", category=c, **lab) == window["shares"][c]
    assert sum(x.value for x in fam.samples) == pytest.approx(1.0, abs=0.01)
    assert all(f"{c} = {bd.LABELS[c]}" in fam.documentation for c in bd.CATEGORIES)
    assert one(fams, "gputop_phase_info", phase=window["phase"], **lab) == 1
    assert len(fams["gputop_phase_info"].samples) == 1


def test_every_source_metric_is_exported_or_explained():
    """'serves every metric': each field the sources declare (and the thread states) has a
    metric family, or a stated reason why it is served in another shape."""
    from gputop.derive.threads import METRICS as THREAD_METRICS

    exported = exported_fields()
    missing = [(m.kind, m.field) for m in [*metric_specs(), *THREAD_METRICS]
               if (m.kind, m.field) not in exported and (m.kind, m.field) not in NOT_EXPORTED]
    assert not missing, f"fields with no Prometheus metric: {missing}"


def test_every_exported_field_of_a_rich_recording_is_served(gpu_bound):
    """Fields with a value in the recording appear in the scrape under their metric name."""
    s, fams = gpu_bound
    exported = exported_fields()
    for (kind, field), name in exported.items():
        latest = s.store.latest_of_kind(kind)
        has_value = any(x.data.get(field) is not None and s.now() - x.t <= STALE_S for x in latest.values())
        if kind == "gpu":
            has_value = has_value or s.store.latest_value("gpu", "0", field, max_age_s=2.0) is not None
        if has_value:
            assert name in fams, f"{kind}.{field} has a value but {name} is not served"


# ---------------------------------------------------------------------------------------------
# The CPU machine's recording (no NVIDIA driver)


def test_without_a_gpu_host_metrics_and_health_say_so():
    s = replay(CPU_FIXTURE, at=40.0)
    try:
        fams = parse(scrape_text(s))
        assert not [n for n in fams if n.startswith("gputop_gpu_")], "no GPU: no GPU series, not zeros"
        assert one(fams, "gputop_source_up", source="nvml") == 0
        assert one(fams, "gputop_source_state", source="nvml", state="failed") == 1
        assert one(fams, "gputop_source_up", source="host") == 1
        sysd = s.store.latest("system", "host").data
        assert one(fams, "gputop_host_cpu_utilization_ratio") == pytest.approx(sysd["cpu_pct"] / 100)
        assert one(fams, "gputop_host_memory_total_bytes") == sysd["mem_total"]
        info = fams["gputop_info"].samples[0].labels
        assert info["mode"] == "replay" and info["pid"] == str(s.meta["target"]["pid"])
    finally:
        s.stop()


def test_series_go_away_when_their_source_stops():
    """Ten seconds after the last sample, nothing measured is served as if it were current;
    gputop's own health and identity still are."""
    from gputop.export.prometheus import collect_families

    s = replay(CPU_FIXTURE)
    try:
        fams = {f.name for f in collect_families(s.store, s.t_end + 10.0, s.meta, "replay")}
        assert "gputop_info" in fams and "gputop_source_up" in fams
        assert not {n for n in fams if n.startswith(("gputop_host_", "gputop_process_", "gputop_thread_"))}
        assert "gputop_verdict_active" not in fams, "no verdict engine running: no verdict is claimed as 0"
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------------
# The server and the flag


def test_exporter_serves_over_http_and_releases_its_port():
    s = replay(CPU_FIXTURE, at=40.0)
    ex = PrometheusExporter("127.0.0.1", 0, session=s)
    try:
        text = urllib.request.urlopen(ex.url, timeout=5).read().decode()
        fams = parse(text)
        assert "gputop_host_cpu_utilization_ratio" in fams
        assert "gputop_self_process_cpu_seconds_total" in fams, "gputop's own cost is served too"
    finally:
        ex.stop()
        s.stop()
    again = PrometheusExporter("127.0.0.1", ex.port)  # stop() gave the port back
    again.stop()


@pytest.mark.parametrize("text, host, port", [
    ("9464", "127.0.0.1", 9464), ("0.0.0.0:9100", "0.0.0.0", 9100), ("node7:9464", "node7", 9464),
    ("[::1]:9464", "::1", 9464), (" 9464 ", "127.0.0.1", 9464)])
def test_parse_address(text, host, port):
    assert parse_address(text) == (host, port)


def gputop_cmd(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


def assert_one_line_error(r, code, *words):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("gputop: error:")]
    assert len(err) == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in err[0], err[0]


@pytest.mark.parametrize("value, words", [
    ("abc", ["--prometheus", "number"]), ("70000", ["between 1 and 65535"]), ("0", ["between 1 and 65535"]),
    ("-5", ["number"]), (":9464", ["no host"]), ("http://localhost:9464/metrics", ["not a URL"]),
    ("::1:9464", ["brackets"]), ("", ["needs an address"])])
def test_bad_prometheus_value_is_one_line(value, words):
    r = gputop_cmd("--pid", str(os.getpid()), "--headless", "--duration", "1", f"--prometheus={value}")
    assert_one_line_error(r, 2, *words)


def test_port_in_use_is_one_line_before_anything_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = gputop_cmd("--pid", str(os.getpid()), "--headless", "--duration", "5", "--prometheus", f"127.0.0.1:{port}",
                       cwd=tmp_path)
    assert_one_line_error(r, 1, "already in use", str(port))
    assert list(tmp_path.iterdir()) == [], "nothing was started or recorded"


def test_address_not_on_this_machine_is_one_line():
    r = gputop_cmd("--pid", str(os.getpid()), "--headless", "--duration", "1", "--prometheus", "192.0.2.1:9464")
    assert_one_line_error(r, 1, "not an address of this machine")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str, until, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            fams = parse(urllib.request.urlopen(url, timeout=3).read().decode())
            if until(fams):
                return fams
            last = sorted(fams)
        except OSError as e:
            last = e
        time.sleep(0.5)
    raise AssertionError(f"no scrape of {url} met the condition in {timeout:g} s; last: {last}")


def test_the_ui_serves_metrics_too(tmp_path):
    """`gputop --pid PID --prometheus PORT` with the UI, in a real pseudo-terminal: the scrape has the
    live host and process series; q quits and the port is closed."""
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(20000)); time.sleep(0.01)"])
    port = _free_port()
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40")
    ui = subprocess.Popen([sys.executable, "-m", "gputop", "--pid", str(target.pid), "--no-stacks",
                           "--prometheus", f"127.0.0.1:{port}"],
                          stdin=slave, stdout=slave, stderr=slave, env=env, cwd=tmp_path, start_new_session=True)
    os.close(slave)
    screen = bytearray()
    stop = threading.Event()

    def drain():  # a pty whose output nobody reads blocks the app
        while not stop.is_set():
            r, _, _ = select.select([master], [], [], 0.1)
            if r:
                try:
                    screen.extend(os.read(master, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        pid = str(target.pid)
        # (a busy process, but its first tick on a loaded machine can read 0: wait for one that is not)
        fams = _scrape(url, lambda f: any(v > 0 for v in values(f, "gputop_process_cpu_seconds_per_second", pid=pid)))
        assert one(fams, "gputop_info") == 1 and fams["gputop_info"].samples[0].labels["mode"] == "live"
        assert 0 < one(fams, "gputop_process_cpu_seconds_per_second", pid=pid) < 2
        assert "gputop_host_cpu_utilization_ratio" in fams
        os.write(master, b"q")
        assert ui.wait(timeout=15) == 0, bytes(screen)[-2000:]
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)
    finally:
        stop.set()
        if ui.poll() is None:
            ui.kill()
            ui.wait()
        target.kill()
        target.wait()
        reader.join(timeout=2)
        os.close(master)


def test_processors_series_are_served_for_their_cadence():
    """The node agent runs the processors every 4 s: between two runs their newest verdict is up
    to 4 s old (more on a loaded node), and is still served; at the UI's 1 s cadence the limit
    stays STALE_S. A real H200 recording, its processors run every 4 s as the agent runs them."""
    from gputop.export.prometheus import collect_families, derived_stale_s

    assert derived_stale_s(1.0) == STALE_S and derived_stale_s(4.0) == STALE_S + 3.0
    procs = default_processors()
    for p in procs:
        p.interval_s = max(p.interval_s, 4.0)
    s = ReplaySession(str(DATA / "h200" / "input_bound.gtrec"), processors=procs, start_playing=False)
    try:
        s.play_to(s.t_start + 30.0)
        primary = s.store.latest("verdict_primary", "primary")
        assert primary is not None and primary.data.get("id"), "a verdict held by then"

        def served(age: float, every: float) -> dict:
            fams = collect_families(s.store, primary.t + age, s.meta, "live", derive_every_s=every)
            return {smp.labels["verdict"]: smp.value for f in fams for smp in f.samples
                    if smp.name == "gputop_verdict_active"}

        vid = primary.data["id"]
        # a run late by 2 s on a loaded node: 6 s old, served at the agent's cadence
        assert served(6.0, 4.0).get(vid) == 1.0
        assert served(6.0, 1.0) == {}               # at 1 s a 6 s old verdict engine is not running
        assert served(STALE_S + 3.5, 4.0) == {}     # and past the longer limit it is gone there too
    finally:
        s.stop()
