"""Planted links above the files gputop writes (issue 32): as root, another user's symbolic link
anywhere on the way is refused, not only at the last component, and XDG_STATE_HOME or HOME that
are not this user's own are not used. Making another user's link needs root (lchown), as the
attack does: the tests run where root runs them (CI)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from gputop.session.recorder import RecordingWriter
from gputop.session.recording_format import RecordingError
from gputop.sources import files

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="another user's link can only be made by root")
NOBODY = 65534


def _world(tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
    """A sticky world-writable directory (a /tmp) and a victim directory only root may write."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    return tmp, victim


def _plant(link: pathlib.Path, target: pathlib.Path) -> None:
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)


def test_another_users_link_above_a_state_directory_is_refused(tmp_path):
    tmp, victim = _world(tmp_path)
    _plant(tmp / "astate", victim)
    with pytest.raises(files.FilesError, match="symbolic link owned by uid 65534"):
        files.private_dir(str(tmp / "astate" / "rec"), make_parents=True)
    assert list(victim.iterdir()) == []           # nothing was written through it
    # root's own link is followed as before
    (tmp_path / "mine").symlink_to(victim)
    assert files.private_dir(str(tmp_path / "mine" / "rec")) == str(victim / "rec")


def test_record_through_another_users_link_is_refused(tmp_path):
    tmp, victim = _world(tmp_path)
    _plant(tmp / "mlink", victim)
    with pytest.raises(RecordingError, match="symbolic link owned by uid 65534"):
        RecordingWriter(str(tmp / "mlink" / "run.gtrec"), {})
    assert not (victim / "run.gtrec").exists()
    # into the sticky directory itself, or a private one, as before
    RecordingWriter(str(tmp / "run.gtrec"), {}).close()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(RecordingError, match="writable by other users"):
        RecordingWriter(str(shared / "run.gtrec"), {})


def test_xdg_state_home_of_another_user_is_not_used(tmp_path):
    tmp, victim = _world(tmp_path)
    _plant(tmp / "xdg", victim)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    code = ("from gputop.sources import files; import sys; print(files.state_base()); "
            "print(files.state_dir())")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "xdg"), "HOME": str(home)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert str(home / ".local" / "state" / "gputop") in out.stdout
    assert list(victim.iterdir()) == []
    # a HOME that is another user's is not root's home either
    other = tmp_path / "otherhome"
    other.mkdir()
    os.chown(other, NOBODY, NOBODY)
    env = {**os.environ, "HOME": str(other)}
    env.pop("XDG_STATE_HOME", None)
    out = subprocess.run([sys.executable, "-c", "from gputop.sources import files; print(files.state_base())"],
                         env=env, capture_output=True, text=True, timeout=30)
    assert str(other) not in out.stdout


def test_dot_dot_after_a_link_is_where_the_kernel_goes(tmp_path):
    """`--record DIR/link/../run.gtrec`: the kernel applies ".." after following the link, so the
    check must look at (and the file go into) the link target's parent, not DIR (abspath folded
    "link/.." away as text); through another user's link there, it is refused."""
    tmp, victim = _world(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "mine").symlink_to(tmp_path / "a" / "b")
    RecordingWriter(str(tmp_path / "mine" / ".." / "run.gtrec"), {}).close()
    assert (tmp_path / "a" / "run.gtrec").exists() and not (tmp_path / "run.gtrec").exists()
    _plant(tmp_path / "a" / "theirs", victim)
    with pytest.raises(RecordingError, match="symbolic link owned by uid 65534"):
        RecordingWriter(str(tmp_path / "mine" / ".." / "theirs" / "run.gtrec"), {})
