"""Downsampling that keeps what a person looks for in a curve: its extremes.

A chart never gets more than a few thousand points per series: the kernel
picks, for each of ``(budget - 2) // 2`` equal runs of consecutive points,
the lowest and the highest one (MinMax), plus the first and last point.
Spikes and dips survive however long the series is; a plain stride would
drop them.

Plain numpy, not a compiled dependency: the downsampling is a small part of
a chart's first open (``benchmarks/bench_chart.py`` prints both); LTTB would
also drop the extremes this keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launchhelm._exceptions import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["minmax_indices"]

#: The fewest points a budget may allow: first, last, one bucket's min and max.
MIN_BUDGET = 4


def minmax_indices(values: npt.ArrayLike, budget: int) -> np.ndarray:
    """Indices (ascending) of at most ``budget`` points of ``values`` that keep its extremes.

    Parameters
    ----------
    values:
        The series' y values in x order (finite numbers).
    budget:
        The most points to keep (at least 4).

    Returns
    -------
    numpy.ndarray
        Sorted, unique int64 indices into ``values``; all of them when the
        series is within budget. The global minimum and maximum are always
        among them.

    Examples
    --------
    >>> import numpy as np
    >>> y = np.zeros(10_000); y[1234] = 5.0
    >>> idx = minmax_indices(y, 100)
    >>> len(idx) <= 100 and 1234 in idx
    True
    """
    import numpy as np

    if budget < MIN_BUDGET:
        raise InvalidArgumentError(f"budget={budget}: keep at least {MIN_BUDGET} points (first, last, a min and a max)")
    y = np.asarray(values, dtype=float)
    n = len(y)
    if n <= budget:
        return np.arange(n, dtype=np.int64)
    buckets = (budget - 2) // 2
    # interior points 1 .. n-2 split into `buckets` runs of near-equal length
    edges = np.linspace(1, n - 1, buckets + 1).astype(np.int64)
    keep = [np.array([0, n - 1], dtype=np.int64)]
    starts, ends = edges[:-1], edges[1:]
    nonempty = ends > starts
    starts, ends = starts[nonempty], ends[nonempty]
    # argmin / argmax per run via reduceat on the values, then locate them
    lows = np.minimum.reduceat(y[1 : n - 1], starts - 1)
    highs = np.maximum.reduceat(y[1 : n - 1], starts - 1)
    run_of = np.repeat(np.arange(len(starts)), ends - starts)
    interior = y[1 : n - 1]
    is_low = interior == lows[run_of]
    is_high = interior == highs[run_of]
    # the first matching index of each run (ties: keep one)
    # (sorted masks, not np.unique: that imports numpy.ma, slow on a chart's first open)
    for mask in (is_low, is_high):
        hits = np.flatnonzero(mask)
        runs = run_of[hits]
        first_per_run = hits[np.concatenate(([True], runs[1:] != runs[:-1]))] if len(hits) else hits
        keep.append(first_per_run + 1)
    kept = np.sort(np.concatenate(keep))
    return kept[np.concatenate(([True], kept[1:] != kept[:-1]))]
