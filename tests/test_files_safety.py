"""Files gputop creates (issue 13 items 1, 8, 10; issue 12 items 3, 15): per-user private
directories checked with lstat and owner, files opened O_EXCL|O_NOFOLLOW 0600, nothing in the
working directory, leftovers of a killed gputop removed at the next start. Real gputop
processes, real files and symlinks; XDG_* and TMPDIR point into tmp_path, never the real home."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import stat
import subprocess
import sys
import time

import pytest

from gputop.sources import files

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private fake home: XDG_STATE_HOME, XDG_RUNTIME_DIR, TMPDIR and the probe's directory
    all inside tmp_path (also for the gputop processes the tests start: they inherit them)."""
    for d in ("state", "run", "tmp"):
        (tmp_path / d).mkdir(mode=0o700)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("GPUTOP_PROBE_DIR", str(tmp_path / "probe"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return tmp_path


def gputop_cmd(*args, timeout=90, **kw):
    return subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


def one_error_line(r, code, *words):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("gputop: error:")]
    assert len(err) == 1, r.stderr
    for w in words:
        assert w in err[0], err[0]


def mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


QUICK_JOB = ["--", sys.executable, "-c", "import time; time.sleep(30)"]


# --- the helpers, on real directories --------------------------------------------------------

def test_a_planted_symlink_is_never_followed_or_written(home):
    victim = home / "victim"
    victim.mkdir(mode=0o700)
    planted = home / "tmp" / "f.log"
    planted.symlink_to(victim / "secret")
    with pytest.raises(files.FilesError, match="already exists"):
        files.create_file(str(planted))
    assert not (victim / "secret").exists()
    existing = home / "tmp" / "g.log"
    existing.write_text("theirs")
    with pytest.raises(files.FilesError, match="already exists"):
        files.create_file(str(existing))
    assert existing.read_text() == "theirs"
    fd = files.create_file(str(home / "tmp" / "new.log"))
    os.close(fd)
    assert mode(home / "tmp" / "new.log") == 0o600


def test_private_dir_refuses_a_symlink_a_loose_mode_and_a_loose_parent(home):
    target = home / "elsewhere"
    target.mkdir(mode=0o700)
    (home / "tmp" / "link").symlink_to(target)
    with pytest.raises(files.FilesError, match="symbolic link"):
        files.private_dir(str(home / "tmp" / "link"))
    (home / "tmp" / "open").mkdir(mode=0o700)
    os.chmod(home / "tmp" / "open", 0o755)
    with pytest.raises(files.FilesError, match="chmod 700"):
        files.private_dir(str(home / "tmp" / "open"))
    loose = home / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)  # writable by all, not sticky: anyone could swap what is below
    with pytest.raises(files.FilesError, match="writable by other users"):
        files.private_dir(str(loose / "gputop"))
    assert not (loose / "gputop").exists()
    sticky = home / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # like /tmp
    made = files.private_dir(str(sticky / "gputop"))
    assert mode(made) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_private_dir_refuses_a_directory_of_another_user(home):
    theirs = home / "tmp" / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(files.FilesError, match="belongs to uid 65534"):
        files.private_dir(str(theirs))


def test_runtime_dir_falls_back_to_tmp_when_xdg_runtime_dir_is_not_ours(home, monkeypatch):
    os.chmod(home / "run", 0o755)  # not a private runtime directory (as after sudo -E, say)
    got = files.runtime_dir()
    assert got == str(home / "tmp" / f"gputop-{os.geteuid()}-work") and mode(got) == 0o700
    os.chmod(home / "run", 0o700)
    assert files.runtime_dir() == str(home / "run" / "gputop")


def test_prune_keeps_the_newest_and_ignores_symlinks_and_others(home):
    d = home / "tmp" / "keep"
    d.mkdir(mode=0o700)
    for i in range(8):
        p = d / f"r{i}.gtrec"
        p.write_bytes(b"x" * 100)
        os.utime(p, (1000 + i, 1000 + i))
    outside = home / "outside.gtrec"
    outside.write_text("not ours to prune")
    (d / "zlink.gtrec").symlink_to(outside)
    removed = files.prune(str(d), ".gtrec", keep=3)
    assert sorted(os.path.basename(p) for p in removed) == [f"r{i}.gtrec" for i in range(5)]
    assert sorted(os.listdir(d)) == ["r5.gtrec", "r6.gtrec", "r7.gtrec", "zlink.gtrec"]
    assert outside.read_text() == "not ours to prune"
    files.prune(str(d), ".gtrec", keep=10, max_bytes=250)
    assert sorted(os.listdir(d)) == ["r6.gtrec", "r7.gtrec", "zlink.gtrec"]


# --- gputop itself ---------------------------------------------------------------------------

