"""Whether a Jupyter kernel runs this code: the one question every widget display asks first."""

from __future__ import annotations

__all__ = ["in_kernel"]


def in_kernel() -> bool:
    """A Jupyter kernel runs this code (a front end can draw widgets)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
