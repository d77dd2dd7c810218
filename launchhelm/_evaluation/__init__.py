"""The evaluation queue: project rules, exactly-once queueing, leased workers and their CLI.

- ``_queue``: evaluations as stored objects, the project rule, queueing and retry.
- ``_worker``: ``@launchhelm.evaluate`` and the worker that serves it with fenced leases.
- ``_cli``: ``launchhelm evaluate`` / ``launchhelm policy``.

Public names are re-exported from :mod:`launchhelm`.
"""
