"""The kernel and the front ends agree on what they say: every TypedDict of
``launchhelm/widgets/_messages.py`` has a JSDoc typedef of the same name in
``js/src/messages.js`` with the same keys (optional where it is optional, the
same ``type`` tag), the message type names are the same on both sides, each
widget syncs exactly the traits its ``...Traits`` names and its front end is
typed with them, each button's arguments are its handler's parameters, and
real widgets on a real run hold and send exactly those keys.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anywidget
import pytest

import launchhelm as lh
from launchhelm.widgets import (
    CompareChart,
    EvaluationTable,
    MediaPanel,
    ResumePicker,
    RunChart,
    RunDetails,
    RunLogs,
    RunsTable,
)
from launchhelm.widgets import _messages as messages
from launchhelm.widgets._runs_table import RunsTableView

SRC = Path(__file__).resolve().parents[2] / "js" / "src"
#: Each widget, its traits' TypedDict, and the front end typed with it.
WIDGETS: list[tuple[type[Any], str, str]] = [
    (ResumePicker, "PickerTraits", "picker.js"),
    (RunDetails, "DetailsTraits", "details.js"),
    (RunLogs, "LogsTraits", "details.js"),
    (EvaluationTable, "EvaluationsTraits", "evaluations.js"),
    (RunChart, "ChartTraits", "chart.js"),
    (CompareChart, "CompareTraits", "compare.js"),
    (RunsTableView, "RunsTableTraits", "runs_table.js"),
    (MediaPanel, "MediaTraits", "media.js"),
]
TYPED_DICTS = {name: obj for name, obj in vars(messages).items() if typing.is_typeddict(obj)}


def _js_typedefs() -> dict[str, dict[str, tuple[str, bool]]]:
    """``{typedef: {key: (JS type, optional)}}`` of every ``@typedef {object}`` in messages.js."""
    found: dict[str, dict[str, tuple[str, bool]]] = {}
    for block in re.findall(r"/\*\*(.*?)\*/", (SRC / "messages.js").read_text(), re.S):
        named = re.search(r"@typedef\s+\{object\}\s+(\w+)", block)
        if named is None:
            continue
        keys = re.findall(r"@property\s+\{(.*)\}\s+(\[?)(\w+)\]?", block)
        found[named.group(1)] = {key: (kind, bool(bracket)) for kind, bracket, key in keys}
    return found


def _annotations(typed: Any) -> dict[str, str]:
    """A TypedDict's keys and their annotations, as written (``from __future__ import annotations``)."""
    return {key: getattr(kind, "__forward_arg__", str(kind)) for key, kind in typed.__annotations__.items()}


def test_every_typeddict_has_a_js_typedef_with_the_same_keys() -> None:
    js = _js_typedefs()
    assert len(TYPED_DICTS) >= 40 and set(js) == set(TYPED_DICTS), set(js) ^ set(TYPED_DICTS)
    for name, typed in TYPED_DICTS.items():
        python = _annotations(typed)
        assert list(js[name]) == list(python), f"{name}: JS {list(js[name])} != Python {list(python)}"
        optional = {k for k, kind in python.items() if kind.startswith("NotRequired[")}
        assert {k for k, (_, opt) in js[name].items() if opt} == optional, name
        if "type" in python:  # a message: the same tag on both sides
            tag = typing.get_args(getattr(messages, python["type"]))
            assert js[name]["type"][0] == f'"{tag[0]}"', name


def test_message_type_names_are_spelled_alike() -> None:
    js = (SRC / "messages.js").read_text()
    block = js[js.index("export const MSG") : js.index("});")]
    names = dict(re.findall(r"^\s+(\w+): \"(\w+)\",", block, re.M))
    python = {k[len("MSG_") :]: v for k, v in vars(messages).items() if k.startswith("MSG_")}
    assert names == python and len(python) == 12


@pytest.mark.parametrize(("widget", "traits", "bundle"), WIDGETS, ids=[w[0].__name__ for w in WIDGETS])
def test_a_widgets_synced_traits_are_its_typeddict_and_its_front_end_is_typed_by_it(
    widget: type[Any], traits: str, bundle: str
) -> None:
    base = set(anywidget.AnyWidget.class_trait_names(sync=True))
    assert set(widget.class_trait_names(sync=True)) - base == set(TYPED_DICTS[traits].__annotations__)
    assert re.search(rf"Render<[^>]*\b{traits}\b", (SRC / bundle).read_text()), f"{bundle} is not a Render<{traits}>"


def test_each_button_takes_the_arguments_its_typeddict_names() -> None:
    names = _annotations(messages.ActionArgs)
    seen = set()
    for widget, _, _ in WIDGETS:
        for action, method in getattr(widget, "_actions", {}).items():
            seen.add(action)
            args = TYPED_DICTS[names[action]]
            params = list(inspect.signature(getattr(widget, method)).parameters.values())[1:]
            assert [p.name for p in params] == list(args.__annotations__), (widget.__name__, action)
            defaulted = {p.name for p in params if p.default is not inspect.Parameter.empty}
            assert defaulted == {k for k, v in _annotations(args).items() if v.startswith("NotRequired[")}, action
    assert seen == set(names)


