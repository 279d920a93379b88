"""gputop: live bottleneck triage for GPU training jobs.

This file stays tiny: the in-process probe (gputop.probe) is imported inside the user's training
process, and importing it runs this module first.
"""

__version__ = "0.1.0"
