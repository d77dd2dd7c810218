"""W&B's config and summary objects, and what ``define_metric`` records, for :mod:`launchhelm.wandb`."""

from __future__ import annotations

import json
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import TYPE_CHECKING, Any, TypedDict

from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError, LaunchHelmError
from launchhelm._integration import plain_config
from launchhelm._types import JSONValue
from launchhelm.wandb._objects import Media

if TYPE_CHECKING:
    from typing import TypeAlias

    from launchhelm.wandb._liverun import Run

__all__ = [
    "SUMMARY_MODES",
    "Config",
    "ConfigError",
    "ConfigKeyError",
    "Metric",
    "Summary",
]

#: What reading a config or summary value gives: plain JSON (:data:`JSONValue`), left untyped as
#: W&B's own objects leave it, so that code such as ``wandb.config.lr * 2`` type-checks against
#: this drop-in as it does against W&B.
ConfigValue: TypeAlias = Any

#: Summary modes ``define_metric(summary=...)`` takes, as W&B does.
SUMMARY_MODES = ("min", "max", "mean", "best", "last", "first", "none", "copy")


class ConfigError(InvalidArgumentError):
    """A config value changed without ``allow_val_change=True``, as W&B refuses it."""


class ConfigKeyError(LaunchHelmError, AttributeError, KeyError):
    """No such config key (``except KeyError`` and ``getattr(config, k, default)`` both work)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def _as_mapping(values: object, what: str) -> dict[str, object]:
    """A config given as W&B takes it: a dict, an argparse Namespace or any object with ``__dict__``."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return dict(values)
    if isinstance(values, str):
        raise InvalidTypeError(
            f"{what}={values!r}: config files are not read by launchhelm.wandb; load the file and pass a dict"
        )
    if hasattr(values, "__dict__"):
        return {k: v for k, v in vars(values).items() if not k.startswith("_")}
    raise InvalidTypeError(f"{what} is a {type(values).__name__}; pass a dict or an argparse.Namespace")


def _plain(value: object) -> JSONValue:
    plain: JSONValue = plain_config({"v": value})["v"]
    return plain


# -- config and summary ---------------------------------------------------------
class Config:
    """``run.config``: W&B's config, with attribute and item access.

    Changing a value already set raises :class:`ConfigError` unless
    ``update(..., allow_val_change=True)``, as W&B does. Values are kept as
    plain JSON (numbers, strings, bools, lists, dicts; anything else as its
    ``str``).
    """

    _items: dict[str, JSONValue]
    _on_change: Callable[[], None] | None

    def __init__(self, values: Mapping[str, object] | None = None, on_change: Callable[[], None] | None = None) -> None:
        object.__setattr__(self, "_items", {})
        object.__setattr__(self, "_on_change", on_change)
        if values:
            self._items.update(plain_config(values))

    def _set(self, key: str, value: object, allow_val_change: bool | None) -> None:
        if not isinstance(key, str):
            raise InvalidTypeError(f"config keys are strings; got {type(key).__name__} {key!r}")
        key = key.strip("-")  # W&B strips the dashes of argparse-style names
        value = _plain(value)
        if not allow_val_change and key in self._items and self._items[key] != value:
            raise ConfigError(
                f"config[{key!r}] is {self._items[key]!r}; refusing to change it to {value!r}: pass "
                "allow_val_change=True to config.update() to change it"
            )
        self._items[key] = value

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def update(self, values: object, allow_val_change: bool | None = None) -> None:
        """Add or set keys (a dict, an argparse Namespace or an object's attributes)."""
        for key, value in _as_mapping(values, "config").items():
            self._set(key, value, allow_val_change)
        self._changed()

    def setdefaults(self, values: Mapping[str, object]) -> None:
        """Set the keys not set yet."""
        for key, value in _as_mapping(values, "config").items():
            if key.strip("-") not in self._items:
                self._set(key, value, False)
        self._changed()

    def as_dict(self) -> dict[str, JSONValue]:
        """A copy of the config as a plain dict."""
        return json.loads(json.dumps(self._items))  # type: ignore[no-any-return]

    _as_dict = as_dict

    def get(self, key: str, default: ConfigValue = None) -> ConfigValue:
        """The value of ``key``, or ``default``."""
        return self._items.get(key, default)

    def keys(self) -> KeysView[str]:
        """The config's keys."""
        return self._items.keys()

    def items(self) -> ItemsView[str, ConfigValue]:
        """The config's items."""
        return self._items.items()

    def values(self) -> ValuesView[ConfigValue]:
        """The config's values."""
        return self._items.values()

    def __getitem__(self, key: str) -> ConfigValue:
        try:
            return self._items[key]
        except KeyError:
            raise ConfigKeyError(f"config has no key {key!r} (keys: {', '.join(sorted(self._items))})") from None

    def __getattr__(self, key: str) -> ConfigValue:
        if key.startswith("__"):
            raise ConfigKeyError(key)
        return self[key]

    def __setitem__(self, key: str, value: object) -> None:
        self._set(key, value, None)
        self._changed()

    __setattr__ = __setitem__

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"launchhelm.wandb.Config({self._items!r})"


