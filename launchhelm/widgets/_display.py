"""How a :class:`launchhelm.Run` or :class:`launchhelm.RunHandle` displays in a notebook.

``Run._repr_mimebundle_`` and ``RunHandle._repr_mimebundle_`` reach
:func:`run_mimebundle` through the core's display hook (``launchhelm._display``,
which imports this module only then, so ``import launchhelm`` stays
free of IPython and anywidget). In a Jupyter kernel the bundle is the run's
panel; elsewhere (a terminal IPython, the widgets extra not installed) it is
the plain-text repr alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchhelm._types import RunLike

from launchhelm.widgets._kernel import in_kernel

__all__ = ["in_kernel", "run_display", "run_mimebundle"]

#: The MIME type of a Jupyter widget view.
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def run_mimebundle(run: RunLike) -> dict[str, object]:
    """The run's panel as a MIME bundle, its plain-text repr included."""
    text = repr(run)
    if not in_kernel():
        return {"text/plain": text}
    try:
        from launchhelm.widgets._panel import RunPanel
    except ImportError:  # the widgets extra is not installed
        return {"text/plain": text}
    try:
        panel = RunPanel(run)
    except Exception as exc:  # a repr must not raise: say why there is no panel
        return {"text/plain": f"{text}\n(no run panel: {type(exc).__name__}: {exc})"}
    bundle = dict(panel._repr_mimebundle_() or {})
    bundle["text/plain"] = text
    return bundle


def run_display(run: RunLike) -> object:
    """What marimo shows for a run: the run panel, its tabs live."""
    from launchhelm.widgets._panel import RunPanel

    return RunPanel(run)._display_()
