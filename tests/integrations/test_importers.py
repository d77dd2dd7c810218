"""Importing TensorBoard, MLflow and W&B runs: sources made here by the real packages (torch's
SummaryWriter, MLflow with a sqlite store, wandb in offline mode) come out exact (values, steps, names,
config), on local, S3, GCS and Azure stores, importing twice adds nothing, a resumed source keeps both
attempts, and a truncated or corrupt source gives a clear error and no run at all."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lhtest import Terminal, child_env, make_store_url, run_python

import launchhelm as lh
from launchhelm._cli import main as cli_main
from launchhelm.importers import (
    ImportFailedError,
    MissingExtraError,
    SourceReadError,
    import_mlflow,
    import_tensorboard,
    import_wandb,
)


def _all_keys(store: str) -> list[str]:
    api = lh.Api(store)
    return sorted(api.store.list("runs") + api.store.list("projects"))


def _by_name(store: str, project: str) -> dict[str, lh.RunHandle]:
    api = lh.Api(store)
    return {h.name: h for h in (api.run(r) for r in api.run_ids(project))}


# -- TensorBoard ------------------------------------------------------------------------------------
RNG = np.random.default_rng(7)
LOSS = [float(x) for x in RNG.normal(size=120)]  # doubles float32 cannot hold: the import must keep float32's
EXACT = [float(x) for x in RNG.normal(size=30)]
HPARAMS = {"lr": 0.00031, "batch": 64, "optimizer": "adamw", "amp": True}


@pytest.fixture(scope="module")
def tb_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tensorboard", reason="torch's SummaryWriter needs the tensorboard package (dev extra)")
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    root = tmp_path_factory.mktemp("tb") / "logs"
    writer = SummaryWriter(str(root / "mnist"))
    # hyperparameters in the run's own folder, as Lightning's TensorBoardLogger writes them
    for summary in hparams(HPARAMS, {}):
        writer._get_file_writer().add_summary(summary)
    for step, value in enumerate(LOSS[:100]):
        writer.add_scalar("train/loss", value, step, walltime=1_700_000_000.0 + step)
    for step, value in enumerate(EXACT):
        writer.add_scalar("eval/exact", value, step * 10, new_style=True, double_precision=True)
    writer.add_text("notes", "text is not a metric")
    writer.add_histogram("weights", np.arange(10.0), 0)
    writer.add_hparams({"lr": 0.1, "depth": 3}, {"hp/score": 0.75}, run_name="sweep")
    writer.close()
    # the same folder resumed from step 79 by a second process: a new event file, steps 80..99 again
    resumed = SummaryWriter(str(root / "mnist"))
    for step, value in enumerate(LOSS[100:120], start=80):
        resumed.add_scalar("train/loss", value, step, walltime=1_700_001_000.0 + step)
    resumed.close()
    other = SummaryWriter(str(root / "cifar" / "seed1"))
    other.add_scalar("loss", 2.5, 7)
    other.close()
    return root


def test_tensorboard_scalars_steps_names_and_hparams_import_exactly(tb_logdir: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    lines: list[str] = []
    result = import_tensorboard(tb_logdir, "tb", store=store, progress=False, report=lines.append)
    assert len(result.imported) == 3 and not result.skipped
    runs = _by_name(store, "tb")
    assert sorted(runs) == ["cifar/seed1", "mnist", "mnist/sweep"]
    mnist = runs["mnist"]
    # as torch's hparams summary stores them: numbers (bools too) as doubles, strings as strings
    assert mnist.config == {"lr": 0.00031, "batch": 64.0, "optimizer": "adamw", "amp": 1.0}
    assert {k: type(v) for k, v in mnist.config.items()} == {
        "lr": float,
        "batch": float,
        "optimizer": str,
        "amp": float,
    }
    frame = mnist.history(duplicates="all")
    loss = frame.dropna(subset=["train/loss"])
    first = loss[loss["attempt"] == 0]
    assert first["step"].tolist() == list(range(100))
    # float32 as TensorBoard stored it, widened exactly: not the double that was logged
    assert first["train/loss"].tolist() == [float(np.float32(v)) for v in LOSS[:100]]
    assert first["train/loss"].tolist() != LOSS[:100]
    assert first["time"].iloc[3].timestamp() == pytest.approx(1_700_000_003.0, abs=1e-6)
    # the resumed writer went back to step 80: its values are attempt 1, the old ones stay, abandoned
    again = loss[loss["attempt"] == 1]
    assert again["step"].tolist() == list(range(80, 100))
    assert again["train/loss"].tolist() == [float(np.float32(v)) for v in LOSS[100:]]
    assert first[first["step"] >= 80]["abandoned"].all() and not first[first["step"] < 80]["abandoned"].any()
    assert [(r.to_step, r.reached, r.attempt) for r in mnist.rewinds()] == [(79, 290, 1)]
    exact = frame.dropna(subset=["eval/exact"])
    assert exact["step"].tolist() == [s * 10 for s in range(30)] and exact["eval/exact"].tolist() == EXACT
    last = mnist.history(duplicates="last").dropna(subset=["train/loss"])
    assert last["train/loss"].tolist() == [float(np.float32(v)) for v in LOSS[:80] + LOSS[100:]]
    sweep = runs["mnist/sweep"]
    assert sweep.config == {"lr": 0.1, "depth": 3.0}
    assert sweep.history()["hp/score"].tolist() == [float(np.float32(0.75))]
    assert runs["cifar/seed1"].history()[["step", "loss"]].values.tolist() == [[7, 2.5]]
    assert mnist.summary()["status"] == "closed" and mnist.summary()["metric.train/loss"] == float(np.float32(LOSS[-1]))
    left_out = next(line for line in lines if "-> run " + mnist.id in line)
    assert "text summaries ('notes/text_summary'" in left_out and "histogram" not in left_out
    [weights] = mnist.media("weights")  # the histogram is imported as the run's media
    assert (weights.kind, weights.step) == ("histogram", 0)
    assert weights.load()[0].sum() == 10
    assert mnist.events()[0]["imported"]["source"] == "tensorboard"


def test_an_import_into_a_log_reports_a_line_per_run_and_draws_no_bar(
    tb_logdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stderr is no terminal here (pytest's capture, as a batch job's file): no bar's ``\\r`` states, even with
    ``progress=True``; the lines per run are the record."""
    lines: list[str] = []
    import_tensorboard(tb_logdir, "tb", store=str(tmp_path / "store"), progress=True, report=lines.append)
    out, err = capsys.readouterr()
    assert "import tensorboard" not in err and "\r" not in err, err
    assert out == ""  # the lines went to report(), not around a bar
    assert len(lines) == 3 and all(line.startswith("imported ") for line in lines), lines