def test_read_message_keeps_ours_and_drops_the_rest() -> None:
    read = messages.read_message
    assert read({"type": "ready"}) == {"type": "ready"}
    assert read({"type": "action", "name": "choose", "args": {"checkpoint_id": "c1"}}) == {
        "type": "action",
        "name": "choose",
        "args": {"checkpoint_id": "c1"},
    }
    assert read({"type": "zoom", "domain": [3, 1.5]}) == {"type": "zoom", "domain": [3.0, 1.5]}
    assert read({"type": "zoom", "domain": [True, 2]}) == {"type": "zoom", "domain": None}  # zooms out
    for junk in (None, "ready", [], {}, {"type": "nope"}, {"type": "action", "name": 3}, {"type": "action", "args": 1}):
        assert read(junk) is None, junk


# -- real widgets hold and send exactly these keys -----------------------------------------------
def _check(value: Any, annotation: str, where: str) -> int:
    """Asserts ``value`` has the keys of the TypedDicts ``annotation`` names, recursively; counts the dicts checked."""
    annotation = (
        annotation.removeprefix("NotRequired[").removesuffix("]") if "NotRequired[" in annotation else annotation
    )
    if annotation.startswith("list[") and isinstance(value, list):
        return sum(_check(item, annotation[5:-1], f"{where}[]") for item in value)
    typed = [TYPED_DICTS[n] for n in re.findall(r"\w+", annotation) if n in TYPED_DICTS]
    if not typed or value is None:
        return 0
    assert isinstance(value, dict), where
    keys = _annotations(typed[0])
    required = {k for k, v in keys.items() if not v.startswith("NotRequired[")}
    assert required <= set(value) <= set(keys), f"{where}: {sorted(value)} is not {typed[0].__name__} {sorted(keys)}"
    return 1 + sum(_check(value[k], keys[k], f"{where}.{k}") for k in value)


class Wire:
    """The custom messages a widget sends its front end, read where ipywidgets hands them to the comm."""

    def __init__(self, widget: Any) -> None:
        self.widget = widget
        self.sent: list[dict[str, Any]] = []
        publish = widget.comm.publish_msg

        def record(msg_type: str, data: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(data, dict) and data.get("method") == "custom":
                self.sent.append(data["content"])
            return publish(msg_type, data, *args, **kwargs)

        widget.comm.publish_msg = record

    def ready(self) -> None:
        content = {"type": "ready"}
        self.widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


@pytest.fixture
def run(tmp_path: Path) -> Iterator[lh.Run]:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\0" * 64)
    run = lh.init(
        "shapes",
        store=str(tmp_path / "store"),
        config={"lr": 0.1, "layers": [1, 2]},
        tunables={"lr": 0.1},
        flush_interval=3600,
        capture_console=True,
    )
    for step in range(10):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.checkpoint(str(weights), step=5)
    run.flush()
    yield run
    run.finish()


def test_real_widgets_hold_and_send_exactly_these_keys(run: lh.Run) -> None:
    lh.Api(run.store).run(run.id).set_tunables(lr=0.05)  # a pending change: the Details tab lists it
    by_message = {
        ("RunChart", "snapshot"): "ChartSnapshot",
        ("RunChart", "insert"): "ChartInsert",
        ("CompareChart", "snapshot"): "CompareSnapshot",
        ("RunLogs", "reset"): "ResetMessage",
        ("RunLogs", "append"): "AppendMessage",
    }
    table = RunsTable(run.project, store=run.store)
    table.select([run.id])
    widgets = [
        ResumePicker(run.id, store=run.store, interval=3600),
        RunDetails(run.id, store=run.store, interval=3600),
        RunLogs(run.id, store=run.store, interval=3600),
        EvaluationTable(run.id, store=run.store, interval=3600),
        RunChart(run.id, store=run.store, interval=3600),
        MediaPanel(run.id, store=run.store, interval=3600),
        table.table,
        table.compare,
    ]
    wires = [Wire(w) for w in widgets]
    try:
        for wire in wires:
            wire.ready()
        print("printed for the Logs tab")
        for step in range(10, 15):
            run.log({"loss": 1.0}, step=step)
        run.flush()
        checked = 0
        sent = set()
        for widget, wire in zip(widgets, wires, strict=True):
            widget.refresh()
            # anywidget subclasses each instance's class (for its ESM): match by isinstance
            kind, traits, _ = next(entry for entry in WIDGETS if isinstance(widget, entry[0]))
            name = kind.__name__
            for trait in widget.trait_names(sync=True):
                if trait in TYPED_DICTS[traits].__annotations__:
                    checked += _check(
                        getattr(widget, trait), _annotations(TYPED_DICTS[traits])[trait], f"{name}.{trait}"
                    )
            assert wire.sent[0] == {"type": "live", "static": [widget.model_id]}
            for message in wire.sent[1:]:
                kind = by_message[(name, message["type"])]
                checked += _check(message, kind, f"{name} {message['type']}")
                sent.add(kind)
        assert sent >= {"ChartSnapshot", "ChartInsert", "CompareSnapshot", "ResetMessage"}, sent
        assert checked > 20
    finally:
        for widget in widgets[:6]:
            widget.close()
        table.close()
