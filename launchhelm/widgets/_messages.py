"""What the kernel and the widgets' front ends say to each other, typed.

Per widget: its synced traits (``...Traits``), the dict its ``state`` trait
holds (``...State``), and the custom messages each way, as unions tagged by
``type`` (the names below, spelled once). ``js/src/messages.js`` holds the
same shapes as JSDoc typedefs for ``tsc``; ``tests/widgets/test_widget_messages.py``
checks that both name the same keys, that the traits are the widgets' own and
that the widgets send exactly these keys.

A message from a front end is checked by :func:`read_message` before a
widget acts on it: anything else on the comm is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal, TypedDict, TypeVar, cast

import traitlets

from launchhelm._types import JSONValue

if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import NotRequired

__all__ = [
    "MSG_ACTION",
    "MSG_APPEND",
    "MSG_FETCH",
    "MSG_HISTOGRAMS",
    "MSG_INSERT",
    "MSG_LIVE",
    "MSG_PICTURES",
    "MSG_READY",
    "MSG_RESET",
    "MSG_SNAPSHOT",
    "MSG_TABLE",
    "MSG_ZOOM",
    "read_fetch",
    "read_message",
    "synced_dict",
]

#: A value as JSON carries it (config and tunable values, diff cells).
Json: TypeAlias = JSONValue
#: A Vega-Lite spec, built in the kernel (``build_spec``), embedded by the front end.
VegaLiteSpec: TypeAlias = dict[str, JSONValue]

# -- message types, spelled once (the Literal and its value are checked together by mypy) --------
Ready = Literal["ready"]
Action = Literal["action"]
Zoom = Literal["zoom"]
Live = Literal["live"]
Snapshot = Literal["snapshot"]
Insert = Literal["insert"]
Reset = Literal["reset"]
Append = Literal["append"]
Fetch = Literal["fetch"]
Pictures = Literal["pictures"]
TableMsg = Literal["table"]
Histograms = Literal["histograms"]

#: Front end -> kernel: it listens now (after each embed); the kernel answers ``live``, then its snapshot.
MSG_READY: Final[Ready] = "ready"
#: Front end -> kernel: a button (``name``, ``args``: :class:`ActionArgs`).
MSG_ACTION: Final[Action] = "action"
#: Front end -> kernel: the chart's zoomed step range, or None for all of it.
MSG_ZOOM: Final[Zoom] = "zoom"
#: Kernel -> front end: hide the saved pictures of these models.
MSG_LIVE: Final[Live] = "live"
#: Kernel -> front end: replace the chart's datasets.
MSG_SNAPSHOT: Final[Snapshot] = "snapshot"
#: Kernel -> front end: append rows to the chart's points.
MSG_INSERT: Final[Insert] = "insert"
#: Kernel -> front end: the Logs tab's whole text.
MSG_RESET: Final[Reset] = "reset"
#: Kernel -> front end: what the run printed since.
MSG_APPEND: Final[Append] = "append"
#: Front end -> kernel: the Media tab wants pictures, a table or the histograms (:class:`FetchMessage`).
MSG_FETCH: Final[Fetch] = "fetch"
#: Kernel -> front end: pictures (thumbnails or one full image), their bytes in the message's buffers.
MSG_PICTURES: Final[Pictures] = "pictures"
#: Kernel -> front end: one table's cells, its image cells' thumbnails in the buffers.
MSG_TABLE: Final[TableMsg] = "table"
#: Kernel -> front end: the histograms over steps, as one Vega-Lite spec.
MSG_HISTOGRAMS: Final[Histograms] = "histograms"


# -- shared pieces ----------------------------------------------------------------------------
class RunName(TypedDict):
    id: str
    name: str


class RunRef(RunName):
    project: str


class LiveTraits(TypedDict):
    """Every live widget's: a sentence about the last failure ("" when fine)."""

    error: str


# -- ResumePicker -------------------------------------------------------------------------------
class PickerCheckpoint(TypedDict):
    id: str
    step: int
    saved_at: str
    size: str
    #: shard objects of a sharded (/3) checkpoint; 0 for others
    shards: int
    #: "4 shards, saved on 2 ranks" for a sharded checkpoint; "" for others
    layout: str
    steps_to_redo: int
    before_last_control_change: bool
    latest: bool
    chosen: bool


