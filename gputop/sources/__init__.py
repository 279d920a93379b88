"""Sources: one module per signal. Each runs its own thread(s) and publishes samples.

Importing this package must not need textual (a test enforces it).
"""

from __future__ import annotations

import importlib

# Modules that export ``METRICS: list[MetricSpec]``, the fields the sources publish. A new source
# adds its module here. The modules named import without pynvml (nvml_fields, probe_fields:
# the tables of nvml.py and probe_client.py, which need pynvml and psutil).
SOURCE_MODULES = ("gputop.sources.nvml_fields", "gputop.sources.host", "gputop.sources.stacks",
                  "gputop.sources.probe_fields")

# And the processors' fields (imported by name, only when asked: a source never needs derive/).
METRIC_MODULES = SOURCE_MODULES + ("gputop.derive.threads",)


def import_optional(name: str):
    """The module, or None when that module itself does not exist (a source not part of this
    build). Any other import error is raised."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise


def module_specs(name: str) -> list:
    """One module's METRICS (empty when the module is not part of this build)."""
    mod = import_optional(name)
    return list(getattr(mod, "METRICS", None) or []) if mod is not None else []


def metric_specs() -> list:
    """Every MetricSpec the sources and processors declare (for the help screen, the report, the
    exporter and the docs), in METRIC_MODULES order."""
    return [m for name in METRIC_MODULES for m in module_specs(name)]
