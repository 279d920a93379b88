"""Implicit-sync counting, the part that can run without a GPU.

On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` makes torch raise a UserWarning "called a
synchronizing CUDA operation" at the Python line that caused each sync; the probe counts those
per step and per line and hides them. This machine has no GPU, so torch's process-wide sync
debug mode is stood in for by a plain int (``MODE``), and an implicit sync by ``sync()``, which
warns, as torch does, only while the mode is 1. Everything else is the probe's real code on the
real warnings machinery: turning counting on and off, counting, line attribution, hiding, and
the guards that keep the job's warnings as they would be without the probe. That torch really
raises these warnings on a GPU is checked by benchmarks/probe_accuracy.py (``syncs`` scenario).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, logging, os, sys, threading, time, warnings
    import torch
    from gputop.probe import core
    from gputop.probe.core import Probe, SYNC_MESSAGE
    from gputop.probe.torch_hooks import SYNC_FILTER, TorchHooks

    libdir = sys.argv[1]
    sys.path.insert(0, libdir)
    import fakelib   # stands in for library code (torch's own Python, say) that syncs

    p = Probe(dormant=True, origin="test")
    h = TorchHooks(p, torch)
    p.torch, p.torch_hooks = torch, h
    h.skip_prefixes = h.skip_prefixes + (libdir + os.sep,)

    # torch's process-wide sync debug mode (no CUDA here). Like torch, turning it on warns once,
    # from inside the call, that the mode is a prototype.
    MODE = {"mode": 0}
    PAUSE = {"on": False}
    go, done = threading.Event(), threading.Event()

    def set_mode(m):
        if m:
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations")
            if PAUSE["on"]:   # hold the probe thread inside torch's call while the job warns
                go.set()
                done.wait(10)
        MODE["mode"] = m

    h._torch_sync_mode = lambda: MODE["mode"]
    h._set_torch_sync_mode = set_mode
    MSG = SYNC_MESSAGE + " (Triggered internally at CUDAFunctions.h:120.)"
    LINES = {}

    def sync():
        """An implicit sync: torch warns at the calling line, only in mode 1 ('warn')."""
        if MODE["mode"] == 1:
            warnings.warn(MSG, stacklevel=2)

    def step_body():
        for _ in range(3):
            LINES["item"] = sys._getframe().f_lineno + 1
            sync()                          # as loss.item() would, at this line
        LINES["lib"] = sys._getframe().f_lineno + 1
        fakelib.sync(MSG)                   # a sync inside library code: blamed on this line

    out = {"file": __file__}
    ws = core._WindowState(p)               # a window that starts before counting does

    # Counting is turned on by the probe thread, never with catch_warnings() there: a warning
    # the job raises meanwhile must still reach it, and torch's prototype notice must not.
    PAUSE["on"] = True
    t = threading.Thread(target=h.set_sync_capture, args=(True,))
    t.start()
    go.wait(10)
    warnings.warn("the job warns while the probe turns counting on")
    done.set()
    t.join()
    PAUSE["on"] = False
    out["capture_on"] = p.sync_capture
    out["mode_on"] = MODE["mode"]

    for _ in range(2):
        step_body()
        p.on_marker_step()
    out["w1"] = ws.window_msg(time.monotonic())    # counting began inside this window
    step_body()
    p.on_marker_step()
    out["w2"] = ws.window_msg(time.monotonic())    # counted from its start
    warnings.warn("an ordinary warning the job should still see")
    out["total"] = p.sync_total
    out["lines"] = dict(p.sync_lines)
    out["where"] = LINES

    # logging.captureWarnings replaces showwarning: counting goes on, logging gets the rest.
    logging.basicConfig(stream=sys.stderr, format="LOGGED %(message)s")
    logging.captureWarnings(True)
    h._check_sync_plumbing()
    step_body()
    warnings.warn("a second ordinary warning, through logging")
    out["after_logging"] = p.sync_total
    logging.captureWarnings(False)

    # A catch_warnings() block that ended dropped our filter, and the job hides warnings:
    # our filter is put back in front, so syncs are still counted (and still hidden).
    warnings.filters.remove(SYNC_FILTER)
    warnings.simplefilter("ignore")
    h._check_sync_plumbing()
    step_body()
    out["after_filter_lost"] = p.sync_total
    warnings.resetwarnings()
    h._check_sync_plumbing()

    # catch_warnings(record=True): syncs are counted and never land in the job's list.
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        sync()
        sync()
        warnings.warn("the job's own warning, recorded")
    out["recorded"] = [str(w.message) for w in rec]
    out["after_record"] = p.sync_total

    # Filters that cannot make the sync warning an error leave counting on.
    warnings.filterwarnings("error", category=DeprecationWarning)
    warnings.filterwarnings("error", message="some other text")
    out["on_after_unrelated_error_filters"] = p.sync_capture
    warnings.resetwarnings()
    h._check_sync_plumbing()

    def sync_raises():
        try:
            sync()
            return None
        except UserWarning as e:
            return str(e)

    # "error" inside a catch_warnings() block: counting stops before the filter goes in, on
    # the job's thread, so the sync does not raise; the job's own warnings do, as it asked.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out["block_sync_raised"] = sync_raises()
        out["block_capture"] = p.sync_capture
        out["block_mode"] = MODE["mode"]
        out["block_hook"] = p.hooks.get("syncs")
        try:
            warnings.warn("the job's own warning, as an error")
            out["block_job_warning_raised"] = False
        except UserWarning:
            out["block_job_warning_raised"] = True
    # The block is over: the next window turns counting on again.
    h.set_sync_capture(True)
    out["resumed"] = p.sync_capture

    # catch_warnings(action="error") adds its filter through the same path.
    if sys.version_info >= (3, 11):
        with warnings.catch_warnings(action="error"):
            out["action_sync_raised"] = sync_raises()
            out["action_capture"] = p.sync_capture
        h.set_sync_capture(True)

    # A late simplefilter("error") outside any block: the same, and counting stays off.
    before = p.sync_total
    warnings.simplefilter("error")
    out["late_sync_raised"] = sync_raises()
    out["late_capture"] = p.sync_capture
    out["late_counted"] = p.sync_total - before
    h.set_sync_capture(True)
    out["late_capture_after_retry"] = p.sync_capture
    out["late_hook"] = p.hooks.get("syncs")
    out["our_filter_left"] = SYNC_FILTER in warnings.filters
    print(json.dumps(out))
''')


def test_sync_counting_per_step_and_line_hidden_and_never_raising_in_the_job(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "fakelib.py").write_text("import warnings\n\ndef sync(msg):\n    warnings.warn(msg)\n")
    script = tmp_path / "syncs.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(lib)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    path = str(script)
    # Turned on from another thread: the job's warning meanwhile was shown, torch's notice not.
    assert res["capture_on"] is True and res["mode_on"] == 1
    assert "the job warns while the probe turns counting on" in out.stderr
    assert "prototype feature" not in out.stderr
    # 3 syncs at the item line and 1 blamed on the library call, per step, three steps.
    assert res["total"] == 12
    assert res["lines"] == {f"{path}:{res['where']['item']}": 9, f"{path}:{res['where']['lib']}": 3}
    # The window in which counting began says so instead of a short count; the next one counts.
    w1, w2 = res["w1"], res["w2"]
    assert w1["syncs"] is None and w1["step_syncs"] is None and "off for part of this window" in w1["sync_off"]
    assert w2["syncs"] == 4 and w2["step_syncs"] == 4 and w2["sync_off"] is None
    # The sync warnings were swallowed; ordinary warnings still reach the job's stderr / logging.
    assert "synchronizing" not in out.stderr
    assert "an ordinary warning the job should still see" in out.stderr
    assert "LOGGED" in out.stderr and "a second ordinary warning, through logging" in out.stderr
    assert res["after_logging"] == 16
    assert res["after_filter_lost"] == 20
    # record=True: the job's list holds only its own warning; the two syncs were counted.
    assert res["recorded"] == ["the job's own warning, recorded"]
    assert res["after_record"] == 22
    assert res["on_after_unrelated_error_filters"] is True
    # An "error" filter never makes a sync raise in the job, in a block or not.
    assert res["block_sync_raised"] is None
    assert res["block_capture"] is False and res["block_mode"] == 0
    assert res["block_hook"][0] == "off" and "into errors" in res["block_hook"][1]
    assert res["block_job_warning_raised"] is True
    assert res["resumed"] is True
    if sys.version_info >= (3, 11):
        assert res["action_sync_raised"] is None and res["action_capture"] is False
    assert res["late_sync_raised"] is None and res["late_capture"] is False and res["late_counted"] == 0
    assert res["late_capture_after_retry"] is False
    assert res["late_hook"][0] == "off" and "warnings into errors" in res["late_hook"][1]
    assert res["our_filter_left"] is False


FORK_SCRIPT = textwrap.dedent('''
    import os, sys, threading, time, warnings
    import torch
    import gputop.probe
    from gputop.probe.core import Probe
    from gputop.probe.torch_hooks import TorchHooks

    p = Probe(dormant=True, origin="test")
    h = TorchHooks(p, torch)
    p.torch, p.torch_hooks = torch, h
    gputop.probe._PROBE = p                 # so the at-fork handler resets this probe
    h._torch_sync_mode = lambda: 0
    h._set_torch_sync_mode = lambda m: None
    h.set_sync_capture(True)                # the warnings wrappers are in place
    held, release = threading.Event(), threading.Event()

    def probe_thread():                     # the probe thread, holding the lock at the fork
        with h._sync_lock:
            held.set()
            release.wait(10)

    threading.Thread(target=probe_thread, daemon=True).start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:
        warnings.simplefilter("error")      # the child adds an error filter: must not hang
        os._exit(7)
    release.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child exit", os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung")
''')


def test_a_forked_child_can_add_an_error_filter_while_the_parents_probe_held_its_lock(tmp_path):
    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "child exit 7"