class PickerState(TypedDict):
    run: RunRef
    status: str
    #: each launch of the run, one line each (none for a run of one plain session)
    attempts: list[str]
    #: why relaunches are refused ("" when they are not); choosing a checkpoint clears it
    restart_loop: str
    sentence: str
    step: int
    #: ``{text as the kernel wrote it: epoch seconds}`` for each time in the text: the browser rewrites them.
    times: dict[str, float]
    can_choose: bool
    restores: str
    #: the confirmation of this picker's "Choose", only while that choice is pending
    confirmation: str
    #: a choice made here that is history (used by a resume, replaced, or on a run since closed)
    earlier: str
    checkpoints: list[PickerCheckpoint]


class PickerTraits(LiveTraits):
    state: PickerState


# -- RunDetails, RunLogs ------------------------------------------------------------------------
class DetailsPending(TypedDict):
    seq: int
    what: str
    time: str


class DetailsState(TypedDict):
    run: RunRef
    status: str
    sentence: str
    step: int
    created: str
    last_heartbeat: str
    created_ts: float
    last_heartbeat_ts: float | None
    times: dict[str, float]
    sessions: int
    rewinds: int
    #: one line per attempt (``lh.Attempt.describe``), oldest first; empty for a run of one plain launch
    attempts: list[str]
    control_state: str | None
    config: dict[str, Json]
    tunables: dict[str, Json]
    pending: list[DetailsPending]
    can_control: bool
    can_tune: bool
    actions: list[str]
    rule: bool
    notice: str


class DetailsTraits(LiveTraits):
    #: Which view of ``details.js`` draws it: ``"details"``.
    view: str
    state: DetailsState


class LogsState(TypedDict):
    status: str
    empty: bool
    max_lines: int


class LogsTraits(LiveTraits):
    #: ``"logs"``.
    view: str
    state: LogsState


class ResetMessage(TypedDict):
    type: Reset
    text: str


class AppendMessage(TypedDict):
    type: Append
    text: str


# -- EvaluationTable ----------------------------------------------------------------------------
class EvaluationRow(TypedDict):
    run_id: str
    run_name: str
    checkpoint: str
    step: int
    state: str
    detail: str
    times: dict[str, float]
    took: float | None
    attempts: int
    evaluation_id: str | None
    can_retry: bool
    can_evaluate: bool


class EvaluationsState(TypedDict):
    scope: Literal["run", "project"]
    project: str
    run: RunName | None
    rule: bool
    rows: list[EvaluationRow]
    notice: str


class EvaluationsTraits(LiveTraits):
    state: EvaluationsState


# -- RunChart -----------------------------------------------------------------------------------
class ChartColumns(TypedDict):
    """Rows as columns: ``k`` indexes ``keys``; ``time`` (ms) only when a wall-time panel is drawn."""

    keys: list[str]
    k: list[int]
    step: list[int]
    value: list[float]
    attempt: list[int]
    abandoned: list[bool]
    time: NotRequired[list[float]]


class ChartRewind(TypedDict):
    to_step: int
    reached: int
    attempt: int
    checkpoint: str
    label: str


class ChartSnapshot(TypedDict):
    type: Snapshot
    points: ChartColumns
    rewinds: list[ChartRewind]
    domain: list[float] | None


class ChartInsert(TypedDict):
    type: Insert
    points: ChartColumns


class ChartTraits(LiveTraits):
    spec: VegaLiteSpec
    show_abandoned: bool
    caption: str
    #: When the newest point shown was logged (epoch seconds; 0 before any).
    last_point: float


# -- CompareChart -------------------------------------------------------------------------------
class ShownRun(TypedDict):
    """A compared run in the legend: ``label`` is its name (with its id where two share one)."""

    id: str
    label: str
    color: str
    name: str


class CompareRun(ShownRun):
    status: str
    step: int | None
    created: float | None
    last_heartbeat: float | None
    rewinds: int | None


class CompareDiff(TypedDict):
    key: str
    values: list[Json]


class CompareState(TypedDict):
    project: str
    runs: list[CompareRun]
    diff: list[CompareDiff]


class CompareColumns(TypedDict):
    """Rows as columns: ``r`` indexes ``labels`` (runs), ``k`` indexes ``keys``; ``time`` in ms."""

    labels: list[str]
    keys: list[str]
    r: list[int]
    k: list[int]
    step: list[int]
    time: list[float]
    elapsed: list[float]
    value: list[float]
    raw: list[float]


class CompareRewind(TypedDict):
    run_id: str
    to_step: int
    reached: int
    attempt: int
    time: float | None
    elapsed: float | None
    #: "Resumed from step 64 after reaching 120".
    text: str
    #: The run's legend label.
    label: str


