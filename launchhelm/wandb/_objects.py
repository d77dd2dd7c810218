"""W&B's data types, settings and the features LaunchHelm refuses, without W&B's package.

``Image``, ``Table`` and ``Histogram`` are LaunchHelm's own
(:class:`launchhelm.Image`...) taking W&B's arguments: logged, they are
stored as the run's media. The other media and chart objects (``Video``,
``Audio``, ``wandb.plot.*``...) only remember what they were given, and
:meth:`launchhelm.wandb.Run.log` skips them with one warning per type.
Features with no LaunchHelm meaning raise
:class:`~launchhelm.UnsupportedFeatureError` naming what to use instead.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from launchhelm import media as lh_media
from launchhelm._exceptions import LaunchHelmError, UnsupportedFeatureError
from launchhelm.media._types import PreparedHistogram, PreparedImage, PreparedTable, grid

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
    """Base of W&B's media and chart objects: keeps its arguments.

    ``log()`` stores the ``Image``, ``Table`` and ``Histogram`` among them
    (they are also :class:`launchhelm.Media`) and skips the others.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.{type(self).__name__} (not stored: LaunchHelm stores numbers)>"


class Image(lh_media.Image, Media):
    """``wandb.Image(data_or_path, mode=None, caption=None, ...)``: stored as a :class:`launchhelm.Image`.

    Takes what W&B takes: a numpy array (``HxW``, ``HxWx1/3/4``; floats as
    W&B scales them: shifted to start at 0 when negative, times 255 when at
    most 1), a torch tensor (``CxHxW``, a batch as a grid), a PIL image or a
    file path. ``boxes``, ``masks``, ``classes`` and ``grouping`` are not kept.
    """

    def __init__(
        self,
        data_or_path: object,
        mode: str | None = None,
        caption: str | None = None,
        grouping: int | None = None,
        classes: object = None,
        boxes: object = None,
        masks: object = None,
        file_type: str | None = None,
        normalize: bool = True,
        **kwargs: object,
    ) -> None:
        lh_media.Image.__init__(self, data_or_path, caption=caption)
        Media.__init__(self, data_or_path, mode=mode, caption=caption, **kwargs)
        self.normalize = normalize

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.Image{f' {self.caption!r}' if self.caption else ''}>"

    def _prepare(self, key: str) -> PreparedImage:
        data = self.data
        module = type(data).__module__ or ""
        if module.startswith("torch") and hasattr(data, "detach"):
            tensor: Any = data
            data = tensor.detach().cpu().numpy()
            if data.ndim == 4:
                data = grid(data.transpose(0, 2, 3, 1) if data.shape[1] in (1, 3, 4) else data)
            elif data.ndim == 3 and data.shape[0] in (1, 3, 4) and data.shape[2] not in (1, 3, 4):
                data = data.transpose(1, 2, 0)
        data = _wandb_uint8(data) if self.normalize else data
        return lh_media.Image(data, caption=self.caption)._prepare(key)


def _wandb_uint8(data: object) -> object:
    """W&B's ``Image.to_uint8`` for numeric arrays other than uint8; anything else as it is."""
    import numpy as np

    if not isinstance(data, np.ndarray) or data.dtype == np.uint8 or data.dtype == bool or not data.size:
        return data
    if not (np.issubdtype(data.dtype, np.floating) or np.issubdtype(data.dtype, np.integer)):
        return data
    if np.issubdtype(data.dtype, np.floating) and np.isnan(data).any():
        return data  # refused by log(), naming the key
    array: Any = data
    if array.min() < 0:
        array = (array - array.min()) / np.ptp(array)
    if array.max() <= 1.0:
        array = (array * 255).astype(np.int32)
    return np.asarray(array).clip(0, 255).astype(np.uint8)


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


class Histogram(lh_media.Histogram, Media):
    """``wandb.Histogram(sequence=None, np_histogram=None, num_bins=64)``: stored as a :class:`launchhelm.Histogram`.

    ``np_histogram`` is ``(counts, edges)`` as ``numpy.histogram`` returns them;
    ``num_bins`` at most 512, as W&B's.
    """

    def __init__(
        self, sequence: object = None, np_histogram: Sequence[object] | None = None, num_bins: int = 64
    ) -> None:
        counts, edges = (None, None) if np_histogram is None else tuple(np_histogram)
        lh_media.Histogram.__init__(self, sequence, bins=num_bins, counts=counts, edges=edges)
        Media.__init__(self, sequence, np_histogram=np_histogram, num_bins=num_bins)

    def __repr__(self) -> str:
        return "<launchhelm.wandb.Histogram>"

    def _prepare(self, key: str) -> PreparedHistogram:
        return lh_media.Histogram._prepare(self, key)


class Table(lh_media.Table, Media):
    """``wandb.Table(columns=None, data=None, rows=None, dataframe=None)``: stored as a :class:`launchhelm.Table`.

    Rows can be added (``add_data``, ``add_column``) until it is logged.
    Cells are numbers, strings, booleans, None or ``wandb.Image``.
    """

    def __init__(
        self,
        columns: Sequence[object] | None = None,
        data: Sequence[Sequence[object]] | None = None,
        rows: Sequence[Sequence[object]] | None = None,
        dataframe: object = None,
        *args: object,
        **kwargs: object,
    ):
        Media.__init__(self, columns, data, *args, **kwargs)
        lh_media.Table.__init__(self, dataframe)
        rows_given = data if data is not None else rows
        if dataframe is None and columns is None and rows_given:
            columns = ["Input", "Output", "Expected"]  # W&B's default
        self.columns: list[object] = list(columns or [])
        self.data: list[list[object]] = [list(row) for row in (rows_given or [])]

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.Table {len(self.data)} rows>"

    def add_data(self, *values: object) -> None:
        """Append a row, as W&B's table does."""
        self.data.append(list(values))

    def add_column(self, name: str, data: Sequence[object], optional: bool = False) -> None:
        """Append a column, as W&B's table does."""
        self.columns.append(name)
        for row, value in zip(self.data, data, strict=False):
            row.append(value)

    def _prepare(self, key: str) -> PreparedTable:
        if self.dataframe is not None:
            return lh_media.Table(self.dataframe)._prepare(key)
        return lh_media.Table(columns=self.columns, rows=self.data)._prepare(key)


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
