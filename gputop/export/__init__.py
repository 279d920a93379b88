"""Exports of a session's samples to other tools (``prometheus.py``: a ``/metrics`` endpoint).

Same layer as gputop/report.py: reads sessions, sources, derivations and verdicts; never the UI.
"""