@pytest.mark.slow
def test_an_import_on_a_terminal_shows_a_bar_below_its_lines(tb_logdir: Path, tmp_path: Path) -> None:
    """``launchhelm import`` under a real pseudo-terminal: a bar counting runs, the line per run printed above
    it. The delay is 0 here: three small runs import faster than the 2 s a bar waits for."""
    code = "import sys; from launchhelm._cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["import", "tensorboard", str(tb_logdir), "--project", "tb", "--store", str(tmp_path / "store")]
    terminal = Terminal([sys.executable, "-c", code, *args], child_env(LAUNCHHELM_PROGRESS_DELAY="0"))
    assert terminal.wait() == 0, terminal.output()
    shown = terminal.output().decode(errors="replace")
    assert [state for state in shown.split("\r") if "import tensorboard" in state and "3/3" in state], shown
    assert shown.count("imported          ") == 3 and "3 run(s) imported" in shown, shown
    # each line is written above the bar: the bar is cleared first, so no line starts in the middle of it
    assert all(line.startswith(("imported", "3 run(s)")) for line in _lines_without_bar(shown)), shown


def _lines_without_bar(shown: str) -> list[str]:
    """What stays on a terminal's lines once each line's \\r redraws are done: the text after the last \\r."""
    kept = [line.rsplit("\r", 1)[-1].strip() for line in shown.split("\r\n")]
    return [line for line in kept if line and not line.startswith("import tensorboard")]


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.slow)])
def test_importing_tensorboard_again_adds_nothing_through_the_command_line(
    tb_logdir: Path, tmp_path: Path, backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_store_url(backend, tmp_path, request)
    assert (
        cli_main(["--store", store, "import", "tensorboard", str(tb_logdir), "--project", "tb", "--no-progress"]) == 0
    )
    out = capsys.readouterr().out
    assert out.count("imported          ") == 3 and "3 run(s) imported, 0 already imported" in out
    before = _all_keys(store)
    ids = lh.Api(store).run_ids("tb")
    # the --store of the subcommand, and the logdir moved elsewhere: the same runs, found by their ids
    moved = tmp_path / "moved"
    shutil.copytree(tb_logdir, moved)
    assert cli_main(["import", "tensorboard", str(moved), "--project", "tb", "--store", store, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("already imported  ") == 3 and "0 run(s) imported, 3 already imported" in out
    assert _all_keys(store) == before
    assert sorted(lh.Api(store).run_ids("tb")) == sorted(ids)


def _imported(store: str, project: str) -> dict[str, tuple[Any, ...]]:
    """Each run of ``project`` as read back: config, every point (all attempts), rewinds, status."""
    out = {}
    for name, handle in _by_name(store, project).items():
        frame = handle.history(duplicates="all")
        frame = frame[sorted(frame.columns)].sort_values(["step", "attempt"], kind="stable").reset_index(drop=True)
        rewinds = [(r.to_step, r.reached, r.attempt) for r in handle.rewinds()]
        out[name] = (handle.config, frame, rewinds, handle.summary()["status"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gcs", "azure"])
def test_tensorboard_imports_exactly_into_gcs_and_azure_stores(
    tb_logdir: Path, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """The same source into a local store and into fake-gcs-server / Azurite: the same runs, read back alike."""
    store = make_store_url(backend, tmp_path, request)
    result = import_tensorboard(tb_logdir, "tb", store=store, progress=False)
    assert sorted(r.name for r in result.imported) == ["cifar/seed1", "mnist", "mnist/sweep"]
    local = str(tmp_path / "local")
    import_tensorboard(tb_logdir, "tb", store=local, progress=False)
    remote, reference = _imported(store, "tb"), _imported(local, "tb")
    assert sorted(remote) == sorted(reference) == ["cifar/seed1", "mnist", "mnist/sweep"]
    for name, (config, frame, rewinds, status) in remote.items():
        ref_config, ref_frame, ref_rewinds, ref_status = reference[name]
        assert (config, rewinds, status) == (ref_config, ref_rewinds, ref_status), name
        assert frame.equals(ref_frame), f"{name}:\n{frame}\n{ref_frame}"
    # and exact against what was logged, not only alike: float32 as TensorBoard stored it, both attempts
    config, frame, rewinds, status = remote["mnist"]
    loss = frame.dropna(subset=["train/loss"])
    assert loss[loss["attempt"] == 0]["train/loss"].tolist() == [float(np.float32(v)) for v in LOSS[:100]]
    assert loss[loss["attempt"] == 1]["train/loss"].tolist() == [float(np.float32(v)) for v in LOSS[100:]]
    assert frame.dropna(subset=["eval/exact"])["eval/exact"].tolist() == EXACT
    assert config["optimizer"] == "adamw" and rewinds == [(79, 290, 1)] and status == "closed"
    # a second import of the same source adds nothing on these stores either
    before = _all_keys(store)
    again = import_tensorboard(tb_logdir, "tb", store=store, progress=False)
    assert not again.imported and len(again.skipped) == 3 and _all_keys(store) == before


def _copy_run(tb_logdir: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "logs"
    shutil.copytree(tb_logdir / "mnist", root / "mnist", ignore=shutil.ignore_patterns("sweep"))
    first, second = sorted((root / "mnist").glob("events.out.tfevents.*"))
    return first, second


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_truncated_or_corrupt_event_file_gives_a_clear_error_and_no_run(
    tb_logdir: Path, tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import launchhelm.importers._common as common

    monkeypatch.setattr(common, "SEGMENT_POINTS", 16)  # segments are written before the damage is reached
    _, second = _copy_run(tb_logdir, tmp_path)
    good = second.read_bytes()
    if damage == "truncated":
        second.write_bytes(good[:-7])
    else:
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x40
        second.write_bytes(bytes(bad))
    store = str(tmp_path / "store")
    with pytest.raises(ImportFailedError) as caught:
        import_tensorboard(tmp_path / "logs", "tb", store=store, progress=False)
    (error,) = caught.value.failures.values()
    assert isinstance(error, SourceReadError) and error.source == str(second)
    assert damage in str(error) and str(second.name) in str(caught.value)
    assert "Nothing of a failed run was stored" in str(caught.value)
    # nothing of the run: not listed, no record, and no object left under runs/
    assert lh.Api(store).run_ids("tb") == [] and lh.Api(store).store.list("runs") == []
    args = ["--store", store, "import", "tensorboard", str(tmp_path / "logs"), "-p", "tb", "--no-progress"]
    assert cli_main(args) == 2
    out, err = capsys.readouterr()
    assert f"failed            mnist: {second}" in out and "launchhelm: error: 1 of 1 tensorboard runs" in err
    second.write_bytes(good)
    result = import_tensorboard(tmp_path / "logs", "tb", store=store, progress=False)
    assert [r.points for r in result.imported] == [150]


def test_a_file_that_is_no_event_file_is_refused(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    with pytest.raises(lh.PathNotFoundError, match="no TensorBoard event files"):
        import_tensorboard(tmp_path, "tb", store=store, progress=False)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.out.tfevents.1.host.1.0").write_bytes(b"this is not a TFRecord file at all")
    with pytest.raises(ImportFailedError, match="length fails its checksum"):
        import_tensorboard(tmp_path / "logs", "tb", store=store, progress=False)
    assert lh.Api(store).store.list("runs") == []


# -- MLflow -----------------------------------------------------------------------------------------
T0 = 1_700_000_000_000  # ms


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("mlflow", reason="the import-mlflow extra is not installed")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    made: dict[str, Any] = {"uri": uri, "runs": {}}
    for experiment, names in (("sweep", ["lr-0.1", "lr-0.01"]), ("other", ["baseline"])):
        experiment_id = client.create_experiment(experiment)
        for i, name in enumerate(names):
            run = client.create_run(experiment_id, run_name=name, start_time=T0 + i, tags={"team": "vision"})
            run_id = run.info.run_id
            params = {"lr": name.split("-")[-1], "epochs": "3", "note": "a b"}
            metrics = [Metric("loss", 1.0 / (s + 1) + i, T0 + 1000 * s, s) for s in range(10)]
            metrics += [Metric("acc", s / 7, T0 + 1000 * s + 1, s) for s in range(0, 10, 2)]
            # resumed from step 5: steps 6..9 logged again, later
            metrics += [Metric("loss", 10.0 + s, T0 + 20_000 + s, s) for s in range(6, 10)]
            client.log_batch(
                run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()], tags=[RunTag("k", "v")]
            )
            client.set_terminated(run_id, end_time=T0 + 30_000)
            made["runs"][name] = {"id": run_id, "params": params, "experiment": experiment, "index": i}
    return made


@pytest.mark.slow
def test_mlflow_runs_params_tags_and_every_metrics_full_history(mlflow_store: dict[str, Any], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    store = str(tmp_path / "store")
    result = import_mlflow(mlflow_store["uri"], "ml", store=store, progress=False)
    assert len(result.imported) == 3
    runs = _by_name(store, "ml")
    assert sorted(runs) == ["baseline", "lr-0.01", "lr-0.1"]
    client = MlflowClient(tracking_uri=mlflow_store["uri"])
    for name, made in mlflow_store["runs"].items():
        run = runs[name]
        assert run.config == made["params"]  # params as MLflow keeps them: strings
        imported = run.events()[0]["imported"]
        assert imported["id"] == made["id"] and imported["experiment"] == made["experiment"]
        assert imported["tags"]["team"] == "vision" and imported["tags"]["k"] == "v"
        assert run.created == (T0 + made["index"]) / 1000
        frame = run.history(duplicates="all")
        for key in ("loss", "acc"):
            history = sorted(client.get_metric_history(made["id"], key), key=lambda m: m.timestamp)
            got = run.history(keys=[key]).sort_values("time")  # one key: each row's time is its point's
            assert got["step"].tolist() == [m.step for m in history]
            assert got[key].tolist() == [m.value for m in history]
            assert [round(t.timestamp() * 1000) for t in got["time"]] == [m.timestamp for m in history]
        # steps 6..9 logged again: two attempts, the old values abandoned
        loss = frame.dropna(subset=["loss"])
        assert loss[loss["attempt"] == 1]["step"].tolist() == [6, 7, 8, 9]
        assert loss[(loss["attempt"] == 0) & (loss["step"] > 5)]["abandoned"].all()
        assert [(r.to_step, r.reached) for r in run.rewinds()] == [(5, 9)]
        assert run.summary()["metric.loss"] == 19.0
    only = import_mlflow(mlflow_store["uri"], "ml", experiment="other", store=store, progress=False)
    assert not only.imported and [r.name for r in only.skipped] == ["baseline"]
    before = _all_keys(store)
    again = import_mlflow(mlflow_store["uri"], "ml", store=store, progress=False)
    assert not again.imported and len(again.skipped) == 3 and _all_keys(store) == before
    with pytest.raises(lh.InvalidArgumentError, match=r"no MLflow experiment named 'nope'.*other, sweep"):
        import_mlflow(mlflow_store["uri"], "ml", experiment="nope", store=store, progress=False)


# -- W&B --------------------------------------------------------------------------------------------
WANDB_SCRIPT = """
import os, sys
import numpy as np
import wandb
config = {"lr": 0.001, "layers": [64, 32], "optimizer": {"name": "adam", "betas": [0.9, 0.999]}}
run = wandb.init(project="proj", name="first-run", config=config, tags=["baseline"], notes="a note")
for i in range(10):
    run.log({"loss": 1 / (i + 1), "acc": i / 10})         # W&B's implicit steps: 0..9
run.log({"eval/loss": 0.25}, step=12)                      # an explicit one
samples = [wandb.Image(np.full((4, 5, 3), i, dtype=np.uint8), caption=f"s{i}") for i in range(2)]
table = wandb.Table(columns=["a", "b"], data=[[1, "x"], [None, "<b>y</b>"]])
run.log({"hist": wandb.Histogram([1, 2, 3]), "label": "x", "samples": samples, "tab": table}, step=13)
run.config.update({"late": "yes"})
run.summary["best_acc"] = 0.95
run_id = run.id
run.finish()
# resumed offline from step 5 (a new folder, the same id)
run = wandb.init(project="proj", id=run_id, resume="allow")
for step in range(6, 9):
    run.log({"loss": 10.0 + step}, step=step)
run.finish()
other = wandb.init(project="proj", config={"seed": 1})
other.log({"loss": float("nan")})
other.log({"loss": float("inf")})
other.finish()
print(run_id, other.id)
"""


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("wandb", reason="the import-wandb extra is not installed")
    root = tmp_path_factory.mktemp("wandb")
    done = run_python(
        WANDB_SCRIPT, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(root), WANDB_DISABLE_GIT="true"
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.split()[-2:]
    return {"path": root / "wandb", "first": first, "second": second}


@pytest.mark.slow
def test_wandb_offline_runs_config_history_summary_and_a_resume(wandb_dir: dict[str, Any], tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    lines: list[str] = []
    result = import_wandb(wandb_dir["path"], "wb", store=store, progress=False, report=lines.append)
    assert len(result.imported) == 2  # three folders: the resumed one is the same run
    runs = _by_name(store, "wb")
    first = runs["first-run"]
    assert first.config == {
        "lr": 0.001,
        "layers": [64, 32],
        "optimizer": {"name": "adam", "betas": [0.9, 0.999]},
        "late": "yes",
    }
    frame = first.history(duplicates="all")
    loss = frame.dropna(subset=["loss"])
    assert loss[loss["attempt"] == 0]["step"].tolist() == list(range(10))
    assert loss[loss["attempt"] == 0]["loss"].tolist() == [1 / (i + 1) for i in range(10)]
    assert frame.dropna(subset=["acc"])["acc"].tolist() == [i / 10 for i in range(10)]
    assert frame.dropna(subset=["eval/loss"])[["step", "eval/loss"]].values.tolist() == [[12, 0.25]]
    assert loss[loss["attempt"] == 1][["step", "loss"]].values.tolist() == [[6, 16.0], [7, 17.0], [8, 18.0]]
    assert [(r.to_step, r.reached, r.attempt) for r in first.rewinds()] == [(5, 13, 1)]  # step 13: media
    row = first.summary()
    assert row["metric.best_acc"] == 0.95 and row["metric.loss"] == 18.0  # W&B's summary, as its table shows
    imported = first.events()[0]["imported"]
    assert (
        imported["tags"] == ["baseline"] and imported["notes"] == "a note" and imported["run_id"] == wandb_dir["first"]
    )
    assert len(imported["folders"]) == 2
    assert "histogram" not in next(line for line in lines if first.id in line)
    media = {(i.key, i.index): i for i in first.media()}  # W&B's media files, as LaunchHelm media
    assert sorted(media) == [("hist", 0), ("samples", 0), ("samples", 1), ("tab", 0)]
    assert {i.step for i in media.values()} == {13}
    counts, edges = media[("hist", 0)].load()
    assert counts.sum() == 3 and len(edges) == len(counts) + 1
    assert [media[("samples", n)].caption for n in (0, 1)] == ["s0", "s1"]
    np.testing.assert_array_equal(media[("samples", 1)].load(), np.full((4, 5, 3), 1, dtype=np.uint8))
    table = media[("tab", 0)].load()
    assert table["a"].tolist() == [1, None] and table["b"].tolist() == ["x", "<b>y</b>"]
    second = runs[wandb_dir["second"]]  # no name given: the run id
    values = second.history()["loss"].tolist()
    assert math.isnan(values[0]) and values[1] == math.inf and second.config == {"seed": 1}
    before = _all_keys(store)
    again = import_wandb(wandb_dir["path"], "wb", store=store, progress=False)
    assert not again.imported and len(again.skipped) == 2 and _all_keys(store) == before


@pytest.mark.slow
def test_a_truncated_wandb_log_gives_a_clear_error_and_no_run(wandb_dir: dict[str, Any], tmp_path: Path) -> None:
    folder = next(p for p in sorted(wandb_dir["path"].glob("offline-run-*")) if wandb_dir["second"] in p.name)
    copy = tmp_path / "wandb" / folder.name
    shutil.copytree(folder, copy)
    log = next(copy.glob("run-*.wandb"))
    log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    store = str(tmp_path / "store")
    with pytest.raises(ImportFailedError, match="incomplete") as caught:
        import_wandb(tmp_path / "wandb", "wb", store=store, progress=False)
    assert isinstance(next(iter(caught.value.failures.values())), SourceReadError)
    assert lh.Api(store).run_ids("wb") == [] and lh.Api(store).store.list("runs") == []


# -- optional dependencies ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("function", "modules", "extra"),
    [
        (import_mlflow, ("mlflow", "mlflow.tracking"), "import-mlflow"),
        (import_wandb, ("wandb", "wandb.util"), "import-wandb"),
    ],
)
def test_a_missing_reader_names_its_extra(
    function: Any, modules: tuple[str, ...], extra: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    (tmp_path / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)
    (tmp_path / "wandb" / "offline-run-20260101_000000-abc" / "run-abc.wandb").write_bytes(b"")
    source = "sqlite:///x.db" if function is import_mlflow else tmp_path / "wandb"
    with pytest.raises(MissingExtraError, match=rf"pip install 'launchhelm\[{extra}\]'") as caught:
        function(source, "p", store=str(tmp_path / "store"), progress=False)
    assert isinstance(caught.value, ImportError) and caught.value.extra == extra


def test_importing_the_importers_loads_no_reader() -> None:
    done = run_python(
        """
        import sys
        import launchhelm.importers, launchhelm._cli
        print(",".join(m for m in ("mlflow", "wandb", "tensorboard", "torch") if m in sys.modules) or "none")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"


# -- Neptune exports ----------------------------------------------------------------------------------
def _neptune_schema() -> Any:
    """neptune-exporter's published schema (its README's table, ``model.py``'s ``SCHEMA``)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("project_id", pa.string()),
            ("run_id", pa.string()),
            ("attribute_path", pa.string()),
            ("attribute_type", pa.string()),
            ("step", pa.decimal128(18, 6)),
            ("timestamp", pa.timestamp("ms", tz="UTC")),
            ("int_value", pa.int64()),
            ("float_value", pa.float64()),
            ("string_value", pa.string()),
            ("bool_value", pa.bool_()),
            ("datetime_value", pa.timestamp("ms", tz="UTC")),
            ("string_set_value", pa.list_(pa.string())),
            ("file_value", pa.struct([("path", pa.string())])),
            (
                "histogram_value",
                pa.struct(
                    [("type", pa.string()), ("edges", pa.list_(pa.float64())), ("values", pa.list_(pa.float64()))]
                ),
            ),
        ]
    )


def _neptune_rows(run_id: str, rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    schema = _neptune_schema()
    full = [
        {name: row.get(name) for name in schema.names} | {"project_id": "ws/proj", "run_id": run_id} for row in rows
    ]
    return pa.Table.from_pylist(full, schema=schema)


def test_a_neptune_export_imports_parameters_and_float_series(tmp_path: Path) -> None:
    import datetime
    from decimal import Decimal

    import pyarrow.parquet as pq

    from launchhelm.importers import import_neptune

    data = tmp_path / "exports" / "data" / "ws_proj-1a2b3c"
    data.mkdir(parents=True)
    t0 = datetime.datetime(2025, 6, 1, tzinfo=datetime.timezone.utc)
    params = [
        {"attribute_path": "parameters/lr", "attribute_type": "float", "float_value": 3e-4},
        {"attribute_path": "parameters/epochs", "attribute_type": "int", "int_value": 12},
        {"attribute_path": "parameters/model", "attribute_type": "string", "string_value": "resnet"},
        {"attribute_path": "parameters/amp", "attribute_type": "bool", "bool_value": True},
        {"attribute_path": "parameters/tags", "attribute_type": "string_set", "string_set_value": ["b", "a"]},
        {"attribute_path": "sys/custom_run_id", "attribute_type": "string", "string_value": "resnet-7"},
        {"attribute_path": "sys/name", "attribute_type": "string", "string_value": "baselines"},
        {"attribute_path": "sys/creation_time", "attribute_type": "datetime", "datetime_value": t0},
    ]
    loss = [
        {
            "attribute_path": "metrics/loss",
            "attribute_type": "float_series",
            "step": Decimal(s),
            "timestamp": t0 + datetime.timedelta(seconds=s),
            "float_value": 1.0 / (s + 1),
        }
        for s in range(20)
    ]
    logs = [{"attribute_path": "logs/out", "attribute_type": "string_series", "step": Decimal(0), "string_value": "hi"}]
    pq.write_table(_neptune_rows("RES-7", params + loss[:10]), data / "RES-7_part_0.parquet")
    pq.write_table(_neptune_rows("RES-7", loss[10:] + logs), data / "RES-7_part_1.parquet")
    # an export still being written (part_0 not renamed into place yet) is left out
    pq.write_table(_neptune_rows("RES-8", loss), data / "RES-8_part_1.parquet")
    fraction = [dict(loss[0], step=Decimal("0.5"))]
    pq.write_table(_neptune_rows("RES-9", fraction), data / "RES-9_part_0.parquet")
    store = str(tmp_path / "store")
    with pytest.raises(ImportFailedError, match=r"step with a fraction \(0.500000\).*step_multiplier") as caught:
        import_neptune(tmp_path / "exports" / "data", "np", store=store, progress=False)
    assert list(caught.value.failures) == ["ws_proj-1a2b3c/RES-9"]
    (run,) = (lh.Api(store).run(r) for r in lh.Api(store).run_ids("np"))
    assert run.name == "resnet-7" and run.created == t0.timestamp()
    assert run.config == {
        "parameters/lr": 3e-4,
        "parameters/epochs": 12,
        "parameters/model": "resnet",
        "parameters/amp": True,
        "parameters/tags": ["a", "b"],
    }
    frame = run.history()
    assert frame["step"].tolist() == list(range(20)) and frame["metrics/loss"].tolist() == [
        1 / (s + 1) for s in range(20)
    ]
    assert frame["time"].iloc[5].timestamp() == t0.timestamp() + 5
    imported = run.events()[0]["imported"]
    assert imported["run_id"] == "RES-7" and imported["experiment"] == "baselines" and imported["source"] == "neptune"
    assert imported["skipped"] == {"string_series values ('logs/out'...)": 1}
    # the fractional run with a multiplier; the one imported before is skipped
    assert (
        cli_main(
            [
                "--store",
                store,
                "import",
                "neptune",
                str(tmp_path / "exports" / "data"),
                "-p",
                "np",
                "--step-multiplier",
                "10",
            ]
        )
        == 0
    )
    names = sorted(lh.Api(store).run(r).name for r in lh.Api(store).run_ids("np"))
    assert names == ["RES-9", "resnet-7"]
    half = next(lh.Api(store).run(r) for r in lh.Api(store).run_ids("np") if lh.Api(store).run(r).name == "RES-9")
    assert half.history()["step"].tolist() == [5]
