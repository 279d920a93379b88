"""The frame classification rules over real captured py-spy output (tests/data/pyspy/).

Every capture has a meta file saying, from what the scene does, which category each named
thread is in; the rules must agree. Captures made on the GPU machine (cuda*.json, from
``tests/data/pyspy/capture.py --gpu``) are picked up the same way when they are committed.
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter

import pytest

from gputop.derive import frame_rules as fr
from gputop.derive.threads import _classify_sample, hot_frames
from gputop.model import Sample
from gputop.sources.stacks import KIND_STACKS, fold_speedscope

DATA = pathlib.Path(__file__).resolve().parent / "data" / "pyspy"
CAPTURES = sorted(p.name.removesuffix(".speedscope.json") for p in DATA.glob("*.speedscope.json"))


class RecordedLines:
    """Source line text as it was on the machine that made the capture."""

    def __init__(self, lines: dict):
        self.lines = lines

    def line(self, pid, path, lineno):
        return self.lines.get(f"{path}:{lineno}")


def load(scene: str) -> tuple[dict, list[Sample]]:
    doc = json.loads((DATA / f"{scene}.speedscope.json").read_text())
    meta = json.loads((DATA / f"{scene}.meta.json").read_text())
    folded = fold_speedscope(doc, meta["pid"], RecordedLines(meta["lines"]))
    samples = [Sample(1.0, KIND_STACKS, str(pid), {**d, "t0": 0.0, "dur_s": 1.0, "main": pid == meta["pid"]})
               for pid, d in folded.items()]
    return meta, samples


def test_the_cpu_captures_are_here():
    assert {"waits", "dataloader", "item", "gloo"} <= set(CAPTURES)


@pytest.mark.parametrize("scene", CAPTURES)
def test_each_thread_lands_in_its_known_category(scene):
    meta, samples = load(scene)
    by_tid = {}
    for s in samples:
        for tid, (name, n, cats, leaf, worker) in _classify_sample(s).items():
            by_tid[tid] = (n, cats)
    for name, expected in meta["expect"].items():
        tid = meta["threads"][name]
        n, cats = by_tid[tid]
        top, count = cats.most_common(1)[0]
        assert top == expected, f"{scene}/{name}: {dict(cats)}"
        assert count / n >= 0.75, f"{scene}/{name}: only {count}/{n} in {expected}: {dict(cats)}"


def test_dataloader_workers_are_recognised():
    meta, samples = load("dataloader")
    workers = {s.key for s in samples for (_n, _c, _cats, _leaf, w) in _classify_sample(s).values() if w}
    assert len(workers) == 2 and str(meta["pid"]) not in workers


def test_line_rule_needs_the_line_text():
    """Without the source text the .item() capture is plain Python: the rule is about the line."""
    doc = json.loads((DATA / "item.speedscope.json").read_text())
    meta = json.loads((DATA / "item.meta.json").read_text())
    data = fold_speedscope(doc, meta["pid"], None)[meta["pid"]]
    cats = Counter()
    for _name, _n, c, _leaf, _worker in _classify_sample(Sample(0, KIND_STACKS, "1", data)).values():
        cats.update(c)
    assert set(cats) == {fr.PYTHON}


def test_priority_data_beats_idle_inside_the_dataloader():
    """A sleep inside a Dataset read by a single-process DataLoader is time in next(): data."""
    frames = [["<module>", "/w/train.py", 10],
              ["_BaseDataLoaderIter.__next__", "/venv/site-packages/torch/utils/data/dataloader.py", 733],
              ["MyData.__getitem__", "/w/train.py", 5]]
    assert fr.classify(frames, [0, 1, 2], "time.sleep(0.01)") == (fr.DATA, "inside next(DataLoader iterator)")
    assert fr.classify(frames, [0, 2], "time.sleep(0.01)")[0] == fr.IDLE
    assert fr.classify(frames, [0, 2], "x = y + 1")[0] == fr.PYTHON
    assert fr.classify(frames, [], None)[0] == fr.UNKNOWN
    # Pre-3.11 Pythons give bare function names: the rules accept both.
    assert fr.classify([["__next__", "/x/torch/utils/data/dataloader.py", 1]], [0], None)[0] == fr.DATA
    # A file merely named like torch's is not torch's.
    assert fr.classify([["__next__", "/x/mydataloader.py", 1]], [0], None)[0] == fr.PYTHON


def test_the_table_is_well_formed():
    for rule in fr.FRAME_RULES:
        assert rule.category in fr.PRIORITY and rule.where in ("any", "leaf") and rule.why
        assert not rule.file.startswith("/")
    for rule in fr.LINE_RULES:
        assert rule.category in fr.PRIORITY and rule.why


def test_hot_frames_self_and_total():
    meta, samples = load("waits")
    main = meta["threads"]["main"]
    hf = hot_frames(samples, pid=meta["pid"], tid=main, top=5)
    assert hf["samples"] > 10
    top = hf["rows"][0]
    assert top["func"] == "waits" and top["file"].endswith("stacks_scenes.py")
    assert top["self"] <= top["total"] == hf["samples"]
    allt = hot_frames(samples, top=50, by="total")
    assert allt["samples"] > hf["samples"]
    assert [r["total"] for r in allt["rows"]] == sorted((r["total"] for r in allt["rows"]), reverse=True)
    assert sum(r["self"] for r in allt["rows"]) <= allt["samples"]
    bootstrap = next(r for r in allt["rows"] if r["func"].endswith("_bootstrap"))
    assert bootstrap["self"] == 0 and bootstrap["total"] > 0 and bootstrap["line"] is None
    assert hot_frames(samples, pid=1)["samples"] == 0
    with pytest.raises(ValueError):
        hot_frames(samples, by="nope")
