"""The catalogue: one home for sample kinds and field metadata, and docs/metrics.md agrees with it.

Every field of ``gputop.sources.metric_specs()`` has a row in docs/metrics.md, in the section of
its kind, with the same unit (the docs may spell a unit for people: °C for C, 1/s for /s).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from gputop import catalogue
from gputop.sources import metric_specs

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

# How docs/metrics.md spells a catalogue unit.
DOC_UNIT = {"°C": "C", "1/s": "/s", "% of one core": "%"}
# Doc units of fields the catalogue gives no unit (counts, names, bit masks, shares 0..1).
NO_UNIT = {"", "—", "names", "bits", "count", "list", "0..1"}


def _norm(unit: str) -> str:
    unit = unit.strip()
    if unit in NO_UNIT:
        return ""
    return DOC_UNIT.get(unit, unit)


def doc_rows() -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, field) -> (column name, value) of each documented field: its unit, or its label
    where the table has no unit column (thread states)."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    kind = None
    column = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            kind = None
        m = re.match(r"^### `(\w+)`", line) or re.match(r"^`(\w+)` (?:/|—)", line)
        if m:
            kind = m.group(1)
            continue
        if not line.startswith("|") or kind is None:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "field":
            column = next((i for i, c in enumerate(cells) if c in ("unit", "label")), None)
            column = (cells[column], column) if column is not None else None
            continue
        fields = re.findall(r"`([^`]+)`", cells[0])
        if not fields or column is None:
            continue
        name, i = column
        values = [v.strip() for v in cells[i].split(",")] if len(cells) > i else [""]
        if name == "label" or len(values) != len(fields):
            values = [cells[i] if len(cells) > i else ""] * len(fields)
        for f, v in zip(fields, values):
            out.setdefault((kind, f), (name, v))
    return out


def test_every_catalogue_field_is_documented_with_its_unit():
    rows = doc_rows()
    problems = []
    for m in metric_specs():
        got = rows.get((m.kind, m.field))
        if got is None:
            problems.append(f"{m.kind}.{m.field}: not in docs/metrics.md")
        elif got[0] == "unit" and _norm(got[1]) != m.unit:
            problems.append(f"{m.kind}.{m.field}: unit {m.unit!r} in the catalogue, {got[1]!r} in the docs")
        elif got[0] == "label" and got[1] != m.label:
            problems.append(f"{m.kind}.{m.field}: label {m.label!r} in the catalogue, {got[1]!r} in the docs")
    assert not problems, "\n".join(problems)


def test_fields_are_unique_and_exported_names_too():
    specs = metric_specs()
    keys = [(m.kind, m.field) for m in specs]
    assert len(keys) == len(set(keys)), "a field declared twice"
    names = [m.prom + ("_total" if m.counter else "") for m in specs if m.prom]
    assert len(names) == len(set(names)), "two fields served under one Prometheus name"
    for m in specs:
        assert m.label and m.help and "\n" not in m.help, m
        assert bool(m.prom) == bool(m.prom_help), m
        assert not m.dcgm or m.prom, m


def test_metric_specs_include_the_probe_and_thread_state_fields():
    keys = {(m.kind, m.field) for m in metric_specs()}
    assert (catalogue.KIND_PROBE_STEP, "steps_per_s") in keys
    assert (catalogue.KIND_PROBE_MEMORY, "allocated") in keys
    assert (catalogue.KIND_THREAD_STATE, "gil_pct") in keys
    assert (catalogue.KIND_GPU, "sm_active") in keys


def test_scale_follows_the_unit():
    def spec(unit):
        return catalogue.MetricSpec("k", "f", unit, "l", "h")
    assert spec("%").scale == 0.01
    assert spec("MiB/s").scale == 1048576
    assert spec("MHz").scale == 1e6
    assert spec("ms").scale == spec("ms/s").scale == 0.001
    assert spec("B").scale == spec("W").scale == spec("").scale == 1


def test_catalogue_imports_without_pynvml_psutil_or_textual():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pynvml', 'psutil', 'textual', 'rich'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import gputop.catalogue, gputop.model, gputop.sources\n"
        "import gputop.sources.nvml_fields, gputop.sources.probe_fields, gputop.sources.host\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_every_kind_is_defined_once_in_the_catalogue():
    """A sample kind's name has one home (gputop/catalogue.py); every other module imports it.
    The probe package, which may not import gputop, sends message types (gputop/probe/wire.py),
    not kinds: probe_client.py turns them into the catalogue's kinds."""
    root = pathlib.Path(catalogue.__file__).parent
    pattern = re.compile(r"^(KIND_[A-Z_0-9]+) *=", re.M)
    where: dict[str, list[str]] = {}
    for f in root.rglob("*.py"):
        for name in pattern.findall(f.read_text()):
            where.setdefault(name, []).append(str(f.relative_to(root)))
    twice = {k: v for k, v in where.items() if len(v) > 1}
    assert not twice, twice
    outside = {k: v for k, v in where.items() if v != ["catalogue.py"]}
    assert not outside, outside
    assert all(isinstance(getattr(catalogue, k), str) for k in where)
