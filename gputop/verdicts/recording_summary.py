"""What a recording's summary frames hold, written by the recorder and merged by the report.

Each summary frame covers the chunks written since the previous one (`SUMMARY_S`, 5 minutes; 1 in files written before):
- ``stats``: the report's statistics of those chunks (derive/record_stats.StatsPartial);
- ``verdicts``: the verdict samples the whole-file replay publishes over that stretch, computed
  as the file is written by the same processors (session/summary_chain.IncrementalReplay);
- ``sections``: the report sections' mergeable partials of those chunks (Python stacks, probe,
  ranks, efficiency, stall: derive/report_partials.py);
- ``final`` (the last frame, written on a clean stop only): where the replay started and ended,
  the time budget at the end (derive/budget_processor.budget_section), and ``rules``, the
  fingerprint of the code that judged (``rules_fingerprint``).
The report merges these instead of reading every sample (gputop/report.py); a file without a
``final`` frame (gputop was killed), or judged by other rules than the reader's (another gputop
version), has its verdicts replayed from the samples instead, so that a better rule table
improves old recordings' reports as it does their replays.
"""

from __future__ import annotations

import functools
import hashlib

from gputop.derive.budget_processor import BudgetProcessor, budget_section
from gputop.derive import report_partials
from gputop.derive.record_stats import StatsPartial
from gputop.model import Sample
from gputop.session.recording_format import Series
from gputop.session.sanitize import BadValues, clean_chunk
from gputop.session.summary_chain import IncrementalReplay
from gputop.verdicts.engine import KIND_VERDICT, KIND_VERDICT_CHANGE, KIND_VERDICT_PRIMARY
from gputop.verdicts.summary import summary_rows

SUMMARY_VERDICT_KINDS = (KIND_VERDICT, KIND_VERDICT_PRIMARY, KIND_VERDICT_CHANGE)   # what verdicts/summary.py reads


# The code a summary frame's verdicts and time budget come from: the derivations and rules, and
# what the recorder's chain feeds them (the value checks, the chain, the kinds).
RULES_CODE = ("derive/*.py", "verdicts/*.py", "session/summary_chain.py", "session/sanitize.py", "catalogue.py")


@functools.lru_cache(maxsize=1)
def rules_fingerprint() -> str:
    """A digest of gputop's version and the source of ``RULES_CODE``: a summary frame's verdicts
    stand for a replay only when the recorder ran this same code. Any edit changes it, a comment
    too; that costs the report a replay of the verdicts (~20 s CPU for an hour), never a stale
    verdict. Made once a process, at its first use: the recorder's at the start of a recording
    (RecordingSummarizer), so that code upgraded on disk while it runs does not stamp the old
    code's verdicts as the new. Where the source cannot be read (no .py files shipped, an I/O
    error), a value no other process has: the frames' verdicts are then never trusted. ~2 ms."""
    import fnmatch
    import importlib.resources
    import os

    from gputop import __version__

    h = hashlib.sha256(f"gputop {__version__}\0".encode())
    n = 0
    try:
        root = importlib.resources.files("gputop")
        for pattern in RULES_CODE:
            folder, _, name = pattern.rpartition("/")
            where = root.joinpath(folder) if folder else root
            for f in sorted((f for f in where.iterdir() if fnmatch.fnmatch(f.name, name)), key=lambda f: f.name):
                h.update(f"{folder}/{f.name}\0".encode())
                h.update(f.read_bytes())
                n += 1
    except Exception:   # (a loader without files: never a reason to fail a report)
        n = 0
    if n == 0:
        return f"unknown-{os.getpid()}-{os.urandom(6).hex()}"
    return h.hexdigest()[:16]


class RecordingSummarizer:
    """The recorder's Summarizer (session/recorder.py). ``processors``: fresh ones, the same
    the report replays with (gputop.verdicts.default_processors)."""

    def __init__(self, processors: list | None = None):
        if processors is None:
            from gputop.verdicts import default_processors

            processors = default_processors()
        self.processors = processors
        self.rules = rules_fingerprint()   # the code judging now, at the recording's start
        self.stats = StatsPartial()
        self.verdicts: list[Sample] = []
        self.section_samples: list[Sample] = []   # of report_partials.SUMMARY_KINDS, as written
        self.chain = IncrementalReplay(processors, self._output)

    def _output(self, samples: list[Sample]) -> None:
        self.verdicts.extend(s for s in samples if s.kind in SUMMARY_VERDICT_KINDS)

    def add(self, series: list[Series], t0: float, t1: float) -> None:
        bad = BadValues()
        for_stats, for_replay = clean_chunk(series, bad)   # checked once for both
        for s in for_stats:
            self.stats.add(*s)
            if s[0] in report_partials.SUMMARY_KINDS:
                self.section_samples.extend(report_partials.held_samples(*s))
        if bad:
            self.stats.add_bad(bad.counts, bad.reasons)
        self.chain.add_chunk(for_replay, t0, t1, clean=True)

    def take(self) -> dict:
        out = {"stats": self.stats.to_json(),
               "verdicts": [[s.t, s.kind, s.key, s.data] for s in summary_rows(self.verdicts)],
               "sections": report_partials.summarize(self.section_samples)}
        self.stats = StatsPartial()
        self.verdicts = []
        self.section_samples = []
        return out

    def finish(self) -> dict:
        self.chain.finish()
        chain = self.chain
        final: dict = {"t_start": chain.t_start, "t_end": chain.t_end, "rules": self.rules}
        budget = next((p for p in self.processors if isinstance(p, BudgetProcessor)), None)
        if budget is not None and chain.position is not None:
            final.update(budget_section(budget, chain.t_end))
        return {**self.take(), "final": final}


def verdict_samples(rows) -> list[Sample]:
    """A summary frame's ``verdicts`` as samples; ValueError if it is not what a recorder writes."""
    if not isinstance(rows, list):
        raise ValueError("verdicts")
    out = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], (int, float))
                and not isinstance(row[0], bool) and row[1] in SUMMARY_VERDICT_KINDS
                and isinstance(row[2], str) and isinstance(row[3], dict)):
            raise ValueError("verdict sample")
        out.append(Sample(float(row[0]), row[1], row[2], row[3]))
    return out
