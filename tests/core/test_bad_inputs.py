"""Bad inputs to every public entry point: a LaunchHelmError that names the value, and nothing stored changes.

What a user would notice if this failed: ``except launchhelm.LaunchHelmError``
letting a plain ``ValueError`` through, a message that does not say which
value was wrong, or a refused call that still wrote to the store (a run
created, a tunable changed, a metric logged).

One store is built per module: a resumable run with metrics, tunables, a
checkpoint and its queued evaluation, a closed run of another project, and a
live ``Run`` and ``TorchRun`` with long heartbeat intervals (so nothing is
rewritten in the background). Every bad call is checked against a snapshot
of every byte in that store.
"""

from __future__ import annotations

import hashlib
import math
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lhtest import wait_for_helpers

import launchhelm as lh
import launchhelm.torch as lht
from launchhelm._cli import main as cli_main

# No background rewrites while the module runs: heartbeats only at start.
QUIET = {"heartbeat_interval": 3000.0, "heartbeat_timeout": 6000.0, "flush_interval": 3000.0, "system_metrics": False}
RESERVED = ["step", "time", "attempt", "abandoned", "run"]
HYPOTHESIS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@dataclass
class World:
    store: str
    root: Path
    api: lh.Api
    run_id: str  # resumable, with metrics, tunables lr/note, a checkpoint and its evaluation
    checkpoint_id: str
    evaluation_id: str
    other_id: str  # closed, in project "q"
    live: lh.Run
    torch_run: lht.TorchRun
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer


