"""Target: the PID the user gives, checked at start-up with one clear line per problem, and its
tree of descendants. Real processes only."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gputop.sources.target import VERIFY_S, Target, TargetError


def _one_line(err: TargetError) -> str:
    msg = str(err)
    assert msg and "\n" not in msg and "Traceback" not in msg, msg
    return msg


def _dead_pid() -> int:
    """A PID that existed a moment ago and is gone (reaped) now."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("pid", [0, -1, -12345])
def test_not_a_positive_pid(pid):
    with pytest.raises(TargetError) as e:
        Target(pid)
    assert "positive process id" in _one_line(e.value)


def test_a_pid_that_does_not_exist():
    pid = _dead_pid()
    with pytest.raises(TargetError) as e:
        Target(pid)
    assert f"no process with PID {pid}" in _one_line(e.value)
    with pytest.raises(TargetError) as e:
        Target(2**40)  # far beyond pid_max
    assert "no process" in _one_line(e.value)


def test_a_zombie_has_already_exited():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # exited, not reaped: a zombie
            with open(f"/proc/{p.pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    break
            time.sleep(0.01)
        with pytest.raises(TargetError) as e:
            Target(p.pid)
        assert "already exited" in _one_line(e.value)
    finally:
        p.wait()


def test_processes_that_die_during_start_up_give_one_line_errors():
    """Short-lived processes, not our children (reaped at once by init), watched while they
    die: every outcome is a Target or one TargetError line, never another exception."""
    outcomes = {"ok": 0, "error": 0}
    messages = set()
    for _ in range(40):
        out = subprocess.run(["sh", "-c", "sleep 0.0$((RANDOM % 5)) & echo $!"], capture_output=True, text=True)
        pid = int(out.stdout)
        for _ in range(20):
            try:
                Target(pid)
                outcomes["ok"] += 1
            except TargetError as e:
                messages.add(_one_line(e).split(":")[0].replace(str(pid), "N"))
                outcomes["error"] += 1
                break
    assert outcomes["error"] > 0, outcomes  # every one of them died in the end
    assert messages <= {"no process with PID N", "process N exited while gputop was starting",
                        "process N has already exited (zombie)"}, messages


def _as_user(uid: int, argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv], **kw)


