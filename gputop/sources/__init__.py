"""Sources: one module per signal. Each runs its own thread(s) and publishes samples.

Importing this package must not need textual (a test enforces it).
"""
