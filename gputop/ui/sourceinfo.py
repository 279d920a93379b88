"""What the UI learns from the source modules themselves: metric help and clock-event words.

Each source module may export ``METRICS: list[MetricSpec]`` (shown by the help screen) and the
NVML source exports ``CLOCK_EVENT_WORDS`` (NVML clock-event names in words). A module that does
not exist (a source not written yet, or left out of an install) is skipped: the UI must start
with whatever sources there are.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from gputop.model import MetricSpec

# The modules that may describe their samples. A new source adds itself here (one line) or
# panels carry their own METRICS (see gputop/ui/panels/__init__.py).
METRIC_MODULES = (
    "gputop.sources.nvml",
    "gputop.sources.host",
    "gputop.sources.stacks",
    "gputop.sources.probe_client",
    "gputop.derive.threads",
    "gputop.verdicts",
)

# Used until gputop.sources.nvml says otherwise. Names follow NVML's
# nvmlClocksEventReasons (the "throttle reasons" of older drivers).
FALLBACK_CLOCK_EVENT_WORDS = {
    "gpu_idle": "idle",
    "applications_clocks_setting": "application clock setting",
    "sw_power_cap": "power cap (software)",
    "hw_slowdown": "hardware slowdown",
    "sync_boost": "sync boost",
    "sw_thermal": "thermal (software)",
    "hw_thermal": "thermal (hardware)",
    "hw_power_brake": "power brake (hardware)",
    "display_clocks": "display clock setting",
}


def _import(name: str):
    """The module, or None when it does not exist. Any other failure is reported as text."""
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None, None  # the module itself is missing: not written or not installed
        return None, f"{name}: {e}"
    except Exception as e:  # a half-written module must not stop the UI
        return None, f"{name}: {type(e).__name__}: {e}"


@dataclass
class MetricHelp:
    specs: list[MetricSpec] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # modules that failed to import


def collect_metric_specs(extra: list[MetricSpec] | None = None) -> MetricHelp:
    out = MetricHelp()
    seen: set[tuple[str, str]] = set()
    for name in METRIC_MODULES:
        mod, problem = _import(name)
        if problem:
            out.problems.append(problem)
        for spec in (getattr(mod, "METRICS", None) or []) if mod else []:
            if isinstance(spec, MetricSpec) and (spec.kind, spec.field) not in seen:
                seen.add((spec.kind, spec.field))
                out.specs.append(spec)
    for spec in extra or []:
        if (spec.kind, spec.field) not in seen:
            seen.add((spec.kind, spec.field))
            out.specs.append(spec)
    return out


_words: dict[str, str] | None = None


def clock_event_words() -> dict[str, str]:
    global _words
    if _words is None:
        words = dict(FALLBACK_CLOCK_EVENT_WORDS)
        mod, _ = _import("gputop.sources.nvml")
        got = getattr(mod, "CLOCK_EVENT_WORDS", None) if mod else None
        if isinstance(got, dict):
            words.update({str(k): str(v) for k, v in got.items()})
        _words = words
    return _words


def clock_events_text(events) -> str:
    """["sw_power_cap", "hw_thermal"] -> "power cap (software), thermal (hardware)"."""
    if events is None:
        return "n/a"
    if not isinstance(events, list):
        return "n/a: unreadable value"
    if not events:
        return "none"
    words = clock_event_words()
    return ", ".join(words.get(str(e), str(e).replace("_", " ")) for e in events)