class Summary:
    """``run.summary``: each metric's last logged value unless set explicitly (W&B's meaning).

    ``summary["best_acc"] = 0.93`` sets a value; logging ``best_acc`` later
    replaces it, as in W&B. A metric given ``define_metric(summary="max")``
    keeps ``{"max": ...}`` instead of its last value.
    """

    _owner: Run

    def __init__(self, owner: Run) -> None:
        object.__setattr__(self, "_owner", owner)

    @property
    def _items(self) -> dict[str, JSONValue]:
        return self._owner._summary

    def __getitem__(self, key: str) -> ConfigValue:
        try:
            return self._items[key]
        except KeyError:
            raise ConfigKeyError(f"summary has no key {key!r}") from None

    def __getattr__(self, key: str) -> ConfigValue:
        if key.startswith("__"):
            raise ConfigKeyError(key)
        return self[key]

    def __setitem__(self, key: str, value: object) -> None:
        if not isinstance(key, str):
            raise InvalidTypeError(f"summary keys are strings; got {type(key).__name__} {key!r}")
        plain = _plain(value) if not isinstance(value, Media) else repr(value)
        with self._owner._lock:
            self._items[key] = plain
            self._owner._dirty = True

    __setattr__ = __setitem__

    def __delitem__(self, key: str) -> None:
        with self._owner._lock:
            del self._items[key]
            self._owner._dirty = True

    def update(self, values: Mapping[str, object]) -> None:
        """Set several values."""
        for key, value in dict(values).items():
            self[key] = value

    def get(self, key: str, default: ConfigValue = None) -> ConfigValue:
        """The value of ``key``, or ``default``."""
        return self._items.get(key, default)

    def keys(self) -> KeysView[str]:
        """The summary's keys."""
        return self._items.keys()

    def items(self) -> ItemsView[str, ConfigValue]:
        """The summary's items."""
        return self._items.items()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"launchhelm.wandb.Summary({self._items!r})"


class MetricRecord(TypedDict):
    """A :class:`Metric` as the run's W&B record stores it."""

    step_metric: str | None
    summary: list[str]
    goal: str | None
    hidden: bool
    step_sync: bool


class Metric:
    """What ``define_metric`` recorded: ``name`` plotted against ``step_metric``, summarised by ``summary``."""

    def __init__(
        self,
        name: str,
        step_metric: str | None,
        summary: list[str],
        goal: str | None,
        hidden: bool,
        step_sync: bool,
    ) -> None:
        self.name = name
        self.step_metric = step_metric
        self.summary = summary
        self.goal = goal
        self.hidden = hidden
        self.step_sync = step_sync

    def as_record(self) -> MetricRecord:
        """As stored in the run's W&B record."""
        return {
            "step_metric": self.step_metric,
            "summary": list(self.summary),
            "goal": self.goal,
            "hidden": self.hidden,
            "step_sync": self.step_sync,
        }

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.Metric {self.name!r} step_metric={self.step_metric!r} summary={self.summary!r}>"


class _Aggregate:
    __slots__ = ("count", "first", "last", "max", "min", "total")

    def __init__(self, value: float) -> None:
        self.first = self.last = self.min = self.max = value
        self.total = value
        self.count = 1

    def add(self, value: float) -> None:
        self.last = value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        self.total += value
        self.count += 1

    def value(self, mode: str, goal: str | None) -> float:
        if mode == "best":
            return self.max if goal == "maximize" else self.min
        if mode == "mean":
            return self.total / self.count
        return float(getattr(self, "last" if mode == "copy" else mode))
