"""Verdict rules: pure functions from a window of samples to findings with evidence.

``default_processors()`` is the chain every session runs (live, replay, report): thread
states from stacks first, then the verdict engine that reads them.
"""

from __future__ import annotations


def default_processors() -> list:
    from gputop.derive.threads import ThreadStateProcessor
    from gputop.verdicts.engine import VerdictEngine

    return [ThreadStateProcessor(), VerdictEngine()]