class CompareSnapshot(TypedDict):
    type: Snapshot
    points: CompareColumns
    rewinds: list[CompareRewind]


class CompareTraits(LiveTraits):
    spec: VegaLiteSpec
    state: CompareState
    x_axis: str
    smooth: bool
    smoothing: float
    media: CompareMediaState
    #: the image key the media section shows ("": the first)
    media_key: str
    #: the step its slider is on (-1: the key's newest)
    media_step: int


# -- RunsTable ----------------------------------------------------------------------------------
class TableColumn(TypedDict):
    id: str
    label: str
    kind: str


class TableRow(TypedDict):
    id: str
    name: str
    status: str
    sentence: str
    detail: str
    step: int | None
    created: float | None
    last_heartbeat: float | None
    duration: float | None
    sessions: int | None
    rewinds: int | None
    restarts: int | None
    values: dict[str, Json]


class RunsTableState(TypedDict):
    project: str
    store: str
    columns: list[TableColumn]
    rows: list[TableRow]
    now: float
    picker: bool


class RunsTableTraits(LiveTraits):
    state: RunsTableState
    sort_by: str
    descending: bool
    query: str
    statuses: list[str]
    hidden: list[str]
    selected: list[str]


# -- MediaPanel ---------------------------------------------------------------------------------
class MediaKey(TypedDict):
    """A key the Media tab shows: its kind and every step it was logged at (none left out)."""

    key: str
    kind: str
    steps: list[int]
    #: steps where an abandoned attempt logged it too (redone after a rewind)
    rewound: list[int]


class MediaState(TypedDict):
    run: RunRef
    status: str
    keys: list[MediaKey]
    #: the slider's stops: every step any image or table key was logged at, ascending
    steps: list[int]
    #: "" or why nothing shows ("This run logged no images, tables or histograms yet.")
    empty: str


class MediaTraits(LiveTraits):
    state: MediaState
    #: the step the slider is on (-1: follow the newest)
    step: int


class MediaPicture(TypedDict):
    """One image: where it was logged and which buffer of the message holds its bytes."""

    key: str
    #: the step shown: the slider's, or the key's last step before it when it has none there
    step: int
    attempt: int
    abandoned: bool
    index: int
    caption: str
    width: int
    height: int
    mime: str
    buffer: int


class PicturesMessage(TypedDict):
    type: Pictures
    #: the slider step asked for
    step: int
    #: True: the full image (one), False: thumbnails
    full: bool
    #: keys asked for: a key among them with no picture has nothing logged by ``step``
    keys: list[str]
    pictures: list[MediaPicture]


class TableImageCell(TypedDict):
    """An image cell of a table: its thumbnail in buffer ``buffer`` (a plain cell is a JSON value)."""

    buffer: int
    mime: str
    caption: str


class TableMessage(TypedDict):
    type: TableMsg
    key: str
    #: the step asked for, and the step of the table shown (its last at or before it); -1: none yet
    asked: int
    step: int
    attempt: int
    abandoned: bool
    caption: str
    columns: list[str]
    rows: list[list[Json | TableImageCell]]


class HistogramsMessage(TypedDict):
    type: Histograms
    spec: VegaLiteSpec
    #: per key, how many of its steps the chart shows and how many it has
    shown: dict[str, list[int]]


class FetchMessage(TypedDict):
    """Front end -> kernel: ``what`` is ``"thumbnails"`` (``keys`` at ``step``), ``"image"`` (the full
    picture of ``keys[0]`` at ``step``, ``attempt``, ``index``), ``"table"`` or ``"histograms"``."""

    type: Fetch
    what: str
    step: int
    keys: list[str]
    attempt: int
    index: int
    #: CompareChart's full image: the run it is of
    run: NotRequired[str]


# -- CompareChart's media section ---------------------------------------------------------------
class CompareMediaKey(TypedDict):
    """An image key any compared run logged: every step one of them logged it at, and which runs did."""

    key: str
    steps: list[int]
    runs: list[str]


class CompareMediaState(TypedDict):
    #: [] when none of the runs logged an image (the section stays hidden)
    keys: list[CompareMediaKey]


class CompareRunPictures(TypedDict):
    """One run's pictures of the key at the step (its newest attempt's), in the chart's run order."""

    id: str
    label: str
    color: str
    #: "" or why none shows ("nothing logged at step 7")
    empty: str
    #: an abandoned attempt logged it at this step too (a rewind redid the step)
    redone: bool
    pictures: list[MediaPicture]


