"""One benchmark harness: every benchmark declared once (benchmarks/__init__.py), run by
``python -m benchmarks``, and every raw result docs/benchmarks.md cites present. Fast: no
benchmark is run, except one's --help and one GPU benchmark's refusal on a box without a GPU."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
DOC = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(ROOT))
import benchmarks  # noqa: E402


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_every_benchmark_script_is_registered_and_the_registry_names_only_files_that_exist():
    regs = benchmarks.BENCHMARKS
    assert len({b.name for b in regs}) == len(regs), "a name declared twice"
    assert len({b.script for b in regs}) == len(regs), "a script declared twice"
    for b in regs:
        assert b.path.is_file(), b
        assert b.path.suffix == ".py" and b.path.parent.resolve().is_relative_to(BENCH), b
        assert b.where in benchmarks.WHERE, b
        assert b.goal.strip() and b.measures.strip(), b
    for h in benchmarks.HELPERS:
        assert (BENCH / h).is_file(), h
    scripts = {p.name for p in BENCH.glob("*.py")} - {"__init__.py", "__main__.py"} - set(benchmarks.HELPERS)
    assert scripts == {b.script for b in regs if "/" not in b.script}


def test_list_shows_each_name_with_where_and_goal():
    r = harness("--list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for b in benchmarks.BENCHMARKS:
        row = [ln for ln in lines if ln.split()[:1] == [b.name]]
        assert len(row) == 1, (b.name, row)
        assert b.where in row[0].split() and b.goal in row[0], row[0]


def test_an_unknown_name_is_one_line_on_stderr_and_exit_2():
    r = harness("no_such_benchmark")
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "no_such_benchmark" in r.stderr


def test_a_gpu_benchmark_on_a_machine_without_a_gpu_says_so_in_one_line_and_exits_2():
    """subprocess_cost needs the GPU machine (it trains GPT-2 small there): here, torch's CPU build
    sees no CUDA device, and the benchmark says where to run it, no traceback."""
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run (h200.sh runs it there)")
    r = subprocess.run([sys.executable, "-m", "benchmarks", "subprocess_cost"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert r.stderr.strip().splitlines() == ["subprocess_cost: no GPU here; run it on the GPU machine"], r.stderr


def test_a_benchmark_runs_as_its_script_with_the_arguments_given():
    r = harness("scenario_proof", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: scenario_proof.py"), r.stdout  # sys.argv[0] is the script


def test_h200_phases_run_registered_benchmarks_through_the_harness():
    sh = "\n".join(ln for ln in (BENCH / "h200.sh").read_text().splitlines() if not ln.lstrip().startswith("#"))
    names = re.findall(r"\$PY -m benchmarks (\w+)", sh)
    assert names and set(names) <= set(benchmarks.BY_NAME), set(names) - set(benchmarks.BY_NAME)
    assert not re.search(r"\$PY benchmarks/\w+\.py", sh)


def _expand_braces(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",") for p in _expand_braces(path[:m.start()] + alt + path[m.end():])]


def test_every_raw_result_the_doc_cites_exists():
    doc = DOC.read_text()
    cited = {m.rstrip(".,") for m in re.findall(r"benchmarks/results/[\w./*{},-]*", doc)}
    assert cited
    for c in sorted(cited):
        for path in _expand_braces(c):
            if "*" in path:
                assert list(ROOT.glob(path)), f"docs/benchmarks.md cites {path}: nothing matches"
            else:
                assert (ROOT / path).exists(), f"docs/benchmarks.md cites {path}, which does not exist"
    # a run's archive named without its folder ("`h200-run15.tar.gz`")
    for name in set(re.findall(r"(?<![/\w])(h200-run\d+\.tar\.gz)", doc)):
        assert (RESULTS / name).is_file(), name
    # "`h200-run8/mfu/` in `benchmarks/results/h200-run8.tar.gz`": a folder inside the archive
    inside = re.findall(r"`?([\w.-]+(?:/[\w.-]+)*/)`? in `?benchmarks/results/([\w.-]+\.tar\.gz)", doc)
    assert inside
    for folder, archive in inside:
        with tarfile.open(RESULTS / archive) as t:
            assert any(n.startswith(folder) for n in t.getnames()), f"{folder} not in {archive}"


def test_each_run_archive_holds_its_run():
    archives = sorted(RESULTS.glob("*.tar.gz"))
    assert archives
    for a in archives:
        run = a.name[:-len(".tar.gz")]
        with tarfile.open(a) as t:
            names = t.getnames()
        assert names and all(n.startswith(run + "/") for n in names), a
