"""What every LaunchHelm widget shares.

- **Targets**: a widget takes a :class:`launchhelm.Run`, a
  :class:`launchhelm.RunHandle` or a run id, and reads it through the public
  query API only (:class:`launchhelm.Api`, :class:`launchhelm.RunHandle`).
- **Reattaching**: building a widget for a run that already has a live one
  of the same kind and arguments returns that widget, so re-running a cell
  shows the same widget (one poller per run and kind) instead of another.
- **The ready handshake**: custom messages sent before the browser has
  loaded the (large) front end are lost, so the front end says ``ready``
  once it listens, and a widget sends nothing before that: its state is the
  buffer, sent whole on each ``ready``.
- **Polling**: a daemon thread re-reads the run every ``interval`` seconds
  (slower once the run is no longer running), started when a front end
  first says ``ready`` and stopped by :meth:`close`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeAlias, TypeVar, cast

import anywidget
import traitlets

from launchhelm._api import Api, RunHandle
from launchhelm._exceptions import InvalidTypeError, PathNotFoundError
from launchhelm._types import RunLike
from launchhelm.widgets._messages import (
    MSG_ACTION,
    MSG_READY,
    ActionMessage,
    ToFrontEnd,
    ZoomMessage,
    read_message,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from launchhelm.storage import Store

__all__ = [
    "STATIC",
    "LiveWidget",
    "Reusable",
    "format_time",
    "front_end",
    "resolve_run",
    "static_file",
    "time_labels",
]

#: Where the esbuild bundle of ``js/`` lives (built by ``scripts/setup.sh``).
STATIC = Path(__file__).with_name("static")

#: Where a widget reads a run id or project: a store URL or path (default ``$LAUNCHHELM_STORE``, else
#: ``~/.launchhelm``), or a store.
StoreArg: TypeAlias = "str | os.PathLike[str] | Store | None"

#: Polling slows by this factor while the run is not running (nothing streams then).
IDLE_SLOWDOWN = 5.0


def static_file(name: str) -> Path:
    """Path of a built front-end file; a clear error if the bundle was never built."""
    path = STATIC / name
    if not path.is_file():
        raise PathNotFoundError(
            f"the LaunchHelm widget front end is not built ({path} is missing): run `bash scripts/setup.sh`, "
            "or `npm ci && npm run build` in js/ (needs Node.js and npm)",
            path=str(path),
        )
    return path


#: What a widget shows in its cell when the front end is not in this install (one line, no traceback).
MISSING_FRONT_END = (
    "LaunchHelm's widget front end is missing from this install ({path}): reinstall LaunchHelm from a wheel "
    "(pip install 'launchhelm[widgets]'), or build it from a source checkout: bash js/build.sh (needs Node.js and npm)"
)

# Rendered in place of the widget: the message as one line, as plain DOM (needs nothing from the bundle).
_MISSING_ESM = """\
const MESSAGE = %s;
export default {
  render({ el }) {
    const line = document.createElement("div");
    line.className = "launchhelm-missing-front-end";
    line.style.cssText = "color:#a94442;font-family:monospace;padding:4px 0";
    line.textContent = MESSAGE;
    el.appendChild(line);
  },
};
"""


def front_end(bundle: str) -> tuple[str, str, str]:
    """``(esm, css, missing)`` of a widget whose front end is ``static/<bundle>``.

    Where the bundle is not installed, ``esm`` draws :data:`MISSING_FRONT_END`
    in the cell instead and ``missing`` is that line ("" when all is there):
    a widget never raises for it, so a cell shows the one line, not a
    traceback.
    """
    import json

    esm, css = STATIC / bundle, STATIC / "widgets.css"
    if esm.is_file() and css.is_file():
        return esm.read_text(encoding="utf-8"), css.read_text(encoding="utf-8"), ""
    missing = MISSING_FRONT_END.format(path=esm if not esm.is_file() else css)
    return _MISSING_ESM % json.dumps(missing), "", missing


def resolve_run(run_or_id: RunLike | str, store: StoreArg = None) -> tuple[Api, RunHandle]:
    """An :class:`Api` on the run's store and a handle on the run of the widget's own.

    Each widget polls from its own thread, so it never shares a handle with
    the notebook's code or with another widget.

    Parameters
    ----------
    run_or_id:
        A :class:`Run` being written in this process, a :class:`RunHandle`,
        or a run id (looked up in ``store``).
    store:
        Store URL or path for a run id; default ``$LAUNCHHELM_STORE``, else
        ``~/.launchhelm``. Ignored for a run or handle, which know their store.
    """
    if isinstance(run_or_id, RunLike):
        api = Api(run_or_id.store)
        return api, api.run(run_or_id.id)
    if isinstance(run_or_id, str):
        api = Api(store)
        return api, api.run(run_or_id)
    raise InvalidTypeError(
        f"expected a launchhelm.Run, a launchhelm.RunHandle or a run id string, not {type(run_or_id).__name__} "
        f"{run_or_id!r}"
    )


def format_time(ts: float | None) -> str:
    """Local wall-clock time as people read it in a table ("2026-05-01 12:03:04"), or "-"."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def time_labels(*stamps: float | None) -> dict[str, float]:
    """``{format_time(ts): ts}``: lets a front end redraw the times in a state's text in the browser's
    own zone, with how long ago (js/src/human.js), where the text itself stays what a saved picture shows."""
    return {format_time(ts): float(ts) for ts in stamps if ts is not None}


