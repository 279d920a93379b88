"""``gputop agent``: every training job on the node, watched headless, served on one /metrics.

Layer 6 (with the UI, importing none of it): it wires sources, sessions, verdicts and the
exporter like cli.py does for one job. discover.py finds the jobs, job.py watches one, state.py
keeps their rolling recordings, collector.py serves them all, agent.py runs the loop, main.py is
the command. docs/fleet.md is the user's guide.
"""
