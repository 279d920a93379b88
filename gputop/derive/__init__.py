"""gputop.derive."""
