"""The verdict registry (gputop/verdicts/registry.py) is the one list of verdicts: the names the
engine, the rules module, the help screen and the exporter use come from it, the docs' table
lists every verdict with its titles, and each meaning shows the thresholds it is made from."""

from __future__ import annotations

import pathlib
import string

import pytest

from gputop.verdicts import engine, rules
from gputop.verdicts.finding import SEVERITIES, SEVERITY_WARNING, Finding
from gputop.verdicts.registry import VERDICT_IDS as REGISTRY_VERDICT_IDS
from gputop.verdicts.registry import spec, specs

DOCS = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "verdicts.md").read_text()


class _Placeholder(dict):
    """Fills any {field} of a title with "N", as the docs write it ("rank N")."""

    def __missing__(self, key):
        return "N"


def _doc_row(vid: str) -> str:
    rows = [line for line in DOCS.splitlines() if line.startswith(f"| `{vid}` |")]
    assert len(rows) == 1, f"{vid}: {len(rows)} rows in docs/verdicts.md's table"
    return rows[0]


def _thresholds(template: str) -> list[tuple[str, str]]:
    """The (constant name, format spec) fields of a meaning template."""
    return [(name, fmt) for _, name, fmt, _ in string.Formatter().parse(template) if name]


@pytest.mark.parametrize("vid", [s.id for s in specs()])
def test_every_verdict_is_in_the_docs_table_with_its_titles(vid):
    row = _doc_row(vid)
    for title in spec(vid).titles:
        assert f'"{title.format_map(_Placeholder())}"' in row, (vid, title)
    assert spec(vid).severity in row


@pytest.mark.parametrize("vid", [s.id for s in specs()])
def test_each_meaning_is_one_line_made_from_its_threshold_constants(vid):
    sp = spec(vid)
    assert len(sp.meaning) <= 100 and "\n" not in sp.meaning
    module = sp.rule.__globals__   # the rule's own module holds its constants
    for name, fmt in _thresholds(sp.meaning_template):
        assert name.isupper() and isinstance(module[name], (int, float)), name
        assert format(module[name], fmt) in sp.meaning, (vid, name)
        assert f"`{name}`" in _doc_row(vid), f"docs/verdicts.md's {vid} row should name {name}"


def test_a_meaning_follows_its_constant(monkeypatch):
    monkeypatch.setattr(rules, "GPU_BOUND_SM_ACTIVE", 85.0)
    assert "SM active >= 85%" in spec("gpu_bound").meaning
    monkeypatch.setattr(rules, "INPUT_BOUND_SHARE", 0.3)
    assert ">= 30% of step time" in spec("input_bound").meaning


def test_the_old_names_derive_from_the_registry():
    everything = specs()
    assert [s.order for s in everything] == sorted({s.order for s in everything}), "orders are unique"
    assert all(s.severity in SEVERITIES for s in everything)
    assert rules.RULES == [s.rule for s in everything if not s.across_ranks]
    assert [s.id for s in everything if s.across_ranks] == ["straggler_rank"]
    assert rules.VERDICT_IDS == REGISTRY_VERDICT_IDS == tuple(s.id for s in everything)
    assert engine.ORDER == {s.id: s.order for s in everything}
    assert min(engine.ORDER, key=engine.ORDER.get) == "straggler_rank"
    assert set(engine.NOT_A_CAUSE) == {"gpu_idle", "gpu_bound", "memory_bound", "clock_throttled",
                                       "gpu_memory_pressure"}
    assert all(s.rule.__name__ == s.id and s.rule.spec is s for s in everything)


def test_a_spec_fills_in_its_findings_id_title_and_severity():
    sp = spec("clock_throttled")
    kw = dict(level=1.0, lost_share=0.0, confidence=0.9, evidence={}, advice="a", summary="s")
    f = sp.finding(**kw)
    assert (f.id, f.title, f.severity) == ("clock_throttled", sp.title, SEVERITY_WARNING)
    g = sp.finding(title=sp.alt_titles["power_cap"], severity="info", **kw)
    assert (g.title, g.severity) == ("Clocks capped by power", "info")
    with pytest.raises(TypeError):
        Finding("x", "t", SEVERITY_WARNING, 1.0, 0.0, 1.0, {}, "a", "s")  # keywords only


def test_prometheus_doc_lists_every_verdict_id_for_the_label():
    """docs/prometheus.md's `verdict` label row names exactly the registry's ids (it had fallen
    behind by six when verdicts were added)."""
    import pathlib
    import re

    from gputop.verdicts.registry import VERDICT_IDS

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "prometheus.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `verdict` | verdict series |"))
    assert re.findall(r"`([a-z0-9_]+)`", row.split("|")[3]) == list(VERDICT_IDS)
