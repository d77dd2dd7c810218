"""System metrics: how the machine was doing while a session trained.

The session's background thread samples every ``system_metrics`` seconds
(15 by default) and records the values as points under ``system/``: never
on ``log()``'s path, so training pays nothing for them. They live on their
own time axis: ``RunHandle.history(stream="system")`` returns one row per
sample, by wall time, and the default stream leaves them out.

- ``system/cpu_percent`` (this process, 100 = one core busy),
  ``system/memory_rss_bytes``, ``system/memory_percent`` (the machine's),
  ``system/disk_read_bytes`` / ``disk_write_bytes`` and
  ``system/net_sent_bytes`` / ``net_recv_bytes`` (the machine's counters,
  since boot): psutil.
- for each visible NVIDIA GPU ``i``: ``system/gpu<i>/utilization``,
  ``memory_used_bytes``, ``temperature``, ``power_watts``: nvidia-ml-py
  (``pynvml``) when importable; no GPU, no driver or no package gives no
  GPU keys and no error.
- under ``torch.distributed`` (``WORLD_SIZE`` > 1) every key is
  ``system/rank<r>/...``: each rank reports its own process and devices.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

    import pandas as pd
    import psutil
    import pyarrow as pa

__all__ = [
    "DEFAULT_SYSTEM_INTERVAL",
    "STREAMS",
    "SYSTEM_PREFIX",
    "SystemSampler",
    "default_points",
    "system_frame",
    "system_interval",
]

_log = logging.getLogger("launchhelm")

SYSTEM_PREFIX = "system/"
#: What ``RunHandle.history(stream=...)`` takes.
STREAMS = ("default", "system")
#: Seconds between samples (``system_metrics=`` on ``init``, or ``LAUNCHHELM_SYSTEM_METRICS``).
DEFAULT_SYSTEM_INTERVAL = 15.0


def system_interval(given: object) -> float | None:
    """Seconds between samples, or None for no sampler: ``system_metrics=`` as ``init`` takes it."""
    from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError

    if given is None:
        raw = os.environ.get("LAUNCHHELM_SYSTEM_METRICS")
        if raw is None or raw == "":
            return DEFAULT_SYSTEM_INTERVAL
        if raw.lower() in ("0", "off", "false", "no"):
            return None
        try:
            given = float(raw)
        except ValueError:
            raise InvalidArgumentError(f"LAUNCHHELM_SYSTEM_METRICS={raw!r}: give a number of seconds, or off") from None
    if given is False:
        return None
    if given is True:
        return DEFAULT_SYSTEM_INTERVAL
    if isinstance(given, bool) or not isinstance(given, (int, float)):
        raise InvalidTypeError(
            f"system_metrics={given!r}: give False (no sampler), True or a number of seconds between samples"
        )
    if not float(given) > 0 or float(given) == float("inf"):
        raise InvalidArgumentError(f"system_metrics={given!r}: give a positive number of seconds, or False")
    return float(given)


class SystemSampler:
    """Reads the counters; ``sample()`` returns ``{key: value}`` (missing sources are skipped)."""

    def __init__(self) -> None:
        self._prefix = SYSTEM_PREFIX
        world = os.environ.get("WORLD_SIZE", "")
        if world.isdigit() and int(world) > 1:
            self._prefix = f"{SYSTEM_PREFIX}rank{os.environ.get('RANK', '0')}/"
        self._process: psutil.Process | None = None
        self._psutil: ModuleType | None = None
        try:
            import psutil

            self._psutil = psutil
            self._process = psutil.Process()
            self._process.cpu_percent(None)  # the first call only starts the interval
        except Exception as exc:  # no psutil: no CPU, memory, disk or network keys
            _log.debug("system metrics without psutil: %s", exc)
        self._nvml: ModuleType | None = None
        self._gpus: list[object] = []  # NVML device handles
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no package, no driver, no GPU: nothing to report, nothing to say
            self._nvml, self._gpus = None, []

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        p = self._prefix
        ps, process = self._psutil, self._process
        if ps is not None and process is not None:
            try:
                out[f"{p}cpu_percent"] = float(process.cpu_percent(None))
                out[f"{p}memory_rss_bytes"] = float(process.memory_info().rss)
                out[f"{p}memory_percent"] = float(ps.virtual_memory().percent)
                disk = ps.disk_io_counters()
                if disk is not None:
                    out[f"{p}disk_read_bytes"] = float(disk.read_bytes)
                    out[f"{p}disk_write_bytes"] = float(disk.write_bytes)
                net = ps.net_io_counters()
                if net is not None:
                    out[f"{p}net_sent_bytes"] = float(net.bytes_sent)
                    out[f"{p}net_recv_bytes"] = float(net.bytes_recv)
            except Exception as exc:  # a container without /proc/diskstats...: keep what was read
                _log.debug("system metrics: %s", exc)
        nv = self._nvml
        if nv is None:
            return out
        for i, handle in enumerate(self._gpus):
            g = f"{p}gpu{i}/"
            try:
                out[f"{g}utilization"] = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                out[f"{g}memory_used_bytes"] = float(nv.nvmlDeviceGetMemoryInfo(handle).used)
                out[f"{g}temperature"] = float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
                out[f"{g}power_watts"] = float(nv.nvmlDeviceGetPowerUsage(handle)) / 1000.0
            except Exception as exc:  # one query a device does not support
                _log.debug("system metrics, gpu %d: %s", i, exc)
        return out


def _is_system(table: pa.Table) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    return pc.starts_with(table.column("key"), SYSTEM_PREFIX)


def default_points(table: pa.Table) -> pa.Table:
    """The run's own points: everything but ``system/``."""
    import pyarrow.compute as pc

    if not table.num_rows:
        return table
    system = _is_system(table)
    if not pc.any(system).as_py():
        return table  # no copy of a long run's points for nothing
    return table.filter(pc.invert(system))


def system_frame(table: pa.Table, keys: Sequence[str] | str | None = None) -> pd.DataFrame:
    """System samples as a frame by wall time: ``time`` (UTC), ``step``, then one column per key."""
    import pandas as pd

    points = table.filter(_is_system(table)) if table.num_rows else table
    frame = points.to_pandas(use_threads=False)
    if keys is not None:
        wanted = [keys] if isinstance(keys, str) else list(keys)
        frame = frame[frame["key"].isin(wanted)]
    if frame.empty:
        empty: pd.DataFrame = pd.DataFrame(
            {"time": pd.Series([], dtype="datetime64[ns, UTC]"), "step": pd.Series([], dtype="int64")}
        )
        return empty
    wide = frame.pivot_table(index="time", columns="key", values="value", aggfunc="last")
    steps = frame.groupby("time")["step"].max()
    order = list(dict.fromkeys(frame["key"]))
    out: pd.DataFrame = pd.DataFrame(
        {"time": pd.to_datetime(wide.index.to_numpy(), unit="s", utc=True), "step": steps.to_numpy()}
    )
    for key in order:
        out[key] = wide[key].to_numpy()
    return out