def snapshot(root: Path) -> dict[str, str]:
    """Every stored object and its digest."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("bad-inputs")
    root = base / "store"
    store = str(root)
    api = lh.Api(store)
    api.project("p").evaluate_every_checkpoint(True)
    run = lh.init("p", config={"lr": 0.1}, tunables={"lr": 0.1, "note": "x"}, store=store, **QUIET)
    for step in range(5):
        run.global_step = step
        run.log({"loss": 1.0 / (step + 1)})
    payload = base / "weights.bin"
    payload.write_bytes(b"weights")
    checkpoint_id = run.checkpoint(payload)
    run.finish(close_run=False)
    (evaluation,) = api.run(run.id).evaluations()
    other = lh.init("q", store=store, **QUIET)
    other.log({"x": 1.0})
    other.finish()
    live = lh.init("p", store=store, **QUIET)
    live.log({"loss": 1.0})
    live.flush()
    torch_run = lht.init("p", store=store, **QUIET)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch_run.watch(model, optimizer)
    torch_run.save_checkpoint()
    torch_run.flush()
    yield World(
        store,
        root,
        api,
        run.id,
        checkpoint_id,
        evaluation.id,
        other.id,
        live,
        torch_run,
        model,
        optimizer,
    )
    live.finish()
    torch_run.finish()


def assert_refused(
    world: World,
    call: Callable[[], Any],
    builtin: type[BaseException] | tuple[type[BaseException], ...],
    names: str | None,
) -> lh.LaunchHelmError:
    """``call`` raises a LaunchHelmError that is also ``builtin``, naming ``names``; the store is unchanged."""
    wait_for_helpers()  # a finished run's helper adds it to the runs index: not this call's doing
    before = snapshot(world.root)
    with pytest.raises(lh.LaunchHelmError) as info:
        call()
    error = info.value
    assert isinstance(error, builtin), f"{type(error).__name__} is not a {builtin}"
    if names is not None:
        assert names in str(error), f"{str(error)!r} does not name {names!r}"
    world.live.flush()
    world.torch_run.flush()
    assert snapshot(world.root) == before, "a refused call changed the store"
    return error


def _set_step(run: lh.Run, value: Any) -> None:
    run.global_step = value


# (label, call, the built-in it must also be, text the message must contain)
LISTED: list[tuple[str, Callable[[World], Any], type[BaseException], str]] = [
    ('init("../x")', lambda w: lh.init("../x", store=w.store), ValueError, "'../x'"),
    ("init(project=5)", lambda w: lh.init(5, store=w.store), ValueError, "5"),
    ('init(name="  ")', lambda w: lh.init("p", name="  ", store=w.store), ValueError, "'  '"),
    ("init(config=[1])", lambda w: lh.init("p", config=[1], store=w.store), TypeError, "list"),
    ("init(tunables=5)", lambda w: lh.init("p", tunables=5, store=w.store), TypeError, "int"),
    ("init(config={'x': nan})", lambda w: lh.init("p", config={"x": math.nan}, store=w.store), ValueError, "nan"),
    ("init(config={'x': object()})", lambda w: lh.init("p", config={"x": object()}, store=w.store), TypeError, "x"),
    ("init(config={1: 2})", lambda w: lh.init("p", config={1: 2}, store=w.store), TypeError, "1"),
    (
        'resume="no-such-run-xyz"',
        lambda w: lh.init("p", resume="no-such-run-xyz", store=w.store),
        ValueError,
        "'no-such-run-xyz'",
    ),
    ("resume=<unknown id>", lambda w: lh.init("p", resume="zzzz9999", store=w.store), KeyError, "'zzzz9999'"),
    ("resume=5", lambda w: lh.init("p", resume=5, store=w.store), TypeError, "5"),
    ("resume=<run of another project>", lambda w: lh.init("p", resume=w.other_id, store=w.store), ValueError, "'q'"),
    ("resume=<closed run>", lambda w: lh.init("q", resume=w.other_id, store=w.store), RuntimeError, "closed"),
    (
        'takeover="no"',
        lambda w: lh.init("p", resume=w.run_id, takeover="no", store=w.store),
        TypeError,
        "'no'",
    ),
    ("init(flush_interval=0)", lambda w: lh.init("p", flush_interval=0, store=w.store), ValueError, "0"),
    (
        "init(flush_intervall=2.0)",
        lambda w: lh.init("p", flush_intervall=2.0, store=w.store),
        TypeError,
        "did you mean 'flush_interval'",
    ),
    (
        "lht.init(heartbeat_intervall=5.0)",
        lambda w: lht.init("p", heartbeat_intervall=5.0, store=w.store),
        TypeError,
        "did you mean 'heartbeat_interval'",
    ),
    (
        "init(heartbeat_interval='x')",
        lambda w: lh.init("p", heartbeat_interval="x", store=w.store),
        ValueError,
        "'x'",
    ),
    ("Api(store=5)", lambda w: lh.Api(store=5), TypeError, "5"),
    ('Api(store="")', lambda w: lh.Api(store=""), ValueError, "empty"),
    ('api.run("ABC")', lambda w: w.api.run("ABC"), ValueError, "'ABC'"),
    ("api.run(<unknown>)", lambda w: w.api.run("abcd1234"), KeyError, "'abcd1234'"),
    ('api.runs("../x")', lambda w: w.api.runs("../x"), ValueError, "'../x'"),
    ('api.project("a b")', lambda w: w.api.project("a b"), ValueError, "'a b'"),
    ('api.evaluation("nope")', lambda w: w.api.evaluation("nope"), ValueError, "'nope'"),
    (
        "api.evaluation(<unknown>)",
        lambda w: w.api.evaluation(f"{w.other_id}-{w.checkpoint_id}"),
        KeyError,
        "no evaluation",
    ),
    ('history(duplicates="first")', lambda w: w.api.run(w.run_id).history(duplicates="first"), ValueError, "'first'"),
    ("history(keys=5)", lambda w: w.api.run(w.run_id).history(keys=5), TypeError, "5"),
    ("history(keys=[1])", lambda w: w.api.run(w.run_id).history(keys=[1]), TypeError, "[1]"),
    ("set_tunables(nope=1)", lambda w: w.api.run(w.run_id).set_tunables(nope=1), KeyError, "'nope'"),
    ('set_tunables(lr="x")', lambda w: w.api.run(w.run_id).set_tunables(lr="x"), TypeError, "'x'"),
    ("set_tunables(lr=nan)", lambda w: w.api.run(w.run_id).set_tunables(lr=math.nan), ValueError, "nan"),
    ("set_tunables()", lambda w: w.api.run(w.run_id).set_tunables(), ValueError, "set_tunables"),
    ("set_tunables(note=[object()])", lambda w: w.api.run(w.run_id).set_tunables(note=[object()]), TypeError, "note"),
    ('control("explode")', lambda w: w.api.run(w.run_id).control("explode"), ValueError, "'explode'"),
    ('choose_for_resume("nope")', lambda w: w.api.run(w.run_id).choose_for_resume("nope"), RuntimeError, "'nope'"),
    ('RunHandle.evaluate("nope")', lambda w: w.api.run(w.run_id).evaluate("nope"), RuntimeError, "'nope'"),
    (
        'evaluate_every_checkpoint("yes")',
        lambda w: w.api.project("p").evaluate_every_checkpoint("yes"),
        TypeError,
        "'yes'",
    ),
    ('evaluations(state="bogus")', lambda w: w.api.project("p").evaluations(state="bogus"), ValueError, "'bogus'"),
    ("EvaluationHandle.retry() of a queued one", lambda w: w.api.evaluation(w.evaluation_id).retry(), RuntimeError, ""),
    ("log({1: 1.0})", lambda w: w.live.log({1: 1.0}), TypeError, "1"),
    ('log({"k": "x"})', lambda w: w.live.log({"k": "x"}), TypeError, "'k'"),
    ('log({"k": [1, 2]})', lambda w: w.live.log({"k": [1, 2]}), TypeError, "'k'"),
    ('log({"k": tensor([1, 2])})', lambda w: w.live.log({"k": torch.tensor([1.0, 2.0])}), TypeError, "'k'"),
    ('log({"ok": 1, "k": None})', lambda w: w.live.log({"ok": 1.0, "k": None}), TypeError, "'k'"),
    ('log({"": 1})', lambda w: w.live.log({"": 1.0}), ValueError, "empty"),
    ('log({"a//b": 1})', lambda w: w.live.log({"a//b": 1.0}), ValueError, "'a//b'"),
    ('log({"a\\n": 1})', lambda w: w.live.log({"a\n": 1.0}), ValueError, "'a\\n'"),
    ("log([1])", lambda w: w.live.log([1]), TypeError, "list"),
    ("log(step=-1)", lambda w: w.live.log({"loss": 1.0}, step=-1), ValueError, "-1"),
    ('log(step="3")', lambda w: w.live.log({"loss": 1.0}, step="3"), TypeError, "'3'"),
    *[
        (f'log({{"{name}": 1}})', lambda w, name=name: w.live.log({name: 1.0}), ValueError, f"'{name}'")
        for name in RESERVED
    ],
    ('global_step = "x"', lambda w: _set_step(w.live, "x"), TypeError, "'x'"),
    ("global_step = 1.5", lambda w: _set_step(w.live, 1.5), TypeError, "1.5"),
    ("global_step = -2", lambda w: _set_step(w.live, -2), ValueError, "-2"),
    ('run.checkpoint("/nonexistent")', lambda w: w.live.checkpoint("/nonexistent"), FileNotFoundError, "/nonexistent"),
    ("run.checkpoint(<empty folder>)", lambda w: w.live.checkpoint(_empty_folder(w)), ValueError, "empty"),
    ("run.checkpoint(5)", lambda w: w.live.checkpoint(5), TypeError, "5"),
    ('finish(close_run="no")', lambda w: w.live.finish(close_run="no"), TypeError, "'no'"),
    ('tr.finish(close_run="no")', lambda w: w.torch_run.finish(close_run="no"), TypeError, "'no'"),
    (
        'EvaluationHandle.wait(timeout="x")',
        lambda w: w.api.evaluation(w.evaluation_id).wait(timeout="x"),
        ValueError,
        "'x'",
    ),
    ("on_rewind(3)", lambda w: w.live.on_rewind(3), TypeError, "int"),
    ("on_tunables_change(3)", lambda w: w.live.on_tunables_change(3), TypeError, "int"),
    ("tr.watch(opt, model)", lambda w: w.torch_run.watch(w.optimizer, w.model), TypeError, "SGD"),
    (
        "tr.watch(model, opt, scheduler=5)",
        lambda w: w.torch_run.watch(w.model, w.optimizer, scheduler=5),
        TypeError,
        "int",
    ),
    ("tr.load_checkpoint(123)", lambda w: w.torch_run.load_checkpoint(123), TypeError, "123"),
    (
        "tr.save_checkpoint(extra=object())",
        lambda w: w.torch_run.save_checkpoint(extra=object()),
        RuntimeError,
        "extra",
    ),
    ("evaluate(project=5)", lambda w: lh.evaluate(project=5), ValueError, "5"),
    ("evaluate(...)(5)", lambda w: lh.evaluate(project="p", store=w.store)(5), TypeError, "int"),
    (
        "evaluate(lease_seconds=0)",
        lambda w: lh.evaluate(project="p", store=w.store, lease_seconds=0)(_score),
        ValueError,
        "0",
    ),
    ('evaluate(name="")', lambda w: lh.evaluate(project="p", store=w.store, name="")(_score), ValueError, "''"),
    ("serve(max_evaluations=0)", lambda w: _worker(w).serve(max_evaluations=0), ValueError, "0"),
    ('serve(max_evaluations="x")', lambda w: _worker(w).serve(max_evaluations="x"), ValueError, "'x'"),
    ("serve(poll_interval=-1)", lambda w: _worker(w).serve(poll_interval=-1), ValueError, "-1"),
]


def _score(ctx: lh.EvaluationContext) -> dict[str, float]:
    return {"accuracy": 1.0}


def _worker(world: World) -> lh.EvaluationWorker:
    return lh.evaluate(project="p", store=world.store)(_score)


def _empty_folder(world: World) -> Path:
    folder = world.root.parent / "empty-folder"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.mark.parametrize(("label", "call", "builtin", "names"), LISTED, ids=[case[0] for case in LISTED])
def test_listed_bad_input_raises_a_launchhelm_error_naming_it(
    world: World, label: str, call: Callable[[World], Any], builtin: type[BaseException], names: str
) -> None:
    assert_refused(world, lambda: call(world), builtin, names or None)


def test_the_listed_inputs_leave_every_run_readable(world: World) -> None:
    # the refused calls above stored nothing: the runs read back as they were written
    frame = world.api.run(world.run_id).history()
    assert list(frame["loss"]) == [1.0 / (s + 1) for s in range(5)]
    assert [c.id for c in world.api.run(world.run_id).checkpoints()] == [world.checkpoint_id]
    assert world.api.run(world.run_id).tunables == {"lr": 0.1, "note": "x"}
    assert set(world.api.runs("p")["id"]) == {world.run_id, world.live.id, world.torch_run.id}


# -- widgets (their Python constructors) ---------------------------------------------
def _widget_cases() -> list[tuple[str, Callable[[World], Any], type[BaseException], str]]:
    from launchhelm import widgets

    return [
        ("RunPanel(5)", lambda w: widgets.RunPanel(5), TypeError, "5"),
        ("RunChart(5)", lambda w: widgets.RunChart(5), TypeError, "5"),
        ("ResumePicker(5)", lambda w: widgets.ResumePicker(5), TypeError, "5"),
        ("EvaluationTable(5)", lambda w: widgets.EvaluationTable(5), TypeError, "5"),
        ('RunPanel("ABC")', lambda w: widgets.RunPanel("ABC", store=w.store), ValueError, "'ABC'"),
        ("RunChart(<unknown>)", lambda w: widgets.RunChart("abcd1234", store=w.store), KeyError, "'abcd1234'"),
        (
            "RunChart(max_points=2)",
            lambda w: widgets.RunChart(w.run_id, store=w.store, max_points=2),
            ValueError,
            "2",
        ),
    ]


def test_widget_constructors_refuse_bad_inputs(world: World) -> None:
    for label, call, builtin, names in _widget_cases():
        try:
            assert_refused(world, lambda call=call: call(world), builtin, names)
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from None


def test_a_widget_whose_front_end_is_missing_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from launchhelm.widgets import _base

    monkeypatch.setattr(_base, "STATIC", Path("/nonexistent-launchhelm-static"))
    with pytest.raises(lh.PathNotFoundError) as info:
        _base.static_file("chart.js")
    assert isinstance(info.value, FileNotFoundError)
    assert "/nonexistent-launchhelm-static/chart.js" in str(info.value)
    assert "npm run build" in str(info.value)


# -- the magic ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "names"),
    [("show ABC", "'ABC'"), ("runs ../x", "'../x'"), ("chart abcd1234", "'abcd1234'"), ("resume ZZ", "'ZZ'")],
)
def test_the_magic_reports_bad_inputs_in_one_line(world: World, line: str, names: str) -> None:
    # IPython shows a UsageError as one line without a traceback, so the magic
    # raises that; the LaunchHelmError it reports stays attached as its context
    from IPython.core.error import UsageError

    from launchhelm._ipython import launchhelm_magic

    before = snapshot(world.root)
    with pytest.raises(UsageError) as info:
        launchhelm_magic(f"{line} --store {world.store}")
    assert names in str(info.value)
    assert isinstance(info.value.__context__, lh.LaunchHelmError)
    assert snapshot(world.root) == before


# -- the command line --------------------------------------------------------------
def _cli_cases(w: World) -> list[tuple[list[str], str]]:
    return [
        (["show", "ABC"], "'ABC'"),
        (["show", "abcd1234"], "'abcd1234'"),
        (["runs", "../x"], "'../x'"),
        (["tune", w.run_id, "nope=1"], "'nope'"),
        (["tune", w.run_id, "lr"], "'lr'"),
        (["tune", w.run_id, 'lr="x"'], "'x'"),
        (["gc", "--older-than", "soon"], "'soon'"),
        (["gc", "--keep-last", "-1"], "-1"),
        (["evaluate", "nomodule"], "'nomodule'"),
        (["evaluate", "/nonexistent/worker.py:score"], "/nonexistent/worker.py"),
        (["policy", "evaluation", "--store", "ftp://host/x"], "'ftp://host/x'"),
    ]


def test_the_command_line_reports_bad_inputs_in_one_line(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    wait_for_helpers()
    for argv, names in _cli_cases(world):
        before = snapshot(world.root)
        code = cli_main(["--store", world.store, *argv])
        err = capsys.readouterr().err
        assert code == 2, f"{argv}: exit {code}"
        assert err.startswith("launchhelm: error: ") and err.count("\n") == 1, f"{argv}: {err!r}"
        assert names in err, f"{argv}: {err!r} does not name {names!r}"
        assert snapshot(world.root) == before, f"{argv} changed the store"


# -- generated inputs ----------------------------------------------------------------
_PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RUN_ID_RE = re.compile(r"^[a-z0-9]{4,64}$")
#: Anything but a real number.
NOT_A_NUMBER = st.one_of(
    st.text(max_size=8),
    st.none(),
    st.lists(st.floats(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.complex_numbers().filter(lambda c: c.imag != 0),
    st.binary(max_size=4),
    st.builds(object),
)
#: Anything but a non-negative integer (bools count as not one).
NOT_A_STEP = st.one_of(
    st.integers(max_value=-1),
    st.floats(),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


def _bad_key() -> st.SearchStrategy[object]:
    return st.one_of(
        st.integers(),
        st.floats(allow_nan=False),
        st.none(),
        st.tuples(st.text(max_size=3)),
        st.sampled_from(RESERVED),
        st.text(max_size=10).map(lambda s: s + "\x00"),
        st.text(alphabet=string.ascii_letters, max_size=5).map(lambda s: s + "//x"),
        st.text(alphabet=string.ascii_letters, min_size=1, max_size=5).map(lambda s: f"{s}/.."),
        st.just(""),
    )


def _named(error: BaseException, value: object) -> bool:
    return repr(value)[:40] in str(error) or (isinstance(value, str) and value[:40] in str(error))


@HYPOTHESIS
@given(key=_bad_key())
@pytest.mark.slow
def test_generated_bad_metric_keys_are_refused_naming_them(world: World, key: object) -> None:
    error = assert_refused(world, lambda: world.live.log({key: 1.0}), (TypeError, ValueError), None)
    assert key == "" or _named(error, key), f"{error} does not name {key!r}"


@HYPOTHESIS
@given(value=NOT_A_NUMBER)
@pytest.mark.slow
def test_generated_bad_metric_values_are_refused_naming_the_key(world: World, value: object) -> None:
    assert_refused(world, lambda: world.live.log({"loss": 1.0, "bad/value": value}), TypeError, "'bad/value'")


@HYPOTHESIS
@given(step=NOT_A_STEP)
@pytest.mark.slow
def test_generated_bad_steps_are_refused_naming_them(world: World, step: object) -> None:
    error = assert_refused(world, lambda: world.live.log({"loss": 1.0}, step=step), (TypeError, ValueError), None)
    assert _named(error, step) or _named(error, int(step) if isinstance(step, int) else step)
    assert_refused(world, lambda: _set_step(world.live, step), (TypeError, ValueError), None)


@HYPOTHESIS
@given(
    name=st.one_of(st.text(max_size=20), st.integers(), st.none()).filter(
        lambda n: n is not None and not (isinstance(n, str) and _PROJECT_RE.fullmatch(n))
    )
)
@pytest.mark.slow
def test_generated_bad_project_names_are_refused_everywhere(world: World, name: object) -> None:
    for call in (
        lambda: lh.init(name, store=world.store),
        lambda: lht.init(name, store=world.store),
        lambda: world.api.runs(name),
        lambda: world.api.project(name),
        lambda: lh.evaluate(project=name),
    ):
        error = assert_refused(world, call, ValueError, None)
        assert _named(error, name), f"{error} does not name {name!r}"


@HYPOTHESIS
@given(run_id=st.text(max_size=70))
@pytest.mark.slow
def test_generated_run_ids_that_are_not_stored_are_refused(world: World, run_id: str) -> None:
    builtin = KeyError if _RUN_ID_RE.fullmatch(run_id) else ValueError
    for call in (lambda: world.api.run(run_id), lambda: lh.init("p", resume=run_id, store=world.store)):
        error = assert_refused(world, call, builtin, None)
        assert _named(error, run_id), f"{error} does not name {run_id!r}"


@HYPOTHESIS
@given(
    action=st.text(max_size=12).filter(lambda a: a not in ("pause", "resume", "stop", "checkpoint")),
    duplicates=st.text(max_size=8).filter(lambda d: d not in ("all", "last")),
    state=st.text(max_size=8).filter(lambda s: s not in ("queued", "running", "done", "failed")),
)
@pytest.mark.slow
def test_generated_bad_options_are_refused_naming_them(world: World, action: str, duplicates: str, state: str) -> None:
    handle = world.api.run(world.run_id)
    for call, value in (
        (lambda: handle.control(action), action),
        (lambda: handle.history(duplicates=duplicates), duplicates),
        (lambda: world.api.project("p").evaluations(state=state), state),
    ):
        error = assert_refused(world, call, ValueError, None)
        assert _named(error, value), f"{error} does not name {value!r}"


@HYPOTHESIS
@given(
    name=st.text(max_size=10).filter(lambda n: n not in ("lr", "note")),
    value=st.one_of(st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2), st.booleans()),
)
@pytest.mark.slow
def test_generated_bad_tunable_changes_are_refused(world: World, name: str, value: object) -> None:
    handle = world.api.run(world.run_id)
    error = assert_refused(world, lambda: handle.set_tunables(**{name: 0.5}), KeyError, None)
    assert _named(error, name)
    # lr is a float: any other kind is refused, naming the value
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        error = assert_refused(world, lambda: handle.set_tunables(lr=value), (TypeError, ValueError), None)
        assert _named(error, value) or "lr" in str(error)
    assert handle.tunables == {"lr": 0.1, "note": "x"}


@HYPOTHESIS
@given(flag=st.one_of(st.text(max_size=4), st.integers(), st.none(), st.floats()))
@pytest.mark.slow
def test_generated_takeover_values_other_than_a_bool_are_refused(world: World, flag: object) -> None:
    error = assert_refused(
        world,
        lambda: lh.init("p", resume=world.run_id, takeover=flag, store=world.store),
        TypeError,
        None,
    )
    assert _named(error, flag)


# -- reserved metric names -----------------------------------------------------------
def test_reserved_metric_names_are_refused_and_the_run_stays_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a metric named like a history column used to break history() and `launchhelm show` for good
    store = str(tmp_path / "store")
    run = lh.init("reserved", store=store)
    run.global_step = 1
    run.log({"loss": 0.5})
    for name in RESERVED:
        with pytest.raises(lh.InvalidMetricError, match=f"'{name}' is reserved") as info:
            run.log({"loss": 9.0, name: 1.0})  # the whole call is refused, loss too
        assert isinstance(info.value, ValueError)
        assert f"train/{name}" in str(info.value)  # what to log instead
    run.log({"train/step": 1.0, "data/time": 2.0, "abandoned/count": 3.0})  # namespaced: fine
    run.finish()
    frame = lh.Api(store).run(run.id).history()
    assert list(frame.columns) == [
        "step",
        "attempt",
        "time",
        "abandoned",
        "loss",
        "train/step",
        "data/time",
        "abandoned/count",
    ]
    assert frame["loss"].tolist() == [0.5]
    assert cli_main(["--store", store, "show", run.id]) == 0
    assert "loss" in capsys.readouterr().out


# -- the tree itself -----------------------------------------------------------------
def test_every_error_class_is_in_the_drawn_tree_and_inherits_a_builtin() -> None:
    from launchhelm import _exceptions

    for name in _exceptions.__all__:
        error = getattr(_exceptions, name)
        if name in ("LaunchHelmError", "RunStopped", "RunPreempted"):  # the root; SystemExits by design
            continue
        assert issubclass(error, lh.LaunchHelmError), name
        assert name in (_exceptions.__doc__ or ""), f"{name} is missing from the tree in _exceptions' docstring"
        builtins = [c for c in error.__mro__ if c.__module__ == "builtins" and c not in (Exception, BaseException)]
        assert builtins, f"{name} inherits no built-in a caller would catch"
    assert str(lh.TunableNotFoundError("no tunable 'x'")) == "no tunable 'x'"  # not KeyError's repr
    assert str(lh.PathNotFoundError("no file", path="/x")) == "no file"


#: Built-in raises left on purpose, each caught and converted before it reaches a caller.
ALLOWED_BUILTIN_RAISES = {
    "launchhelm/storage/_backends.py": ("FileExistsError",),  # turned into AlreadyExistsError by the store
    # short reads (retried, then a StorageError); writing to a closed writer is a bug, not an input
    "launchhelm/storage/_transfer.py": ("OSError", "ValueError"),
    "launchhelm/__init__.py": ("AttributeError",),  # module __getattr__ must raise it
    "launchhelm/widgets/__init__.py": ("AttributeError",),
}


def test_no_bad_input_raises_a_bare_builtin() -> None:
    # a guard for new code: argument errors raise InvalidArgumentError / InvalidTypeError & co.
    pattern = re.compile(r"raise (ValueError|TypeError|KeyError|FileNotFoundError|LookupError|IndexError|OSError|"
                         r"RuntimeError|AttributeError|FileExistsError)\(")  # fmt: skip
    root = Path(lh.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = f"launchhelm/{path.relative_to(root).as_posix()}"
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = pattern.search(line)
            if m and m[1] not in ALLOWED_BUILTIN_RAISES.get(rel, ()):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == []
