"""gputop.demo."""