def test_no_permission_to_read_the_process():
    """A process of another user: the reader sees it in ps but may not ptrace it (stacks, I/O,
    environment). The target is still made, with the reason (tests/test_other_user.py watches one)."""
    if os.geteuid() != 0:
        # Not root: any process of another user does (PID 1 usually is root's).
        others = [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                  if os.path.exists(f"/proc/{p}") and os.stat(f"/proc/{p}").st_uid != os.geteuid()]
        if not others:
            pytest.skip("no process of another user to try")
        try:
            t = Target(others[0])
        except TargetError as e:
            assert "no permission" in _one_line(e)   # not even its stat (hidepid)
            return
        assert t.ptrace_denied and t.ptrace_denied.startswith("ptrace not permitted")
        return
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a reader without permission")
    owner = _as_user(65534, ["sleep", "30"])  # the target belongs to nobody
    try:
        time.sleep(0.2)
        code = ("import sys\nfrom gputop.sources.target import VERIFY_S, Target, TargetError\n"
                "try:\n    print(Target(int(sys.argv[1])).ptrace_denied)\nexcept TargetError as e:\n    print(e)\n")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}
        reader = _as_user(65533, [sys.executable, "-c", code, str(owner.pid)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        out, err = reader.communicate(timeout=60)
        if "No module named" in err or "Permission denied" in err and not out:
            pytest.skip(f"uid 65533 cannot run this checkout's Python: {err.strip()[-200:]}")
        line = out.strip()
        assert line.startswith(f"ptrace not permitted on process {owner.pid}"), (out, err)
        assert "\n" not in line and "same user or with sudo" in line
    finally:
        owner.kill()
        owner.wait()


def test_a_python_target_and_a_non_python_one():
    py = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    sh = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        t = Target(py.pid)
        assert t.is_python() and t.alive()
        assert t.cmdline[0] == sys.executable and "time.sleep(30)" in t.command
        d = t.describe()
        assert d["pid"] == py.pid and d["python"] is True and d["create_time"] > 1e9
        s = Target(sh.pid)
        assert not s.is_python() and s.alive() and s.name == "sleep"
    finally:
        for p in (py, sh):
            p.kill()
            p.wait()


def _settles(get, want, within: float = VERIFY_S + 1.0) -> bool:
    deadline = time.monotonic() + within
    while get() != want:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


TREE = """
import subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; g = subprocess.Popen(['sleep', '30']); print(g.pid, flush=True); time.sleep(30)"],
    stdout=subprocess.PIPE, text=True)
grandkid = int(kid.stdout.readline())
print(kid.pid, grandkid, flush=True)
sys.stdin.readline()              # then start one more child
late = subprocess.Popen(["sleep", "30"])
print(late.pid, flush=True)
sys.stdin.readline()              # then kill the first child, leaving it a zombie
kid.kill()
time.sleep(0.2)
print("done", flush=True)
time.sleep(30)
"""


def test_the_tree_finds_descendants_new_and_gone():
    main = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        kid, grandkid = map(int, main.stdout.readline().split())
        t = Target(main.pid)
        assert t.tree_pids(0) == {main.pid, kid, grandkid}
        main.stdin.write("\n")
        main.stdin.flush()
        late = int(main.stdout.readline())
        assert late in t.tree_pids(0)
        cached = t.tree(max_age_s=60)  # a cache this young is not re-read
        main.stdin.write("\n")
        main.stdin.flush()
        assert main.stdout.readline().strip() == "done"
        assert {p.pid for p in t.tree(max_age_s=60)} == {p.pid for p in cached}
        # The first child is a zombie (dead, not reaped): still a child of main, but its own
        # child (sleep) was re-parented away from the tree when it died (seen within VERIFY_S).
        assert _settles(lambda: t.tree_pids(0), {main.pid, late, kid})
        procs = t.tree(0)
        assert procs[0].pid == main.pid  # the main process first
    finally:
        os.killpg(main.pid, signal.SIGKILL)
        main.wait()
        try:
            os.kill(grandkid, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass


def test_children_leave_the_tree_when_the_target_dies():
    main = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        kid, grandkid = map(int, main.stdout.readline().split())
        t = Target(main.pid)
        assert t.tree_pids(0) == {main.pid, kid, grandkid}
        main.kill()  # a zombie until we reap it; its child is re-parented at once
        assert _settles(lambda: t.tree_pids(0), {main.pid})
        main.wait()
        assert t.tree_pids(0) == {main.pid}  # the main process always heads the list
    finally:
        os.killpg(main.pid, signal.SIGKILL)
        main.wait()


def test_exit_is_noticed():
    p = subprocess.Popen(["sleep", "30"])
    t = Target(p.pid)
    assert t.alive() and t.exited_at is None
    p.kill()
    p.wait()
    assert not t.alive()
    t.note_exited()
    first = t.exited_at
    assert first is not None
    t.note_exited()
    assert t.exited_at == first


def test_the_sources_together_walk_the_tree_about_once_a_second():
    """The host source, the stack source's kernel sampler, the probe client and NVML's process
    read all ask for the tree once a second, out of step; one shared age (TREE_MAX_AGE_S) makes
    the first asker after it expires walk /proc for all of them, never sooner."""
    from gputop.session.session import SessionClock
    from gputop.sources.host import HostSource
    from gputop.sources.probe_client import ProbeClientSource
    from gputop.sources.stacks import StackSource
    from gputop.sources.target import TREE_MAX_AGE_S

    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        target = Target(child.pid)
        walks: list[float] = []
        real = target._descendants

        def counted(now):
            walks.append(now)
            return real(now)
        target._descendants = counted
        clock = SessionClock()
        sources = [HostSource(clock, target), StackSource(clock, target, pyspy="/nonexistent/py-spy"),
                   ProbeClientSource(clock, target)]
        for s in sources:
            s.start(lambda *a: None)
        time.sleep(1.5)
        n0 = len(walks)
        time.sleep(6.0)
        n = len(walks) - n0
        for s in sources:
            s.stop()
    finally:
        child.kill()
        child.wait()
    gaps = [round(b - a, 3) for a, b in zip(walks[n0:], walks[n0 + 1:])]
    # at their old ages (0.2, 0.5 and 1 s) walks came 0.2-0.5 s after one another
    assert 3 <= n <= 8 and min(gaps) >= 0.95 * TREE_MAX_AGE_S, gaps
