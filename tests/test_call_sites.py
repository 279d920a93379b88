"""The line that calls torch.cuda.empty_cache(), from real py-spy stacks recorded on an H100
(benchmarks/results/h100-empty-cache-1207): the user's own line where the loop calls it, and
the library frame with whose code asked for it where a framework calls it (the Trainer's
torch_empty_cache_steps). A recording whose job never calls it names nothing, and a damaged
stacks sample is skipped, not trusted."""

from __future__ import annotations

import pathlib

from gputop.derive.call_sites import call_site
from gputop.model import Sample
from gputop.session.recording_reader import RecordingReader
from gputop.session.store import SampleStore

RUN = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h100-empty-cache-1207" / "run2"


def _store(name: str) -> tuple[SampleStore, float]:
    samples = list(RecordingReader(str(RUN / "corpus-issue30" / f"{name}.gtrec")).samples())
    store = SampleStore()
    store.on_samples(samples)
    return store, samples[0].t


def test_the_users_line_and_a_frameworks_call_are_named():
    store, t0 = _store("nanogpt_empty_cache-as_is")
    site = call_site(store, t0, "empty_cache", "torch/cuda/memory.py")
    assert site["where"] == "<module> (nanogpt_empty_cache.py:47)" and site["via"] is None, site
    assert 0.05 < site["share"] < 0.9, site   # the call waits for the GPU's queue: often sampled
    store, t0 = _store("trainer_empty_cache_steps-as_is")
    site = call_site(store, t0, "empty_cache", "torch/cuda/memory.py")
    assert site["where"].startswith("clear_device_cache (memory.py:"), site        # accelerate's helper ...
    assert site["via"].startswith("Trainer.training_step (trainer.py:"), site      # ... called by the Trainer
    store, t0 = _store("nanogpt_empty_cache-fixed")
    assert call_site(store, t0, "empty_cache", "torch/cuda/memory.py") is None


def test_a_damaged_stacks_sample_is_skipped():
    store = SampleStore()
    good = {"main": True, "frames": [["<module>", "/job/train.py", 47], ["empty_cache", "/x/torch/cuda/memory.py", 9]],
            "threads": [{"tid": 7, "name": "MainThread", "stacks": [[3, [0, 1]]]}]}
    bad = [{"main": True, "frames": "x", "threads": []},
           {"main": True, "frames": [[1, 2, 3], None, ["empty_cache", "/torch/cuda/memory.py", "9"]],
            "threads": [{"tid": 7, "name": "MainThread", "stacks": [[2, [0, 1, 2, 99, -1, "a"]], [-4, [2]], "z"]}]},
           {"main": True, "frames": good["frames"], "threads": [{"name": "MainThread", "stacks": [[True, [0, 1]]]}]}]
    store.on_samples([Sample(1.0 + i, "stacks", "7", d) for i, d in enumerate([*bad, good])])
    site = call_site(store, 0.0, "empty_cache", "torch/cuda/memory.py")
    assert site == {"where": "<module> (train.py:47)", "via": None, "share": 0.6}, site
