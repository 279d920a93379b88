"""``gputop diff A B [--json] [--fail-above PCT]``: two recordings compared — steps/s with an
interval, time budgets, verdicts, settings, GPU counters, energy per step — in one conclusion.

``load`` (load.py) reads a side, ``compare`` (compare.py) builds the JSON-able result,
``render_text`` (render.py) prints it, ``run`` (command.py) is the subcommand with its exit codes.
docs/report.md, "gputop diff", documents all of it.
"""
