"""Sources: one module per signal. Each runs its own thread(s) and publishes samples.

Importing this package must not need textual (a test enforces it).
"""

from __future__ import annotations

import importlib

# Modules that may export ``METRICS: list[MetricSpec]``. A new source adds its module here.
SOURCE_MODULES = ("gputop.sources.nvml", "gputop.sources.host", "gputop.sources.stacks",
                  "gputop.sources.probe_client")


def metric_specs() -> list:
    """Every MetricSpec the sources declare (for the help screen, the report and the docs)."""
    specs = []
    for name in SOURCE_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that source is not part of this build
                continue
            raise
        specs.extend(getattr(mod, "METRICS", []))
    return specs
