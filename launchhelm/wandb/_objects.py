"""W&B's data types, settings and the features LaunchHelm refuses, without W&B's package.

Media and chart objects (``Image``, ``Table``, ``Histogram``...) only
remember what they were given: a script builds them and logs them as it
would with W&B, and :meth:`launchhelm.wandb.Run.log` skips them with one
warning per type (LaunchHelm stores numbers). Features with no LaunchHelm
meaning raise :class:`~launchhelm.UnsupportedFeatureError` naming what to
use instead.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from typing import NoReturn

from launchhelm._exceptions import LaunchHelmError, UnsupportedFeatureError

__all__ = [
    "REFUSED",
    "Audio",
    "Graph",
    "Histogram",
    "Html",
    "Image",
    "Media",
    "Molecule",
    "Object3D",
    "Plotly",
    "Settings",
    "Table",
    "Video",
    "WandbUsageError",
    "refuse",
]


class WandbUsageError(LaunchHelmError, RuntimeError):
    """The W&B API was called out of order (``wandb.log`` before ``wandb.init``), as W&B's own ``wandb.Error``."""


class Media:
    """Base of the media and chart objects: keeps its arguments, is skipped by ``log()``.

    ``isinstance(x, launchhelm.wandb.Media)`` tells a value that
    :meth:`launchhelm.wandb.Run.log` will skip.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.{type(self).__name__} (not stored: LaunchHelm stores numbers)>"


class Image(Media):
    """``wandb.Image(data_or_path, mode=None, caption=None, ...)``: accepted, skipped when logged."""


class Video(Media):
    """``wandb.Video(data_or_path, caption=None, fps=None, format=None)``: accepted, skipped when logged."""


class Audio(Media):
    """``wandb.Audio(data_or_path, sample_rate=None, caption=None)``: accepted, skipped when logged."""


class Html(Media):
    """``wandb.Html(data, inject=True)``: accepted, skipped when logged."""


class Object3D(Media):
    """``wandb.Object3D(data_or_path)``: accepted, skipped when logged."""


class Molecule(Media):
    """``wandb.Molecule(data_or_path)``: accepted, skipped when logged."""


class Plotly(Media):
    """``wandb.Plotly(figure)``: accepted, skipped when logged."""


class Graph(Media):
    """``wandb.Graph()``: accepted, skipped when logged."""


class Histogram(Media):
    """``wandb.Histogram(sequence=None, np_histogram=None, num_bins=64)``: accepted, skipped when logged."""


class Table(Media):
    """``wandb.Table(columns=None, data=None, dataframe=None)``: rows can be added; skipped when logged."""

    def __init__(
        self,
        columns: Sequence[object] | None = None,
        data: Sequence[Sequence[object]] | None = None,
        *args: object,
        **kwargs: object,
    ):
        super().__init__(columns, data, *args, **kwargs)
        self.columns = list(columns or [])
        self.data: list[list[object]] = [list(row) for row in (data or [])]

    def add_data(self, *values: object) -> None:
        """Append a row, as W&B's table does."""
        self.data.append(list(values))

    def add_column(self, name: str, data: Sequence[object], optional: bool = False) -> None:
        """Append a column, as W&B's table does."""
        self.columns.append(name)
        for row, value in zip(self.data, data, strict=False):
            row.append(value)


def _chart(name: str) -> Callable[..., Media]:
    def make(*args: object, **kwargs: object) -> Media:
        chart = Media(*args, **kwargs)
        chart.kind = f"plot.{name}"  # type: ignore[attr-defined]
        return chart

    make.__name__ = name
    make.__doc__ = f"``wandb.plot.{name}(...)``: accepted, skipped when logged."
    return make


#: ``wandb.plot``: every chart helper returns an object ``log()`` skips.
plot = types.ModuleType("launchhelm.wandb.plot", "W&B's chart helpers: accepted, skipped when logged.")
for _name in (
    "bar",
    "confusion_matrix",
    "histogram",
    "line",
    "line_series",
    "plot_table",
    "pr_curve",
    "roc_curve",
    "scatter",
):
    setattr(plot, _name, _chart(_name))
sys.modules.setdefault("launchhelm.wandb.plot", plot)


class Settings:
    """``wandb.Settings(...)``: accepted and kept (``settings.<name>``); none changes what LaunchHelm does."""

    def __init__(self, **settings: object) -> None:
        self.__dict__.update(settings)

    def __repr__(self) -> str:
        return f"launchhelm.wandb.Settings({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


#: W&B features LaunchHelm refuses, each with what to use instead.
REFUSED: dict[str, str] = {
    "Artifact": "save files with a LaunchHelm run's checkpoint(path) (or launchhelm.torch's save_checkpoint())",
    "log_artifact": "save files with run.launchhelm_run.checkpoint(path)",
    "use_artifact": "read a checkpoint with launchhelm.Api().run(run_id).checkpoints()",
    "log_model": "save the model with run.launchhelm_run.checkpoint(path) or launchhelm.torch's save_checkpoint()",
    "use_model": "read a checkpoint with launchhelm.Api().run(run_id).checkpoints()",
    "link_model": "checkpoints stay with their run: launchhelm.Api().run(run_id).checkpoints()",
    "Api": "read runs with launchhelm.Api(store=...): runs(project), run(id).history(), run(id).config",
    "sweep": "LaunchHelm has no sweep server: loop over configs yourself, one launchhelm.wandb.init() each",
    "agent": "LaunchHelm has no sweep server: loop over configs yourself, one launchhelm.wandb.init() each",
    "controller": "LaunchHelm has no sweep server: loop over configs yourself, one launchhelm.wandb.init() each",
    "fork_from": "rewind the same run with resume_from='<id>?_step=N', or start a new run",
    "restore": "read stored files with launchhelm.Api().run(run_id).checkpoints()",
}


def refuse(feature: str) -> NoReturn:
    """Raise :class:`~launchhelm.UnsupportedFeatureError` for ``wandb.<feature>``, naming what to use instead."""
    instead = REFUSED.get(feature, "see docs/compat.md for what launchhelm.wandb covers")
    raise UnsupportedFeatureError(
        f"wandb.{feature} is not supported by launchhelm.wandb; {instead}", feature=f"wandb.{feature}"
    )