def test_headless_records_into_the_state_directory_not_the_working_directory(home):
    """Issue 12 item 3: no --record: a 0600 file in $XDG_STATE_HOME/gputop/recordings, its path
    printed; the working directory gets nothing; the newest 20 are kept."""
    cwd = home / "checkout"
    cwd.mkdir()
    rec_dir = home / "state" / "gputop" / "recordings"
    rec_dir.mkdir(parents=True)
    for d in (rec_dir, rec_dir.parent):
        d.chmod(0o700)
    for i in range(25):
        p = rec_dir / f"gputop-1-2020010{i % 10}-0000{i:02d}.gtrec"
        p.write_bytes(b"old")
        os.utime(p, (1000 + i, 1000 + i))
    r = gputop_cmd("run", "--headless", "--duration", "2", "--stop-with-gputop", "--no-stacks", *QUICK_JOB, cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert list(cwd.iterdir()) == []
    new = [p for p in rec_dir.iterdir() if p.read_bytes() != b"old"]
    assert len(new) == 1 and f"recorded to {new[0]}" in r.stderr
    assert mode(new[0]) == 0o600 and mode(rec_dir) == 0o700 and mode(rec_dir.parent) == 0o700
    assert len(list(rec_dir.iterdir())) == 20
    rep = json.loads(gputop_cmd("report", str(new[0]), "--json").stdout)
    assert rep["session"]["clean_end"]


def test_home_fallback_when_xdg_state_home_is_unset(home, monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(home))
    r = gputop_cmd("run", "--headless", "--duration", "1", "--stop-with-gputop", "--no-stacks", *QUICK_JOB, cwd=home)
    assert r.returncode == 0, r.stderr
    recs = list((home / ".local" / "state" / "gputop" / "recordings").iterdir())
    assert len(recs) == 1 and str(recs[0]) in r.stderr


def test_a_planted_state_directory_is_refused_in_one_line(home):
    victim = home / "victim"
    victim.mkdir(mode=0o700)
    (home / "state" / "gputop").symlink_to(victim)
    r = gputop_cmd("run", "--headless", "--duration", "1", "--stop-with-gputop", *QUICK_JOB, cwd=home)
    one_error_line(r, 1, "symbolic link", "--record FILE")
    assert list(victim.iterdir()) == []


def test_record_file_is_0600_and_a_planted_symlink_is_refused(home):
    rec = home / "r.gtrec"
    r = gputop_cmd("run", "--headless", "--duration", "1", "--stop-with-gputop", "--no-stacks", "--record", str(rec),
                   *QUICK_JOB)
    assert r.returncode == 0, r.stderr
    assert mode(rec) == 0o600
    victim = home / "victim.txt"
    victim.write_text("keep")
    (home / "planted.gtrec").symlink_to(victim)
    r = gputop_cmd("--pid", str(os.getpid()), "--headless", "--duration", "1", "--record", str(home / "planted.gtrec"))
    one_error_line(r, 1, "already exists")
    assert victim.read_text() == "keep"


def test_pyspy_windows_live_in_the_runtime_dir_and_a_killed_gputops_are_removed(home):
    """Issue 13 item 8: py-spy's window directory is private, gone at exit; one left by a gputop
    killed with -9 (a dead PID in its name) goes at the next start."""
    if not (pathlib.Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("py-spy is not installed next to this Python")
    base = home / "run" / "gputop"
    base.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = base / f"stacks-{dead.pid}-abcd"
    stale.mkdir(mode=0o700)
    (stale / "w1.json").write_text("{}")
    alive = base / f"stacks-{os.getpid()}-efgh"  # a live gputop's: kept
    alive.mkdir(mode=0o700)
    job = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        p = subprocess.Popen([sys.executable, "-m", "gputop", "--pid", str(job.pid), "--headless", "--duration", "30",
                              "--record", str(home / "s.gtrec")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
        mine = None
        for _ in range(200):
            time.sleep(0.1)
            mine = [d for d in base.iterdir() if d.name.startswith(f"stacks-{p.pid}-")]
            if mine:
                break
        assert mine, "no py-spy window directory appeared"
        assert mode(mine[0]) == 0o700
        assert not stale.exists()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 128 + signal.SIGTERM, err   # ended by the signal, cleanly
        assert not mine[0].exists() and alive.exists()
    finally:
        job.kill()
        job.wait()


def test_ctrl_c_of_a_headless_demo_leaves_no_probe_socket(home):
    """Issue 12 item 15: the demo's probe socket is gone after Ctrl-C (SIGINT) of gputop."""
    p = subprocess.Popen([sys.executable, "-m", "gputop", "demo", "--scenario", "python", "--headless",
                          "--duration", "60", "--no-stacks", "--record", str(home / "d.gtrec")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    probe = home / "probe"
    for _ in range(300):
        time.sleep(0.1)
        if probe.is_dir() and any(n.endswith(".sock") for n in os.listdir(probe)):
            break
    else:
        p.kill()
        pytest.fail("the demo's probe never listened: " + p.communicate()[1][-2000:])
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    # 0 when the session had started (its handler ends it as its duration would); 130 when the
    # Ctrl-C came while gputop was still starting (a loaded CI box): the socket goes either way.
    # Killed by SIGINT (-2, which a shell also reads as 130): about once in 40 Ctrl-Cs during
    # start-up beside two CPU hogs, seen once in a clean-clone run; strace shows the one SIGINT
    # passed on to the job, the job stopped and its line said, then the interpreter re-sending
    # SIGINT to itself as it exits (CPython's exit for an interrupt it counts as unhandled) --
    # what a program interrupted by Ctrl-C should do, not a crash (no traceback: checked below)
    assert p.returncode in (0, 130, -signal.SIGINT), err
    assert "Traceback" not in err, err
    assert [n for n in os.listdir(probe) if n.endswith(".sock")] == [], err
