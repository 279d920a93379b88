"""gputop.ui."""
