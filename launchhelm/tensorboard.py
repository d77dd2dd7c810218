"""``from launchhelm.tensorboard import SummaryWriter``: a script written for TensorBoard logs to LaunchHelm.

:class:`SummaryWriter` takes ``torch.utils.tensorboard.SummaryWriter``'s
arguments and methods. Scalars are stored exactly (as float64: TensorBoard
keeps float32); ``add_hparams`` writes a run of its own, as torch's writer
writes a sub-folder; ``add_text`` is kept in the run's TensorBoard record;
``add_image``, ``add_images`` and ``add_figure`` store the pixels torch's
writer would put in its event file (same conversions: ``dataformats``, float
scaled by 255, grids), ``add_histogram`` the buckets it would write;
graphs, embeddings, audio, video, meshes, PR curves and custom-scalar
layouts are accepted and skipped, with one warning per method. Neither
torch nor TensorBoard is imported. See docs/compat.md.

Which run a writer writes:

- project: ``project=``, else ``$LAUNCHHELM_PROJECT``, else the name of
  ``log_dir``'s parent folder (``runs`` for ``runs/exp1``), else
  ``"tensorboard"``; characters LaunchHelm refuses become ``-``;
- run name: ``log_dir``'s last component (torch's default
  ``runs/<Mon DD_HH-MM-SS>_<host><comment>`` when none is given);
- a new run per writer, unless ``purge_step=`` is given: then the newest run
  of that name in the project that is not closed is resumed and rewound, so
  the points from ``purge_step`` on are the new ones (TensorBoard purges
  them; LaunchHelm keeps the old ones as the abandoned attempt).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

from launchhelm._compat import RECORD_INTERVAL, CompatSession, SessionOptions, compat_key, read_compat
from launchhelm._exceptions import InvalidMediaError, InvalidTypeError, RunFinishedError
from launchhelm._integration import plain_config, record_restore
from launchhelm._runlog._events import validate_project
from launchhelm._start import start_run
from launchhelm.media import Histogram, Image
from launchhelm.storage import Store, open_store

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["COMPAT_FORMAT", "SummaryWriter", "stored_texts"]

_log = logging.getLogger("launchhelm")

COMPAT_FORMAT = "launchhelm.tensorboard/1"
#: Text kept per run by ``add_text`` (characters); past it texts are dropped with one warning.
MAX_TEXT_CHARS = 4 * 1024 * 1024


class StoredText(TypedDict):
    """One ``add_text`` call, as the run's TensorBoard record keeps it."""

    tag: str
    step: int
    time: float
    text: str


class TensorBoardRecord(TypedDict, total=False):
    """``runs/<id>/compat/tensorboard.json``; read back, any key may be missing (see ``read_compat``)."""

    format: str
    run: str
    log_dir: str
    texts: list[StoredText]


def _read_record(store: Store, run_id: str) -> TensorBoardRecord:
    return cast("TensorBoardRecord", read_compat(store, run_id, "tensorboard", COMPAT_FORMAT))


def _project_of(project: str | None, log_dir: str) -> str:
    import re

    if project is None:
        project = os.environ.get("LAUNCHHELM_PROJECT")
    if project is None:
        parent = os.path.basename(os.path.dirname(os.path.normpath(log_dir)))
        project = parent or "tensorboard"
    if not isinstance(project, str):
        raise InvalidTypeError(f"project={project!r}: pass a string")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", project.strip()).strip("-._")[:128]
    return validate_project(name or "tensorboard")


