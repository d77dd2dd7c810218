"""Metric points: validation, immutable chunks, compacted segments and reading them back.

Private modules, one job each:

- ``_points``: validating keys and values on the hot path, encoding a session's
  buffered points as an immutable Arrow IPC chunk, pivoting points into the
  wide history frame.
"""