class ComparePicturesMessage(TypedDict):
    type: Pictures
    key: str
    step: int
    #: True: one run's full image, False: every run's thumbnails
    full: bool
    runs: list[CompareRunPictures]


# -- messages, both ways ------------------------------------------------------------------------
class LiveMessage(TypedDict):
    type: Live
    static: list[str]


class ReadyMessage(TypedDict):
    type: Ready


class ZoomMessage(TypedDict):
    type: Zoom
    domain: list[float] | None


class ChooseArgs(TypedDict):
    checkpoint_id: str


class RetryArgs(TypedDict):
    evaluation_id: str


class EvaluateArgs(TypedDict):
    checkpoint_id: str
    run_id: NotRequired[str | None]


class SetRuleArgs(TypedDict):
    enabled: bool


class SetTunablesArgs(TypedDict):
    values: dict[str, Json]


class ControlArgs(TypedDict):
    action: str


class ActionArgs(TypedDict):
    """Each button's arguments, by action name (the widgets' ``_actions``)."""

    choose: ChooseArgs
    retry: RetryArgs
    evaluate: EvaluateArgs
    set_rule: SetRuleArgs
    set_tunables: SetTunablesArgs
    control: ControlArgs


class ActionMessage(TypedDict):
    type: Action
    name: str
    args: dict[str, Json]


#: What a front end sends.
#: (The Media tab's ``fetch`` is read apart, by :func:`read_fetch`.)
ToKernel: TypeAlias = ReadyMessage | ActionMessage | ZoomMessage
#: What the kernel sends each front end.
ToChart: TypeAlias = LiveMessage | ChartSnapshot | ChartInsert
ToCompare: TypeAlias = LiveMessage | CompareSnapshot | ComparePicturesMessage
ToLogs: TypeAlias = LiveMessage | ResetMessage | AppendMessage
ToMedia: TypeAlias = LiveMessage | PicturesMessage | TableMessage | HistogramsMessage
ToFrontEnd: TypeAlias = ToChart | ToCompare | ToLogs | ToMedia


def read_message(content: object) -> ToKernel | None:
    """A front end's message as its type says, or None for anything else on the comm.

    A zoom whose domain is not two numbers zooms out (``domain`` None), as
    a reset does.
    """
    if not isinstance(content, dict):
        return None
    kind = content.get("type")
    if kind == MSG_READY:
        return ReadyMessage(type=MSG_READY)
    if kind == MSG_ACTION:
        name, args = content.get("name", ""), content.get("args") or {}
        if not isinstance(name, str) or not isinstance(args, dict):
            return None
        return ActionMessage(type=MSG_ACTION, name=name, args={str(k): v for k, v in args.items()})
    if kind == MSG_ZOOM:
        domain = content.get("domain")
        if not isinstance(domain, list) or len(domain) != 2:
            return ZoomMessage(type=MSG_ZOOM, domain=None)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in domain)
        return ZoomMessage(type=MSG_ZOOM, domain=[float(v) for v in domain] if numbers else None)
    return None


_FETCHES = ("thumbnails", "image", "table", "histograms")
#: Keys one fetch may name (a grid in view holds far fewer).
MAX_FETCH_KEYS = 256


def read_fetch(content: object) -> FetchMessage | None:
    """The Media tab's ``fetch``, checked (kinds, numbers, at most :data:`MAX_FETCH_KEYS` string keys), or None."""
    if not isinstance(content, dict) or content.get("type") != MSG_FETCH:
        return None
    what, keys = content.get("what"), content.get("keys")
    numbers = [content.get(name, -1) for name in ("step", "attempt", "index")]
    if what not in _FETCHES or not isinstance(keys, list) or len(keys) > MAX_FETCH_KEYS:
        return None
    if not all(isinstance(k, str) for k in keys):
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        return None
    step, attempt, index = (int(n) for n in numbers)
    fetch = FetchMessage(
        type=MSG_FETCH, what=str(what), step=step, keys=[str(k) for k in keys], attempt=attempt, index=index
    )
    run = content.get("run")
    if isinstance(run, str):
        fetch["run"] = run
    return fetch


T = TypeVar("T")


def synced_dict(kind: type[T]) -> traitlets.TraitType[T, T]:
    """A ``Dict`` trait synced with the front end, typed as ``kind`` (a TypedDict) for mypy.

    Its value is ``{}`` until the widget's first refresh, which runs in its
    ``__init__``: before any front end can draw it.
    """
    del kind  # for the type checker only
    return cast("traitlets.TraitType[T, T]", traitlets.Dict().tag(sync=True))
