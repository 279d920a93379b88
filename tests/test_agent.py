"""The node agent's parts with real processes: discovery, jobs coming and going, the cap, a
target that breaks while it is being attached, the state directory's safety and limits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from gputop.agent.agent import Agent
from gputop.agent.collector import AgentCollector
from gputop.agent.discover import Discovery
from gputop.agent.job import Rates, job_label
from gputop.agent.state import StateDir
from gputop.sources.files import FilesError

CHEAP = Rates(stacks=False)


def spawn(*argv, name="job"):
    """A real Python process whose command line carries a unique word."""
    tok = f"{name}_{uuid.uuid4().hex[:8]}"
    code = "import sys, time\ntime.sleep(float(sys.argv[2]))\n"
    return subprocess.Popen([sys.executable, "-c", code, tok, *argv]), tok


def wait_for(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_discovery_rules_roots_and_self():
    parent_code = ("import subprocess, sys, time\n"
                   "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', 'torchrun_child'])\n"
                   "time.sleep(30)\n")
    tok = uuid.uuid4().hex[:8]
    # a launcher (its cmdline names torch.distributed.run) with a Python child: one job, the root
    launcher = subprocess.Popen([sys.executable, "-c", parent_code, "-m", "torch.distributed.run", tok])
    plain, plain_tok = spawn("30", name="plain")
    try:
        assert wait_for(lambda: any(c.cmdline()[-1:] == ["torchrun_child"]
                                    for c in __import__("psutil").Process(launcher.pid).children()))
        found = {f.pid: f for f in Discovery().scan()}
        assert found[launcher.pid].why == "launcher"
        children = [c.pid for c in __import__("psutil").Process(launcher.pid).children()]
        assert not set(children) & set(found), "a launcher's ranks are in its tree, not jobs of their own"
        assert plain.pid not in found, "a plain Python process with no GPU, probe or launcher is no job"
        assert os.getpid() not in found
        by_match = {f.pid: f for f in Discovery(match=plain_tok, only_match=True).scan()}
        assert set(by_match) == {plain.pid} and by_match[plain.pid].why == "match"
        assert by_match[plain.pid].ident[1] > 0
    finally:
        for p in (launcher, plain):
            p.kill()
            p.wait()


def test_job_label_names_script_and_scheduler():
    from gputop.agent.discover import Found

    f = Found(41, 1, "gpu", "/usr/bin/python3 -u /home/a/train.py --lr 3", 0)
    assert job_label(f, {"SLURM_JOB_ID": "9912"}) == ("train.py-41", "9912")
    assert job_label(Found(42, 1, "gpu", "python -m my.trainer x", 0), {}) == ("my.trainer-42", "")
    assert job_label(Found(43, 1, "gpu", "python bad name$.py", 0), None)[0] == "name_.py-43"


@pytest.mark.timeout(60)
def test_jobs_come_and_go_and_are_served_with_their_label():
    a, tok_a = spawn("4", name="first")
    agent = Agent(match=f"{tok_a}|second_", only_match=True, scan_s=0.3, linger_s=0.5, rates=CHEAP)
    collector = AgentCollector(agent)
    b = None
    try:
        agent.start()
        assert wait_for(lambda: len(agent.jobs_snapshot()) == 1)
        b, _ = spawn("30", name="second")
        assert wait_for(lambda: len(agent.jobs_snapshot()) == 2)

        def served():
            out = {}
            for fam in collector.collect():
                for s in fam.samples:
                    if s.name == "gputop_info":
                        out[s.labels["training_job"]] = s.labels["pid"]
            return out

        assert wait_for(lambda: set(served().values()) == {str(a.pid), str(b.pid)})
        a.wait()   # the first ends: after linger_s it is forgotten, the second stays
        assert wait_for(lambda: [j.found.pid for j in agent.jobs_snapshot()] == [b.pid])
        assert set(served().values()) == {str(b.pid)}
        assert agent.stats["ended"] == 1 and agent.stats["started"] == 2
    finally:
        agent.stop()
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.timeout(60)
def test_cap_and_a_target_that_vanishes_while_attached():
    procs = [spawn("30", name="capped")[0] for _ in range(3)]
    short = subprocess.Popen([sys.executable, "-c", "pass", "capped_short"])  # gone before it is watched
    zombie = subprocess.Popen([sys.executable, "-c", "pass", "capped_zombie"])  # exited, not reaped
    assert wait_for(lambda: open(f"/proc/{zombie.pid}/stat").read().split(") ")[1][0] == "Z")
    agent = Agent(match="capped_", only_match=True, max_jobs=2, scan_s=0.3, rates=CHEAP)
    try:
        short.wait()
        agent.step()
        assert len(agent.jobs_snapshot()) == 2 and agent.stats["over_cap"] == 1   # the zombie is no job
        assert zombie.pid not in {f.pid for f in agent.discovery.scan()}
        # a job whose process is gone between discovery and attach is refused, logged, not retried
        from gputop.agent.discover import Found
        agent._start(Found(short.pid, 12345, "match", "gone", 0))
        assert agent.stats["failed"] == 1 and (short.pid, 12345) in agent._refused
        fams = {f.name: f for f in AgentCollector(agent).collect()}
        assert fams["gputop_agent_jobs_over_cap"].samples[0].value == 1
        assert fams["gputop_agent_job_errors"].samples[0].value == 1
    finally:
        agent.stop()
        zombie.wait()
        for p in procs:
            p.kill()
            p.wait()


def test_one_broken_job_does_not_cost_the_others_their_scrape():
    p, tok = spawn("30", name="broken")
    q, tok2 = spawn("30", name="fine")
    agent = Agent(match=f"{tok}|{tok2}", only_match=True, rates=CHEAP)
    try:
        agent.step()
        jobs = agent.jobs_snapshot()
        assert len(jobs) == 2
        broken = next(j for j in jobs if j.found.pid == p.pid)
        broken.session.store = None       # its store "breaks": collect_families raises
        c = AgentCollector(agent)
        labels = {s.labels.get("training_job") for f in c.collect() for s in f.samples if f.name == "gputop_info"}
        assert labels == {next(j for j in jobs if j.found.pid == q.pid).label}
        assert c.job_errors == {broken.label: 1}
    finally:
        agent.stop()
        for x in (p, q):
            x.kill()
            x.wait()


def test_state_dir_refuses_symlinks_and_open_dirs(tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(FilesError, match="symbolic link"):
        StateDir(str(tmp_path / "link"), 1 << 20, 3600)
    wide = tmp_path / "wide"
    wide.mkdir()
    wide.chmod(0o755)
    with pytest.raises(FilesError, match="open to other users"):
        StateDir(str(wide), 1 << 20, 3600)
    st = StateDir(str(tmp_path / "state"), 1 << 20, 3600)
    assert (os.stat(st.path).st_mode & 0o777) == 0o700


def test_state_dir_prunes_by_age_and_size_never_open_files_or_links(tmp_path):
    st = StateDir(str(tmp_path / "state"), keep_bytes=3000, keep_s=3600)
    now = time.time()
    paths = []
    for i, (age, size) in enumerate([(7200, 100), (600, 1500), (300, 1500), (10, 1500)]):
        p = os.path.join(st.path, f"j-{i}.gtrec")
        with open(p, "wb") as f:
            f.write(b"x" * size)
        os.utime(p, (now - age, now - age))
        paths.append(p)
    victim = tmp_path / "victim.gtrec"
    victim.write_bytes(b"y" * 5000)
    os.symlink(victim, os.path.join(st.path, "z-link.gtrec"))
    st.opened(paths[1])
    removed = st.prune(now)
    # the 2 h old one (age), then the oldest closed one over 3000 bytes; the open one stays
    assert removed == [paths[0], paths[2]]
    assert os.path.exists(paths[1]) and os.path.exists(paths[3]) and victim.exists()


@pytest.mark.timeout(60)
def test_rolling_recordings_stand_alone(tmp_path):
    from gputop.session.recording import RecordingReader

    p, tok = spawn("30", name="rolled")
    st = StateDir(str(tmp_path / "state"), keep_bytes=64 << 20, keep_s=3600)
    agent = Agent(match=tok, only_match=True, rates=CHEAP, state=st)
    try:
        agent.step()
        job = agent.jobs_snapshot()[0]
        time.sleep(3)
        st.segment_bytes = 1      # force a roll at the next step
        agent.step()
        time.sleep(2)
        assert job.recorder.segments == 2
    finally:
        agent.stop()
        p.kill()
        p.wait()
    files = sorted(os.listdir(st.path))
    assert len(files) == 2 and all(f.startswith(job.label) for f in files)
    for f in files:
        with RecordingReader(os.path.join(st.path, f)) as r:
            kinds = {s.kind for s in r.samples()}
            assert r.meta["agent"]["job"] == job.label
        assert "target" in kinds and "proc_info" in kinds   # the second segment too: start facts carried over


NS_SCRIPT = """\
"$1" -c 'import time; time.sleep(30)' plain_job.py & J=$!
sleep 0.3
"$1" -m gputop agent --prometheus "127.0.0.1:$2" --duration 2 --scan 0.5
echo "job $J"
kill $J
"""


@pytest.mark.timeout(60)
def test_the_agent_says_what_it_looks_for_and_that_a_plain_job_is_no_job(tmp_path):
    """Issue 31, item 6: `gputop agent` beside a plain `python job.py` served 0 jobs and said only
    where it serves. It says what it looks for, that it found nothing, names the Python process
    it saw and points at --match. A real agent in a real PID namespace of its own (unshare), so
    that the node's other processes (other tests' probed jobs) are not in its view."""
    import shutil

    from tests.test_prometheus_live import _free_port

    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.fail("this test needs root and unshare(1) (util-linux) for a PID namespace of its own")
    script = tmp_path / "ns.sh"
    script.write_text(NS_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "sh", str(script), sys.executable,
                        str(_free_port())], capture_output=True, text=True, timeout=50,
                       env=dict(os.environ, PYTHONPATH=root), stdin=subprocess.DEVNULL)
    job = int(r.stdout.split("job ", 1)[1].split()[0])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gputop agent: ")]
    assert lines[0].startswith("gputop agent: serving Prometheus metrics on"), r.stderr
    looks = [ln for ln in lines if "looking for jobs" in ln]
    assert len(looks) == 1, r.stderr
    for words in ("every 0.5 s", "on a GPU", "gputop probe", "torchrun", "SLURM"):
        assert words in looks[0], looks[0]
    found = [ln for ln in lines if " found " in ln]
    assert len(found) == 1, r.stderr   # said once: the count never changed
    assert found[0].startswith("gputop agent: found no job: "), found[0]
    assert f"PID {job}: {sys.executable} -c import time; time.sleep(30) plain_job.py" in found[0], found[0]
    assert "--match REGEX" in found[0] and found[0].endswith("e.g. --match 'plain_job\\.py'"), found[0]


def test_the_agent_says_when_the_count_of_jobs_changes(caplog):
    p, tok = spawn("30", name="counted")
    agent = Agent(match=tok, only_match=True, scan_s=0.3, rates=CHEAP)
    caplog.set_level("INFO", logger="gputop.agent")
    try:
        agent.step()
        agent.step()
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("found ")]
        assert said == ["found 1 job (1 matched by --match)"], said
        p.kill()
        p.wait()
        agent.step()
        agent.step()
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("found ")]
        assert len(said) == 2 and said[1].startswith(f"found no job: no process's command line matches '{tok}'"), said
        assert agent.discovery.criteria() == f"processes whose command line matches '{tok}' (--only-match)"
    finally:
        agent.stop()
        if p.poll() is None:
            p.kill()
            p.wait()
