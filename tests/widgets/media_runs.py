"""A run that logged images, a table and a histogram, rewound once: what the Media tab tests read.

Steps 1-8 log two image keys (``samples``, a list of two; ``val/grid``), a
table (``completions``, with an image cell and hostile text) at even steps
and a histogram (``weights``) every step; then a restore back to step 5 (a
rewind, recorded as a framework's restore is) and steps 6-8 again with other
pixels. No torch: the rewind is recorded as ``record_restore`` does for any
framework.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import launchhelm as lh
from launchhelm._integration import record_restore

#: Text a shared store may hold: shown as text, it must never run.
HOSTILE_CAPTION = "<img src=x onerror=\"window.__lh_pwned='caption'\">"
HOSTILE_CELL = "<script>window.__lh_pwned='cell'</script><b>bold?</b>"
REWIND_TO = 5
END = 8
IMAGE_KEYS = ("samples", "val/grid")


def pixels(step: int, attempt: int, shade: int = 0) -> np.ndarray:
    """A 40x32 picture whose colour says its step and attempt."""
    image = np.zeros((40, 32, 3), dtype=np.uint8)
    image[..., 0] = (step * 30) % 256
    image[..., 1] = 200 if attempt else 40
    image[..., 2] = shade
    return image


def _log(run: lh.Run, step: int, attempt: int) -> None:
    values: dict[str, object] = {
        "loss": 1.0 / step,
        "samples": [
            lh.Image(pixels(step, attempt, 0), caption=f"step {step} attempt {attempt} #0"),
            lh.Image(pixels(step, attempt, 255), caption=f"step {step} attempt {attempt} #1"),
        ],
        "val/grid": lh.Image(pixels(step, attempt, 128), caption=HOSTILE_CAPTION if step == 2 else f"grid {step}"),
        "weights": lh.Histogram(np.linspace(-1, 1, 50) * step, bins=8),
    }
    if step % 2 == 0:
        values["completions"] = lh.Table(
            columns=["prompt", "reward", "picture"],
            rows=[
                ["b prompt", 0.5 + step, lh.Image(pixels(step, attempt), caption="cell picture")],
                [HOSTILE_CELL, 10.0 + step, None],
                ["a prompt", -1.0, None],
            ],
        )
    run.log(values, step=step)


def media_run(store: str, project: str = "media", end: int = END) -> str:
    """Log steps 1..``end``, rewind to step 5, log 6..``end`` again; finish. The run's id."""
    run = lh.init(project, store=store, flush_interval=3600)
    for step in range(1, end + 1):
        _log(run, step, 0)
    run.flush()
    record_restore(run, REWIND_TO, None, "test")
    for step in range(REWIND_TO + 1, end + 1):
        _log(run, step, 1)
    run.finish()
    return run.id


class Wire:
    """The custom messages (and their buffers) a widget sends, read where ipywidgets hands them to the comm."""

    def __init__(self, widget: Any) -> None:
        self.widget = widget
        self.sent: list[tuple[dict[str, Any], list[bytes]]] = []
        publish = widget.comm.publish_msg

        def record(msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **kw: Any) -> Any:
            if isinstance(data, dict) and data.get("method") == "custom":
                self.sent.append((data["content"], [bytes(b) for b in buffers or []]))
            return publish(msg_type, data, metadata, buffers, **kw)

        widget.comm.publish_msg = record

    def say(self, content: dict[str, Any]) -> list[tuple[dict[str, Any], list[bytes]]]:
        """Send ``content`` as the front end would; what the kernel answered."""
        before = len(self.sent)
        self.widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})
        return self.sent[before:]
