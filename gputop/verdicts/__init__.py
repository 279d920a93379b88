"""Verdict rules: pure functions from a window of samples to findings with evidence.

``default_processors()`` is the chain every session runs (live, replay, report): the time
budget and the phases first, then the thread states from stacks (their look starts where the
phase the budget processor just said does: derive/threads.states_since), then the verdict
engine that reads them all.
"""

from __future__ import annotations


def default_processors() -> list:
    from gputop.derive.budget_processor import BudgetProcessor
    from gputop.derive.stall import StallDetector
    from gputop.derive.threads import ThreadStateProcessor
    from gputop.verdicts.engine import VerdictEngine

    return [BudgetProcessor(), ThreadStateProcessor(), StallDetector(), VerdictEngine()]
