"""The verdict catalogue: each verdict declared once, next to its rule, with ``@verdict(...)``.

A spec holds what the rest of gputop needs to know about a verdict without running it: its id
(the rule function's name), default title and severity, its place in the order of specificity
(ties for the primary verdict go to the lower ``order``), whether it names a cause of lost
time, and a one-line meaning for the help screen. The meaning is a template formatted from the
rule module's own threshold constants (``"SM active >= {GPU_BOUND_SM_ACTIVE:.0f}%"``), so the
prose cannot drift from the numbers.

Everything that lists verdicts derives from here: ``rules.RULES``/``VERDICT_IDS``,
``engine.ORDER``/``NOT_A_CAUSE``, the help screen's meanings and the exporter's series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable

from gputop.verdicts.finding import SEVERITIES, Finding

_SPECS: dict[str, VerdictSpec] = {}


@dataclass(frozen=True, kw_only=True)
class VerdictSpec:
    id: str
    title: str                  # default title; may hold {fields} the rule fills in (straggler's rank)
    severity: str               # default severity; a rule may raise it (host memory nearly gone)
    order: int                  # specificity: lower explains more
    names_cause: bool           # False: describes the GPU's state (busy, idle, full), not lost time
    meaning_template: str       # one line; {CONSTANT:format} fields come from the rule's module
    rule: Callable = field(repr=False)
    # other titles the rule may use instead of the default (clock_throttled: the power cap)
    alt_titles: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    across_ranks: bool = False  # the rule compares ranks (not one window's signals): not in RULES

    @property
    def meaning(self) -> str:
        return self.meaning_template.format_map(self.rule.__globals__)

    @property
    def titles(self) -> tuple[str, ...]:
        return (self.title, *self.alt_titles.values())

    def finding(self, **kw) -> Finding:
        """This verdict's finding: id, title and severity default to the spec's."""
        kw.setdefault("title", self.title)
        kw.setdefault("severity", self.severity)
        return Finding(id=self.id, **kw)


def verdict(*, title: str, severity: str, order: int, names_cause: bool = True, meaning: str,
            alt_titles: dict[str, str] | None = None, across_ranks: bool = False):
    """Register the decorated rule function as a verdict; the spec is its ``.spec``."""
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r}")

    def register(rule):
        vid = rule.__name__
        if vid in _SPECS:
            raise ValueError(f"verdict {vid!r} is declared twice")
        if any(s.order == order for s in _SPECS.values()):
            raise ValueError(f"verdict {vid!r}: order {order} is taken")
        rule.spec = _SPECS[vid] = VerdictSpec(
            id=vid, title=title, severity=severity, order=order, names_cause=names_cause,
            meaning_template=meaning, rule=rule, alt_titles=MappingProxyType(dict(alt_titles or {})),
            across_ranks=across_ranks)
        return rule

    return register


def specs() -> list[VerdictSpec]:
    """Every verdict, most specific first."""
    from gputop.verdicts import rules  # noqa: F401  (its decorators fill the registry)

    return sorted(_SPECS.values(), key=lambda s: s.order)


def spec(vid: str) -> VerdictSpec:
    return {s.id: s for s in specs()}[vid]


def __getattr__(name: str):
    # ``from gputop.verdicts.registry import VERDICT_IDS`` (the exporter): computed on first use,
    # since the registry is complete only once rules.py has run its decorators
    if name == "VERDICT_IDS":
        return tuple(s.id for s in specs())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
