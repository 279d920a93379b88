"""gputop.verdicts."""
