"""What the UI learns from the catalogue: metric help and clock-event words.

The modules of ``gputop.sources.METRIC_MODULES`` export ``METRICS: list[MetricSpec]`` (shown by
the help screen); gputop/sources/nvml_fields.py has the NVML clock-event names in words. A module
that does not exist (a source left out of an install) is skipped, and one that fails to import is
reported as text: the UI must start with whatever sources there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputop.model import MetricSpec
from gputop.sources import METRIC_MODULES, module_specs
from gputop.session.sanitize import printable
from gputop.sources.nvml_fields import CLOCK_EVENT_WORDS

# The probe's fields are explained by the Steps panel (gputop/ui/panels/probe.py), which names
# the ones it shows; the rest of them are served to Prometheus only.
PANEL_DESCRIBED = ("gputop.sources.probe_fields",)


def _specs(name: str) -> tuple[list[MetricSpec], str | None]:
    """The module's METRICS (none when it does not exist), or a problem as text."""
    try:
        return module_specs(name), None
    except Exception as e:  # a half-written module must not stop the UI
        if isinstance(e, ModuleNotFoundError):
            return [], f"{name}: {e}"
        return [], f"{name}: {type(e).__name__}: {e}"


@dataclass
class MetricHelp:
    specs: list[MetricSpec] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # modules that failed to import


def collect_metric_specs(extra: list[MetricSpec] | None = None) -> MetricHelp:
    out = MetricHelp()
    seen: set[tuple[str, str]] = set()
    for name in (m for m in METRIC_MODULES if m not in PANEL_DESCRIBED):
        specs, problem = _specs(name)
        if problem:
            out.problems.append(problem)
        for spec in specs:
            if isinstance(spec, MetricSpec) and (spec.kind, spec.field) not in seen:
                seen.add((spec.kind, spec.field))
                out.specs.append(spec)
    for spec in extra or []:
        if (spec.kind, spec.field) not in seen:
            seen.add((spec.kind, spec.field))
            out.specs.append(spec)
    return out


def clock_event_words() -> dict[str, str]:
    return CLOCK_EVENT_WORDS


def clock_events_text(events) -> str:
    """["sw_power_cap", "hw_thermal"] -> "power cap (software), thermal (hardware)"."""
    if events is None:
        return "n/a"
    if not isinstance(events, list):
        return "n/a: unreadable value"
    if not events:
        return "none"
    words = clock_event_words()
    return ", ".join(clock_event_name(e, words, 40).replace("_", " ") for e in events)


def clock_event_name(event, words: dict[str, str], limit: int) -> str:
    """``words``' name for a clock event; one NVML does not give (a damaged or hand-made file's)
    as it is, its control characters written out (never raw to the terminal)."""
    return words.get(str(event)) or printable(str(event), limit)