class SummaryWriter:
    """Logs what torch's ``SummaryWriter`` would write to a LaunchHelm run.

    Parameters
    ----------
    log_dir, comment, purge_step, max_queue, flush_secs, filename_suffix:
        As torch's (``max_queue``, ``flush_secs`` and ``filename_suffix``
        change nothing: LaunchHelm flushes in the background every few
        seconds). ``log_dir`` is created, as torch does, but nothing is
        written there; it names the run (see the module's docstring).
    project:
        The LaunchHelm project (see the module's docstring for the default).
    store, storage_options:
        LaunchHelm's store (default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``).
    **options:
        Further :func:`launchhelm.init` options (``system_metrics``,
        ``capture_console``...).

    Examples
    --------
    >>> from launchhelm.tensorboard import SummaryWriter
    >>> with SummaryWriter("runs/exp1", store="memory://tb-doc") as writer:
    ...     for step in range(3):
    ...         writer.add_scalar("loss", 1 / (step + 1), step)
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        *,
        project: str | None = None,
        store: str | os.PathLike[str] | Store | None = None,
        storage_options: Mapping[str, object] | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        if not log_dir:
            current_time = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", current_time + "_" + socket.gethostname() + comment)
        self.log_dir = os.fspath(log_dir)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self._project = _project_of(project, self.log_dir)
        self._name = os.path.basename(os.path.normpath(self.log_dir)) or "tensorboard"
        self._store = open_store(store, storage_options)
        self._options = options
        self._lock = threading.Lock()
        self._texts: list[StoredText] = []
        self._text_chars = 0
        self._dirty = False
        self._last_put = -math.inf
        self._warned: set[str] = set()
        self._closed = False
        if "://" not in self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        self._run = self._open(purge_step)

    def _open(self, purge_step: int | None) -> CompatSession:
        resume = self._resumable() if purge_step is not None else None
        run = start_run(
            CompatSession,
            self._project,
            name=None if resume else self._name,
            store=self._store,
            resume=resume,
            **self._options,
        )
        if resume is not None and purge_step is not None:
            previous = _read_record(self._store, run.id)
            self._texts = [t for t in previous.get("texts") or [] if int(t.get("step", 0)) < purge_step]
            self._text_chars = sum(len(str(t.get("text", ""))) for t in self._texts)
            self._dirty = len(self._texts) != len(previous.get("texts") or [])  # TensorBoard purges them too
            record_restore(run, max(purge_step - 1, 0), None, "SummaryWriter(purge_step)")
        run.after_flush = self._put_record
        return run

    def _resumable(self) -> str | None:
        """The newest run of this writer's name in its project that is not closed (purge_step resumes it)."""
        import launchhelm as lh

        api = lh.Api(self._store)
        if self._project not in api.projects():
            return None
        table = api.runs(self._project)
        if table.empty:
            return None
        candidates = table[(table["name"] == self._name) & (table["status"] != "closed")]
        if candidates.empty:
            return None
        return str(candidates.sort_values("created").iloc[-1]["id"])

    @property
    def run_id(self) -> str:
        """The LaunchHelm run this writer logs to (``launchhelm.Api().run(writer.run_id)``)."""
        return self._run.id

    @property
    def project(self) -> str:
        """The LaunchHelm project."""
        return self._project

    def get_logdir(self) -> str:
        """``log_dir``, as torch's writer returns it."""
        return self.log_dir

    # -- scalars -------------------------------------------------------------
    def _log(self, values: Mapping[str, object], global_step: int | None) -> None:
        if self._closed:
            raise RunFinishedError(
                f"this SummaryWriter was closed (run {self._run.id}); create a new SummaryWriter to log more",
                run_id=self._run.id,
            )
        try:
            step = 0 if global_step is None else int(global_step)  # torch's event step: 0 when None, int() else
        except (TypeError, ValueError):
            raise InvalidTypeError(f"global_step={global_step!r}: pass an integer step") from None
        run = self._run
        if step > run.global_step:
            run.global_step = step  # a step boundary: pause, stop and tunable changes apply here
        if values:
            run.log(values, step=step)

    def add_scalar(
        self,
        tag: str,
        scalar_value: object,
        global_step: int | None = None,
        walltime: float | None = None,
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        """Log ``scalar_value`` as metric ``tag`` at ``global_step`` (0 when None, as torch).

        ``walltime`` is not kept: LaunchHelm times each point when it is
        logged. ``new_style`` and ``double_precision`` change nothing (values
        are stored as float64).
        """
        self._log({tag: scalar_value}, global_step)

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: Mapping[str, object],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log each value as metric ``main_tag/tag`` (TensorBoard writes a sub-run per tag)."""
        if not isinstance(tag_scalar_dict, Mapping):
            raise InvalidTypeError(f"add_scalars() takes a dict of tag to value, not {type(tag_scalar_dict).__name__}")
        self._log({f"{main_tag}/{tag}": value for tag, value in tag_scalar_dict.items()}, global_step)

    def add_hparams(
        self,
        hparam_dict: Mapping[str, object],
        metric_dict: Mapping[str, object],
        hparam_domain_discrete: Mapping[str, list[object]] | None = None,
        run_name: str | None = None,
        global_step: int | None = None,
    ) -> None:
        """Write a run of its own, as torch writes a sub-folder: config ``hparam_dict``, metrics ``metric_dict``.

        The run is named ``<this run's name>/<run_name>`` (``run_name``
        defaults to the current time, as torch's), in this writer's project;
        the metrics are logged at ``global_step`` (0 when None) and the run
        is closed.
        """
        if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
            raise InvalidTypeError("hparam_dict and metric_dict should be dictionaries (as torch's add_hparams asks)")
        if not run_name:
            run_name = str(time.time())
        config = plain_config(hparam_dict)
        if hparam_domain_discrete:
            config = {**config, "hparam_domain_discrete": plain_config(dict(hparam_domain_discrete))}
        options: SessionOptions = {**self._options, "capture_console": False, "system_metrics": False}
        child = start_run(
            CompatSession,
            self._project,
            name=f"{self._name}/{run_name}",
            config=config,
            store=self._store,
            **options,
        )
        try:
            step = 0 if global_step is None else int(global_step)
            child.global_step = step
            if metric_dict:
                child.log(dict(metric_dict), step=step)
        finally:
            child.finish()

    # -- text ----------------------------------------------------------------
    def add_text(
        self, tag: str, text_string: str, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Keep ``text_string`` in the run's TensorBoard record (:func:`stored_texts` reads it back)."""
        if self._closed:
            self._log({}, global_step)  # raises, as for scalars
        text = str(text_string)
        with self._lock:
            if self._text_chars + len(text) > MAX_TEXT_CHARS:
                self._warn_once("add_text past 4 MiB")
                return
            self._texts.append(
                {
                    "tag": str(tag),
                    "step": 0 if global_step is None else int(global_step),
                    "time": time.time(),
                    "text": text,
                }
            )
            self._text_chars += len(text)
            self._dirty = True

    def _put_record(self, force: bool = False) -> None:
        """Put the TensorBoard record if it changed: from the session's flush thread at most every
        ``RECORD_INTERVAL`` seconds, and at ``flush()`` and ``close()`` (``force``)."""
        if not self._dirty:
            return
        now = time.monotonic()
        if not force and now - self._last_put < RECORD_INTERVAL:
            return
        with self._lock:
            self._dirty = False
            body: TensorBoardRecord = {
                "format": COMPAT_FORMAT,
                "run": self._run.id,
                "log_dir": self.log_dir,
                "texts": list(self._texts),
            }
        try:
            self._store.put(compat_key(self._run.id, "tensorboard"), json.dumps(body).encode())
            self._last_put = now
        except BaseException:
            self._dirty = True
            raise

    # -- accepted, not stored ------------------------------------------------
    def _warn_once(self, what: str) -> None:
        if what in self._warned:
            return
        self._warned.add(what)
        _log.warning(
            "launchhelm.tensorboard: SummaryWriter.%s is accepted but not stored (LaunchHelm stores scalars); "
            "further calls are skipped without a warning (docs/compat.md)",
            what,
        )

    def _skip(self, what: str) -> None:
        if self._closed:
            self._log({}, None)  # raises, as for scalars
        self._warn_once(what)

    def _media(self, tag: str, value: object, global_step: int | None) -> None:
        self._log({tag: value}, global_step)

    def add_histogram(
        self,
        tag: str,
        values: object,
        global_step: int | None = None,
        bins: object = "tensorflow",
        walltime: float | None = None,
        max_bins: int | None = None,
    ) -> None:
        """Log a histogram of ``values`` with the buckets torch's writer would write (its default
        exponential ``"tensorflow"`` bins, trimmed to where values are), as a :class:`launchhelm.Histogram`.

        ``walltime`` is not kept.
        """
        counts, edges = tensorboard_histogram(tag, values, bins, max_bins)
        self._media(tag, Histogram(counts=counts, edges=edges), global_step)

    def add_histogram_raw(self, tag: str, *args: object, **kwargs: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_histogram_raw")

    def add_image(
        self,
        tag: str,
        img_tensor: object,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "CHW",
    ) -> None:
        """Log an image as torch's writer converts it: laid out by ``dataformats``
        (``CHW``, ``HWC``, ``HW``...), floats scaled by 255 and clipped, uint8 as is."""
        self._media(tag, Image(tensorboard_pixels(tag, img_tensor, dataformats)), global_step)

    def add_images(
        self,
        tag: str,
        img_tensor: object,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "NCHW",
    ) -> None:
        """Log a batch of images as one grid, 8 across, as torch's writer does."""
        self._media(tag, Image(tensorboard_pixels(tag, img_tensor, dataformats)), global_step)

    def add_image_with_boxes(
        self, tag: str, img_tensor: object, box_tensor: object, *args: object, **kwargs: object
    ) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_image_with_boxes")

    def add_figure(
        self,
        tag: str,
        figure: object,
        global_step: int | None = None,
        close: bool = True,
        walltime: float | None = None,
    ) -> None:
        """Log a matplotlib figure (or a list: a grid) rendered to RGB as torch's writer renders it;
        closes the figure when ``close``."""
        import numpy as np

        figures = figure if isinstance(figure, list) else [figure]
        rendered = [_render_figure(one, close) for one in figures]
        if isinstance(figure, list):
            pixels = tensorboard_pixels(tag, np.stack(rendered), "NCHW")
        else:
            pixels = tensorboard_pixels(tag, rendered[0], "CHW")
        self._media(tag, Image(pixels), global_step)

    def add_video(
        self, tag: str, vid_tensor: object, global_step: int | None = None, *args: object, **kwargs: object
    ) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_video")

    def add_audio(
        self, tag: str, snd_tensor: object, global_step: int | None = None, *args: object, **kwargs: object
    ) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_audio")

    def add_tensor(
        self, tag: str, tensor: object, global_step: int | None = None, *args: object, **kwargs: object
    ) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_tensor")

    def add_graph(self, model: object, input_to_model: object = None, *args: object, **kwargs: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_graph")

    def add_onnx_graph(self, prototxt: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_onnx_graph")

    def add_embedding(
        self, mat: object, metadata: object = None, label_img: object = None, *args: object, **kwargs: object
    ) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_embedding")

    def add_pr_curve(self, tag: str, labels: object, predictions: object, *args: object, **kwargs: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_pr_curve")

    def add_pr_curve_raw(self, tag: str, *args: object, **kwargs: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_pr_curve_raw")

    def add_mesh(self, tag: str, vertices: object, *args: object, **kwargs: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_mesh")

    def add_custom_scalars(self, layout: object) -> None:
        """Accepted, not stored (one warning): LaunchHelm's charts choose their own layout."""
        self._skip("add_custom_scalars")

    def add_custom_scalars_multilinechart(self, tags: object, *args: object, **kwargs: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_custom_scalars_multilinechart")

    def add_custom_scalars_marginchart(self, tags: object, *args: object, **kwargs: object) -> None:
        """Accepted, not stored (one warning)."""
        self._skip("add_custom_scalars_marginchart")

    # -- ending --------------------------------------------------------------
    def flush(self) -> None:
        """Write every buffered point (and text) to the store now."""
        if not self._closed:
            self._run.flush()
            self._put_record(force=True)

    def close(self) -> None:
        """Write what is buffered and close the run (``finish()``); calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._run.finish()
        self._put_record(force=True)

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
        else:  # as a LaunchHelm run does: the session ends, the run stays resumable
            self._closed = True
            self._run.__exit__(exc_type, exc, tb)
            self._put_record(force=True)

    def __repr__(self) -> str:
        return f"<launchhelm.tensorboard.SummaryWriter {self.log_dir!r} -> {self._project}/{self._run.id}>"


def _render_figure(figure: Any, close: bool) -> Any:
    """A figure's RGB pixels, ``CxHxW``, as torch's ``figure_to_image`` renders them (Agg)."""
    import matplotlib.backends.backend_agg as agg
    import numpy as np

    canvas: Any = agg.FigureCanvasAgg(figure)  # typed or not, whichever matplotlib is installed
    canvas.draw()
    data = np.frombuffer(canvas.buffer_rgba(), dtype=np.uint8)
    width, height = figure.canvas.get_width_height()
    pixels = np.moveaxis(data.reshape([height, width, 4])[:, :, 0:3], 2, 0)
    if close:
        import matplotlib.pyplot as plt

        plt.close(figure)
    return pixels


def _numpy(tag: str, value: object) -> Any:
    """torch's ``make_np``: a numpy array of a tensor (bfloat16 as float16) or an array."""
    import numpy as np

    module = type(value).__module__ or ""
    if module.startswith("torch") and hasattr(value, "detach"):
        tensor: Any = value
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.half()
        return tensor.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    if np.isscalar(value):
        return np.array([value])
    raise InvalidTypeError(f"{tag!r}: give a numpy array or a torch tensor, not {type(value).__name__}")


def tensorboard_pixels(tag: str, value: object, dataformats: str) -> Any:
    """uint8 ``HxWxC`` pixels of ``value`` exactly as torch's ``summary.image`` makes them before its PNG."""
    import numpy as np

    array = _numpy(tag, value)
    fmt = dataformats.upper()
    if len(set(fmt)) != len(fmt) or set(fmt) - set("NCHW") or array.ndim != len(fmt) or not 2 <= len(fmt) <= 4:
        raise InvalidMediaError(
            f"{tag!r}: an image of shape {array.shape} does not match dataformats={dataformats!r}", key=tag
        )
    if len(fmt) == 4:
        if "N" not in fmt or "C" not in fmt:
            raise InvalidMediaError(f"{tag!r}: dataformats={dataformats!r}: a batch is NCHW or NHWC", key=tag)
        nchw = array.transpose([fmt.find(c) for c in "NCHW"])
        if nchw.shape[1] == 1:
            nchw = np.concatenate([nchw, nchw, nchw], 1)
        if nchw.shape[1] != 3:
            raise InvalidMediaError(f"{tag!r}: a batch of images takes 1 or 3 channels, not {nchw.shape[1]}", key=tag)
        count, _, height, width = nchw.shape
        across = min(count, 8)
        down = -(-count // across) if count else 0
        canvas = np.zeros((3, height * down, width * across), dtype=nchw.dtype)
        for i in range(count):  # torch's make_grid for TensorBoard: no padding
            y, x = divmod(i, across)
            canvas[:, y * height : (y + 1) * height, x * width : (x + 1) * width] = nchw[i]
        hwc = canvas.transpose(1, 2, 0)
    elif len(fmt) == 3:
        if "N" in fmt:
            raise InvalidMediaError(f"{tag!r}: dataformats={dataformats!r}: one image is CHW or HWC", key=tag)
        hwc = array.transpose([fmt.find(c) for c in "HWC"])
        if hwc.shape[2] == 1:
            hwc = np.concatenate([hwc, hwc, hwc], 2)
    else:
        if fmt not in ("HW", "WH"):
            raise InvalidMediaError(f"{tag!r}: dataformats={dataformats!r}: use HW", key=tag)
        hw = array.transpose([fmt.find(c) for c in "HW"])
        hwc = np.stack([hw, hw, hw], 2)
    scale = 1 if hwc.dtype == np.uint8 else 255
    if np.issubdtype(hwc.dtype, np.floating) and np.isnan(hwc).any():
        raise InvalidMediaError(f"{tag!r}: the image has NaN pixels", key=tag)
    return ((hwc.astype(np.float32) * scale).clip(0, 255)).astype(np.uint8)


def _tensorflow_bins() -> list[float]:
    """torch's writer's default histogram bins (``bins="tensorflow"``): +-1e-12 growing by 1.1 to 1e20, and 0."""
    v, buckets = 1e-12, []
    while v < 1e20:
        buckets.append(v)
        v *= 1.1
    return [-b for b in reversed(buckets)] + [0] + buckets


def tensorboard_histogram(tag: str, values: object, bins: object, max_bins: int | None) -> tuple[Any, Any]:
    """``(counts, edges)`` of the buckets torch's ``make_histogram`` writes (``bucket[1:]``, ``bucket_limit``).

    TensorBoard's first bucket is an empty one whose right limit is the left
    edge of the first real bin; so its buckets are exactly these bins.
    """
    import numpy as np

    array = _numpy(tag, values).astype(float).reshape(-1)
    if array.size == 0:
        raise InvalidMediaError(f"{tag!r}: a histogram of no values", key=tag)
    if not np.isfinite(array).all():
        raise InvalidMediaError(f"{tag!r}: the histogram's values hold NaN or infinity", key=tag)
    edges: Any = _tensorflow_bins() if isinstance(bins, str) and bins == "tensorflow" else bins
    counts, limits = np.histogram(array, bins=edges)
    if max_bins is not None and len(counts) > max_bins:
        sub = len(counts) // max_bins
        remainder = len(counts) % sub
        if remainder:
            counts = np.pad(counts, pad_width=[[0, sub - remainder]], mode="constant", constant_values=0)
        counts = counts.reshape(-1, sub).sum(axis=-1)
        merged = np.empty((counts.size + 1,), limits.dtype)
        merged[:-1] = limits[:-1:sub]
        merged[-1] = limits[-1]
        limits = merged
    cum = np.cumsum(np.greater(counts, 0))
    start, end = np.searchsorted(cum, [0, cum[-1] - 1], side="right")
    start, end = int(start), int(end) + 1
    bucket = counts[start - 1 : end] if start > 0 else np.concatenate([[0], counts[:end]])
    bucket_limit = limits[start : end + 1]
    return bucket[1:], bucket_limit


def stored_texts(
    run_id: str,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
) -> list[StoredText]:
    """What ``add_text`` kept for run ``run_id``: ``[{"tag", "step", "time", "text"}]``, in logging order."""
    st = open_store(store, storage_options)
    return list(_read_record(st, run_id).get("texts") or [])
