"""Implicit-sync counting, the part that can run without a GPU.

On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` makes torch raise a UserWarning "called a
synchronizing CUDA operation" at the Python line that caused each sync; the probe counts those
per step and per line and hides them. This machine has no GPU, so here the warnings are raised
by Python code at known lines (the same message, through the same warnings machinery) and the
probe's counting, line attribution, hiding and safety guards are checked for real; that torch
really raises them on a GPU is checked by benchmarks/probe_accuracy.py (``syncs`` scenario).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, logging, os, sys, warnings
    import torch
    from gputop.probe.core import Probe, SYNC_MESSAGE
    from gputop.probe.torch_hooks import TorchHooks

    libdir = sys.argv[1]
    sys.path.insert(0, libdir)
    import fakelib   # stands in for library code (torch's own Python, say) that syncs

    p = Probe(dormant=True, origin="test")
    h = TorchHooks(p, torch)
    p.torch, p.torch_hooks = torch, h
    h.skip_prefixes = h.skip_prefixes + (libdir + os.sep,)
    # What set_sync_capture(True) does, minus torch.cuda.set_sync_debug_mode (no GPU here):
    h._ensure_showwarning()
    warnings.filterwarnings("always", message=SYNC_MESSAGE, category=UserWarning)
    h._sync_filter = warnings.filters[0]
    p.sync_capture = True
    MSG = SYNC_MESSAGE + " (Triggered internally at CUDAFunctions.h:120.)"
    LINES = {}

    def step_body():
        for _ in range(3):
            LINES["item"] = sys._getframe().f_lineno + 1
            warnings.warn(MSG)              # as loss.item() would, at this line
        LINES["lib"] = sys._getframe().f_lineno + 1
        fakelib.sync(MSG)                   # a sync inside library code: blamed on this line

    for _ in range(2):
        step_body()
        p.on_marker_step()
    warnings.warn("an ordinary warning the job should still see")
    out = {"total": p.sync_total, "lines": dict(p.sync_lines), "per_step": [r[6] for r in p.records],
           "file": __file__ if "__file__" in globals() else "<string>", "where": LINES}

    # logging.captureWarnings replaces showwarning: the probe wraps it again, counting goes on.
    logging.basicConfig(stream=sys.stderr, format="LOGGED %(message)s")
    logging.captureWarnings(True)
    h._check_sync_plumbing()
    step_body()
    warnings.warn("a second ordinary warning, through logging")
    out["after_logging"] = p.sync_total

    # A catch_warnings() block that ended dropped our filter: it is put back in front.
    warnings.filters.remove(h._sync_filter)
    warnings.simplefilter("ignore")
    h._check_sync_plumbing()
    step_body()
    out["after_filter_lost"] = p.sync_total

    # The job turns warnings into errors: counting stops at once, so a sync can never raise.
    warnings.simplefilter("error")
    h._check_sync_plumbing()
    out["capture_after_error_filter"] = p.sync_capture
    out["hook"] = p.hooks.get("syncs")
    out["our_filter_left"] = any(f[1] is not None and f[1].pattern.startswith("called a sync") for f in warnings.filters)
    print(json.dumps(out))
''')


def test_sync_warnings_are_counted_per_step_and_line_and_hidden(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "fakelib.py").write_text("import warnings\n\ndef sync(msg):\n    warnings.warn(msg)\n")
    script = tmp_path / "syncs.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(lib)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    path = str(script)
    # 3 syncs at the item line and 1 blamed on the library call, per step, two steps.
    assert res["total"] == 8
    assert res["per_step"] == [4, 4]
    assert res["lines"] == {f"{path}:{res['where']['item']}": 6, f"{path}:{res['where']['lib']}": 2}
    # The sync warnings were swallowed; ordinary warnings still reach the job's stderr / logging.
    assert "synchronizing" not in out.stderr
    assert "an ordinary warning the job should still see" in out.stderr
    assert "LOGGED" in out.stderr and "a second ordinary warning, through logging" in out.stderr
    assert res["after_logging"] == 12
    assert res["after_filter_lost"] == 16
    assert res["capture_after_error_filter"] is False
    assert res["hook"][0] == "off" and "warnings into errors" in res["hook"][1]
    assert res["our_filter_left"] is False
