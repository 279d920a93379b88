"""The line text the stack source reads from the files a target's frames name (co_filename).

The target names those files, and gputop may run as root: a FIFO once blocked the stack
source's thread for good, /dev/zero was read until memory ran out, and a process of another user
that named its code /etc/shadow got that file's first line into the recording (an audit's
reproductions). Real files, a real FIFO, real processes of another user.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gputop.sources.speedscope import MAX_SOURCE_BYTES, SourceLines


def _line(pid: int, path: str, lineno: int = 1, timeout: float = 5.0):
    """SourceLines().line in a thread, so a read that blocks fails the test instead of hanging it."""
    got: list = []
    t = threading.Thread(target=lambda: got.append(SourceLines().line(pid, path, lineno)), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"reading {path} blocked"
    return got[0]


def test_a_regular_file_of_the_targets_is_read(tmp_path):
    f = tmp_path / "train.py"
    f.write_text("import torch\n  loss.backward()   \n")
    assert _line(os.getpid(), str(f), 2) == "loss.backward()"
    assert _line(os.getpid(), str(f), 3) is None


def test_a_fifo_a_device_and_a_directory_are_not_read(tmp_path):
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    assert _line(os.getpid(), str(fifo)) is None       # (opened, it would wait for a writer forever)
    assert _line(os.getpid(), "/dev/zero") is None     # (read, it never ends)
    assert _line(os.getpid(), str(tmp_path)) is None


def test_a_file_past_the_size_bound_is_not_read(tmp_path):
    f = tmp_path / "big.py"
    with open(f, "wb") as out:
        out.write(b"x = 1\n")
        out.truncate(MAX_SOURCE_BYTES + 1)
    assert _line(os.getpid(), str(f)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="a process of another user needs root to start")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
def test_root_reads_for_another_users_target_only_what_that_user_could(tmp_path):
    # (tmp_path's parents are root's 0700 directories: the files go in one anyone may search)
    open_dir = pathlib.Path(tempfile.mkdtemp(prefix="gputop-src-"))
    os.chmod(open_dir, 0o755)
    secret, shared = open_dir / "secret.py", open_dir / "shared.py"
    secret.write_text("root's line\n")
    os.chmod(secret, 0o600)
    shared.write_text("anyone's line\n")
    os.chmod(shared, 0o644)
    hidden = tmp_path / "known_hosts.py"   # readable by anyone, in a directory only root enters
    hidden.write_text("behind root's directory\n")
    os.chmod(hidden, 0o644)
    os.chmod(tmp_path, 0o700)
    nobody = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{nobody.pid}").st_uid != 65534:   # (setpriv drops root at its exec)
            assert time.monotonic() < deadline, "the process never became nobody's"
            time.sleep(0.01)
        assert _line(nobody.pid, str(secret)) is None
        assert _line(nobody.pid, "/etc/shadow") is None
        assert _line(nobody.pid, str(shared)) == "anyone's line"
        assert _line(nobody.pid, str(hidden)) is None
        assert os.path.exists("README.md")   # (the suite runs at the repository's root)
        assert _line(nobody.pid, "README.md") is None   # (relative: to gputop's directory, not the job's)
        os.chown(secret, 65534, 65534)   # its own file, readable by its owner
        assert _line(nobody.pid, str(secret)) == "root's line"
        assert _line(os.getpid(), str(hidden)) == "behind root's directory"   # root's own job: all it can
    finally:
        nobody.kill()
        nobody.wait()
        shutil.rmtree(open_dir, ignore_errors=True)