_registry: dict[tuple[Hashable, ...], Reusable[object]] = {}
# reentrant: an allocation under it (``__new__``) may collect a dropped widget, whose ``__del__`` closes it
# and forgets it here in the same thread (a plain lock deadlocked the kernel's thread there)
_registry_lock = threading.RLock()


#: What a widget's :meth:`Reusable._reuse_key` resolved from its arguments (an :class:`Api`, a run...).
R = TypeVar("R", covariant=True)


class Reusable(Generic[R]):
    """Mixin: constructing with the same key returns the live widget already built.

    Subclasses implement :meth:`_reuse_key` (the resolved run plus whatever
    changes what is shown) and guard their ``__init__`` with
    :meth:`_reused`; ``__init__`` finds what the key resolved in ``_resolved``.
    """

    _reuse_as: tuple[Hashable, ...] | None = None
    _resolved: R

    def __new__(cls, *args: object, **kwargs: object) -> Self:
        key, resolved = cls._reuse_key(*args, **kwargs)
        with _registry_lock:
            existing = _registry.get(key)
            if existing is not None and getattr(existing, "comm", None) is not None:
                return cast("Self", existing)  # a key names its widget's class first
            obj = super().__new__(cls, *args, **kwargs)
            obj._reuse_as = key
            obj._resolved = resolved
            obj._initialised = False
            _registry[key] = obj
            return obj

    @classmethod
    def _reuse_key(cls, *args: Any, **kwargs: Any) -> tuple[tuple[Hashable, ...], R]:
        raise NotImplementedError

    def _reused(self) -> bool:
        """True when ``__init__`` runs again on a widget handed back by ``__new__``."""
        if getattr(self, "_initialised", False):
            return True
        self._initialised = True
        return False

    def _forget(self) -> None:
        with _registry_lock:
            if self._reuse_as is not None and _registry.get(self._reuse_as) is self:
                del _registry[self._reuse_as]


def run_key(cls: type, api: Api, handle: RunHandle, *extra: Hashable) -> tuple[Hashable, ...]:
    """The registry key of a widget of kind ``cls`` on ``handle`` showing ``extra``."""
    return (cls.__qualname__, api.store.url, handle.id, *extra)


