"""Loaded by Python at start-up in every process that ``gputop run`` starts (PYTHONPATH).

1. Loads gputop's probe: from ``$GPUTOP_PROBE_HOME`` (the directory holding the ``gputop``
   package that launched the command), so it works even when the command's Python is another
   environment; that directory is on ``sys.path`` only while the probe is imported.
2. The first Python process of the command (``$GPUTOP_PROBE_ROOT`` unset) gets a listening
   probe at once; Python processes it starts (torchrun ranks, DataLoader workers, compile
   workers) get a dormant one that opens its socket only if that process steps an optimizer.
3. Runs the ``sitecustomize`` that would have run without us (the next one on ``sys.path``).

Never raises: a failure is one line on stderr and the command runs without a probe.
"""

import os
import sys


def _gputop_boot():
    if os.environ.get("GPUTOP_PROBE_OFF"):
        return
    home = os.environ.get("GPUTOP_PROBE_HOME")
    try:
        added = False
        if home and home not in sys.path:
            sys.path.insert(0, home)
            added = True
        try:
            import gputop.probe as probe
            import gputop.probe.core  # noqa: F401  (import everything while home is on the path)
            import gputop.probe.torch_hooks  # noqa: F401
            import gputop.probe.wire  # noqa: F401
        finally:
            if added:
                try:
                    sys.path.remove(home)
                except ValueError:
                    pass
        root = os.environ.get("GPUTOP_PROBE_ROOT")
        if not root:
            os.environ["GPUTOP_PROBE_ROOT"] = str(os.getpid())
            dormant = False
        else:
            dormant = root != str(os.getpid())
        probe.install(dormant=dormant, origin="launch")
    except Exception as e:
        sys.stderr.write(f"gputop probe: not loaded: {type(e).__name__}: {e}\n")


def _chain():
    """Run the sitecustomize that our directory shadows, as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        try:
            if os.path.abspath(entry or os.getcwd()) == here:
                continue
        except Exception:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        try:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
        except Exception as e:
            sys.stderr.write(f"Error in sitecustomize ({spec.origin}): {type(e).__name__}: {e}\n")
        return


_gputop_boot()
_chain()
