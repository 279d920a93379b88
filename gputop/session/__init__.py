"""Sessions: the bus and store, recording and replay, live wiring. Imports sources and model."""