class LiveWidget(Reusable[R], anywidget.AnyWidget):
    """An anywidget that polls the store and speaks the ready handshake.

    Subclasses implement :meth:`refresh` (re-read the run, update traits or
    send messages) and may implement :meth:`snapshot_messages` (messages a
    newly ready front end needs) and action handlers in :attr:`_actions`.
    """

    #: Seconds between reads of the store while the run is running.
    interval = traitlets.Float(2.0)
    #: A sentence about the last failure to read the store ("" when fine).
    error = traitlets.Unicode("").tag(sync=True)

    _actions: ClassVar[dict[str, str]] = {}
    #: :data:`MISSING_FRONT_END` when this install lacks the front end, else "".
    missing_front_end: str = ""

    # -- what the cell shows -------------------------------------------------
    def static_mimebundle(self) -> dict[str, str]:
        """The widget as it stands, for a notebook opened without a kernel (``text/html``, ``image/svg+xml``)."""
        return {}

    # kwargs typed as AnyWidget's own: IPython passes ``include``/``exclude`` through
    def _repr_mimebundle_(self, **kwargs: dict[str, object]) -> tuple[dict[str, object], dict[str, object]] | None:
        from launchhelm.widgets._static import split_fallback

        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
        data = dict(data)
        if self.missing_front_end:
            data["text/plain"] = self.missing_front_end
        try:
            with self._lock:
                static = self.static_mimebundle()
        except Exception:  # a saved picture is a nicety: the live view must show regardless
            static = {}
        return split_fallback(data, static, [self.model_id], alt=repr(self)), metadata

    def _setup_live(self) -> None:
        self._lock = threading.RLock()
        self._ready = False
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self.on_msg(self._on_front_end_message)

    # -- messages ---------------------------------------------------------
    @property
    def ready(self) -> bool:
        """A front end has said it listens: custom messages now reach it."""
        return self._ready

    def send_when_ready(self, content: ToFrontEnd, buffers: Sequence[bytes] | None = None) -> bool:
        """Send a custom message if a front end listens; otherwise keep it for the next ``ready``.

        Returns whether it was sent. Until ``ready`` nothing leaves the
        kernel: the widget's state is the buffer, and :meth:`snapshot_messages`
        turns it into the messages a front end needs when it says ``ready``.
        """
        with self._lock:
            if not self._ready:
                return False
            self.send(content, list(buffers) if buffers else None)
            return True

    def snapshot_messages(self) -> Sequence[ToFrontEnd]:
        """Messages that bring a newly ready front end up to date."""
        return []

    def _on_front_end_message(self, _widget: object, content: object, buffers: Sequence[bytes]) -> None:
        message = read_message(content)
        if message is None:
            return
        if message["type"] == MSG_READY:
            from launchhelm.widgets._static import live_message

            with self._lock:
                self._ready = True
                self.send(live_message([self.model_id]))
                for snapshot in self.snapshot_messages():
                    self.send(snapshot)
            self._start_polling()
        elif message["type"] == MSG_ACTION:
            self._run_action(message)
        else:
            self.handle_message(message)

    def handle_message(self, message: ZoomMessage) -> None:
        """Other front-end messages (the chart's zoom)."""

    def _run_action(self, message: ActionMessage) -> None:
        name = message["name"]
        method: Callable[..., object] | None = getattr(self, self._actions.get(name, ""), None)
        if method is None:
            self.error = f"unknown action {name!r}"
            return
        try:
            method(**message["args"])
        except Exception as exc:  # shown in the widget: a click must never kill the comm
            self.error = f"{type(exc).__name__}: {exc}"
        else:
            self.error = ""

    # -- polling ----------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the run from the store and update what is shown."""
        raise NotImplementedError

    def is_active(self) -> bool:
        """Whether the run may change soon (poll at full speed)."""
        return True

    def _start_polling(self) -> None:
        with self._lock:
            if self._poller is not None or self._stop.is_set():
                return
            self._poller = threading.Thread(target=self._poll, name=f"launchhelm-{type(self).__name__}", daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            try:
                with self._lock:
                    self.refresh()
                active = self.is_active()
                if self.error.startswith("reading the store failed"):
                    self.error = ""
            except Exception as exc:  # the store may come back: say so and keep polling
                self.error = f"reading the store failed: {type(exc).__name__}: {exc}"
                active = True
            wait = self.interval if active else self.interval * IDLE_SLOWDOWN

    @property
    def polling(self) -> bool:
        """A poller thread is alive for this widget."""
        return self._poller is not None and self._poller.is_alive()

    def close(self) -> None:
        """Stop polling and close the widget (its views in the notebook go blank)."""
        self._stop.set()
        poller = self._poller
        if poller is not None and poller is not threading.current_thread():
            poller.join(timeout=10)
        self._forget()
        super().close()


class RunWidget(LiveWidget[tuple[Api, RunHandle]]):
    """A live widget about one run, whose ``state`` trait carries its ``status``.

    Subclasses name their front end in :attr:`_bundle` and call
    :meth:`_init_run` from a ``__init__`` guarded by :meth:`_reused`.
    """

    #: The widget's front end in ``static/``.
    _bundle: ClassVar[str] = ""

    @classmethod
    def _reuse_key(
        cls, run_or_id: RunLike | str, store: StoreArg = None, **_: object
    ) -> tuple[tuple[Hashable, ...], tuple[Api, RunHandle]]:
        api, handle = resolve_run(run_or_id, store)
        return run_key(cls, api, handle), (api, handle)

    def _init_run(self, interval: float) -> None:
        self._esm, self._css, self.missing_front_end = front_end(self._bundle)
        super().__init__(interval=interval)
        self._setup_live()
        self._api: Api = self._resolved[0]
        self._handle: RunHandle = self._resolved[1]

    @property
    def run(self) -> RunHandle:
        """The run shown."""
        return self._handle

    def __repr__(self) -> str:
        return f"<launchhelm.widgets.{type(self).__name__} {self._handle.project}/{self._handle.id}>"

    def is_active(self) -> bool:
        state: Mapping[str, object] = getattr(self, "state", {})
        return state.get("status") == "running"
