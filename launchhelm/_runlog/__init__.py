"""The run log: each run's event log and what is derived from it.

Events (the truth), sessions and their heartbeats, liveness, control and
tunables, the checkpoint registry, run summaries, the runs-table index and
garbage collection. Everything here is private; the public surface is
:mod:`launchhelm` (``init``, ``Run``, ``Api``).
"""
