"""A script written for W&B runs on LaunchHelm with one changed import line, and stores what it logged.

What a user would notice if these failed: values, steps, config or summary
that differ from what their W&B script logged; a resume that starts a second
run or loses the summary; a W&B feature that breaks the script instead of
being skipped, or a refused one without a message saying what to use.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from lhtest import make_store_url, run_python

import launchhelm as lh
import launchhelm.wandb as wandb

#: A training script in W&B's style: implicit and explicit steps, commit=False, define_metric, summary.
WANDB_SCRIPT = """
import wandb
import json
import math
import numpy as np

run = wandb.init(project="compat-demo", config={"lr": 0.01, "epochs": 2}, tags=["baseline"], notes="first try")
wandb.config.update({"batch_size": 32})
wandb.config.dropout = 0.1
wandb.define_metric("epoch")
wandb.define_metric("val/*", step_metric="epoch")
wandb.define_metric("val/acc", summary="max")

for i in range(4):                                      # implicit steps 0..3
    if i % 2 == 1:
        wandb.log({"train/lr": 0.01 / (i + 1)}, commit=False)   # joins the next committed row
    wandb.log({"train/loss": 1.0 / (i + 1), "nested": {"grad_norm": math.sqrt(i)}})

wandb.log({"val/acc": 0.7, "epoch": 1}, step=10)         # explicit step: waits for more at step 10
wandb.log({"train/loss": 0.125})                        # ... and joins it, committing step 10
wandb.log({"train/loss": 99.0}, step=5)                 # behind the current step: dropped, as W&B does
image = wandb.Image(np.zeros((4, 4, 3), dtype=np.uint8))
wandb.log({"val/acc": 0.6, "epoch": 2, "samples": image}, step=20, commit=True)
wandb.log({"train/loss": 0.0625, "examples": wandb.Table(columns=["a"], data=[[1]])})
run.summary["best_val"] = 0.7
print("RUN", run.id, wandb.run.id, run.step)


def as_plain(x):
    return {k: as_plain(v) for k, v in dict(x).items()} if hasattr(x, "keys") else x


print("SUMMARY", json.dumps(as_plain(run.summary), default=str))
wandb.finish()
assert wandb.run is None
"""

EXPECTED_ROWS = {
    0: {"train/loss": 1.0, "nested.grad_norm": 0.0},
    1: {"train/loss": 0.5, "train/lr": 0.005, "nested.grad_norm": 1.0},
    2: {"train/loss": 1 / 3, "nested.grad_norm": math.sqrt(2)},
    3: {"train/loss": 0.25, "train/lr": 0.0025, "nested.grad_norm": math.sqrt(3)},
    10: {"val/acc": 0.7, "epoch": 1.0, "train/loss": 0.125},
    20: {"val/acc": 0.6, "epoch": 2.0},
    21: {"train/loss": 0.0625},
}


#: W&B's summary of that script: last values, define_metric's max, the explicit set; nested logs stay nested.
EXPECTED_SUMMARY = {
    "train/loss": 0.0625,
    "train/lr": 0.0025,
    "nested": {"grad_norm": math.sqrt(3)},
    "val/acc": {"max": 0.7},
    "epoch": 2,
    "best_val": 0.7,
}


def printed(stdout: str, tag: str) -> str:
    """What the script printed after ``tag``."""
    return next(x for x in stdout.splitlines() if x.startswith(f"{tag} ")).split(" ", 1)[1]


def swap_import(script: str) -> str:
    """The user's one change: ``import wandb`` becomes ``import launchhelm.wandb as wandb``."""
    assert script.count("import wandb\n") == 1
    return script.replace("import wandb\n", "import launchhelm.wandb as wandb\n")


@pytest.fixture
def in_process_store(tmp_path: Path) -> Iterator[str]:
    """A local store for runs made in this process; any run left current is finished."""
    yield str(tmp_path / "store")
    if wandb.run is not None:
        wandb.finish()


def _init(store: str, **kwargs: object) -> wandb.Run:
    return wandb.init(store=store, capture_console=False, system_metrics=False, **kwargs)


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_a_wandb_script_stores_exactly_what_it_logged(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend, tmp_path, request)
    done = run_python(swap_import(WANDB_SCRIPT), LAUNCHHELM_STORE=store, LAUNCHHELM_SYSTEM_METRICS="false")
    assert done.returncode == 0, done.stderr
    run_id, current_id, step = printed(done.stdout, "RUN").split()
    assert current_id == run_id and step == "22"
    # images and tables are stored (test_wandb_media.py checks their content), and the dropped step named
    assert "skipped Image" not in done.stderr and "skipped Table" not in done.stderr
    assert "less than the current step 11" in done.stderr

    api = lh.Api(store)
    assert api.projects() == ["compat-demo"]
    handle = api.run(run_id)
    assert handle.status == "closed"
    # config.update() and attribute sets right after init() are the run's own config
    assert dict(handle.config) == {"lr": 0.01, "epochs": 2, "batch_size": 32, "dropout": 0.1}
    frame = handle.history()
    got: dict[int, dict[str, float]] = {}
    for record in frame.to_dict("records"):
        values = {
            k: v
            for k, v in record.items()
            if k not in ("step", "attempt", "time", "abandoned") and not (isinstance(v, float) and math.isnan(v))
        }
        got.setdefault(int(record["step"]), {}).update(values)
    assert got == EXPECTED_ROWS

    saved = wandb.stored(run_id, store=store)
    assert saved.summary == EXPECTED_SUMMARY
    assert json.loads(printed(done.stdout, "SUMMARY")) == EXPECTED_SUMMARY  # what the script saw
    assert saved.metrics["val/*"]["step_metric"] == "epoch"
    assert saved.metrics["val/acc"]["summary"] == ["max"]
    assert saved.config == dict(handle.config)
    assert (saved.tags, saved.notes, saved.exit_code, saved.step) == (["baseline"], "first try", 0, 22)
    assert [(i.key, i.step, i.kind) for i in handle.media()] == [("examples", 21, "table"), ("samples", 20, "image")]
    # W&B's default summary is LaunchHelm's latest value of each metric
    assert handle.summary()["metric.train/loss"] == 0.0625


@pytest.mark.slow
def test_the_same_script_under_real_wandb_offline_sees_the_same_steps_and_summary(tmp_path: Path) -> None:
    # the cross-check: W&B's own package, offline, runs the unchanged script to the same step and summary
    done = run_python(WANDB_SCRIPT, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_CONSOLE="off")
    assert done.returncode == 0, done.stderr
    assert printed(done.stdout, "RUN").split()[2] == "22"
    assert "less than the current step 11" in done.stderr
    summary = json.loads(printed(done.stdout, "SUMMARY"))
    media = {"samples", "examples"}  # W&B keeps file references to them in its summary; launchhelm.wandb does not
    assert {k: v for k, v in summary.items() if not k.startswith("_") and k not in media} == EXPECTED_SUMMARY


@pytest.mark.slow
def test_a_script_that_raises_keeps_its_last_row_and_stays_resumable(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    script = """
    import wandb
    run = wandb.init(project="crashy", id="crash-run-1", resume="allow")
    print("RUN", run.id, flush=True)
    wandb.log({"loss": 1.0})
    wandb.log({"loss": 0.5}, commit=False)   # pending when the script dies
    raise RuntimeError("out of memory")
    """
    done = run_python(swap_import(textwrap.dedent(script)), LAUNCHHELM_STORE=store, LAUNCHHELM_SYSTEM_METRICS="false")
    assert done.returncode == 1 and "out of memory" in done.stderr
    run_id = next(x for x in done.stdout.splitlines() if x.startswith("RUN ")).split()[1]
    handle = lh.Api(store).run(run_id)
    assert handle.status == "resumable"
    assert handle.history()[["step", "loss"]].to_dict("records") == [
        {"step": 0, "loss": 1.0},
        {"step": 1, "loss": 0.5},
    ]
    assert wandb.stored("crash-run-1", store=store).exit_code == 1


def test_resume_must_allow_never(in_process_store: str) -> None:
    store = in_process_store
    with pytest.raises(lh.RunNotFoundError, match="resume='must'"):
        _init(store, project="p", id="nosuchrun", resume="must")

    run = _init(store, project="p", id="My-Run_7", resume="allow", config={"lr": 0.1})
    assert run.wandb_id == "My-Run_7" and run.id != "My-Run_7"  # a LaunchHelm id, stable for the W&B one
    run.log({"loss": 1.0})
    run.log({"loss": 0.5})
    run.summary["best"] = 0.5
    run.define_metric("loss", summary="min")
    run.finish(exit_code=1)  # W&B's "failed": the run stays resumable
    assert lh.Api(store).run(run.id).status == "resumable"

    with pytest.raises(lh.AlreadyExistsError, match="resume='allow'"):
        _init(store, project="p", id="My-Run_7")

    again = _init(id="My-Run_7", resume="must", store=store)  # the stored project, without naming it
    assert (again.id, again.project, again.resumed, again.step) == (run.id, "p", True, 2)
    assert again.config["lr"] == 0.1 and again.summary["best"] == 0.5
    again.log({"loss": 0.75})
    assert again.summary["loss"] == {"min": 0.75}  # define_metric came back with the run
    again.finish()
    handle = lh.Api(store).run(run.id)
    assert handle.status == "closed"
    assert handle.history()[["step", "loss"]].to_dict("records") == [
        {"step": 0, "loss": 1.0},
        {"step": 1, "loss": 0.5},
        {"step": 2, "loss": 0.75},
    ]
    assert len(lh.Api(store).run_ids("p")) == 1

    with pytest.raises(lh.RunClosedError, match="closed"):
        _init(store, project="p", id="My-Run_7", resume="allow")

    auto = _init(store, project="p", id="auto-run", resume=True)  # W&B's True/"auto" with an id: as "allow"
    auto.finish(exit_code=2)
    assert _init(store, project="p", id="auto-run", resume="auto").resumed
    wandb.finish()


def test_resume_from_rewinds_and_keeps_the_abandoned_points(in_process_store: str) -> None:
    store = in_process_store
    run = _init(store, project="p", id="rewound")
    for i in range(10):
        run.log({"metric": float(i)})
    run.finish(exit_code=1)

    again = _init(store, project="p", resume_from="rewound?_step=5")
    assert again.step == 5
    for i in range(5, 8):
        again.log({"metric": -float(i)})
    again.finish()
    handle = lh.Api(store).run("rewound")
    [rewind] = handle.rewinds()
    assert (rewind.to_step, rewind.reached, rewind.cause) == (4, 9, "wandb resume_from")
    frame = handle.history()
    new = frame[frame["attempt"] == 1]
    assert new[["step", "metric"]].to_dict("records") == [{"step": s, "metric": -float(s)} for s in (5, 6, 7)]
    old = frame[frame["attempt"] == 0]
    assert old["step"].tolist() == list(range(10))  # the abandoned attempt stays stored
    last = handle.history(duplicates="last")
    assert last.set_index("step").loc[5:7, "metric"].tolist() == [-5.0, -6.0, -7.0]


def test_disabled_mode_stores_nothing_and_breaks_nothing(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    settings = wandb.Settings(start_method="thread", _disable_stats=True)
    run = wandb.init(project="p", mode="disabled", config={"a": 1}, store=store, settings=settings, entity="me")
    assert run.settings.start_method == "thread" and run.disabled
    assert wandb.run is run and wandb.config.a == 1
    wandb.log({"loss": 1.0})
    wandb.summary["x"] = 2
    wandb.define_metric("loss", summary="min")
    wandb.log({"loss": 0.5})
    assert wandb.summary["loss"] == {"min": 0.5} and run.step == 2
    wandb.finish()
    assert wandb.run is None
    assert not (tmp_path / "store").exists() or lh.Api(store).projects() == []


def test_refused_features_say_what_to_use_instead(in_process_store: str) -> None:
    with pytest.raises(lh.UnsupportedFeatureError, match=r"wandb\.Artifact.*checkpoint") as caught:
        wandb.Artifact("data", type="dataset")
    assert isinstance(caught.value, NotImplementedError) and caught.value.feature == "wandb.Artifact"
    with pytest.raises(NotImplementedError, match=r"launchhelm\.Api"):
        wandb.Api()
    with pytest.raises(lh.UnsupportedFeatureError, match="sweep"):
        wandb.sweep({"method": "grid"})
    with pytest.raises(lh.UnsupportedFeatureError, match="resume_from"):
        _init(in_process_store, project="p", fork_from="abcd?_step=3")
    with pytest.raises(wandb.WandbUsageError, match="init"):
        wandb.log({"loss": 1.0})
    with pytest.raises(wandb.WandbUsageError, match="init"):
        _ = wandb.config.lr
    run = _init(in_process_store, project="p", config={"lr": 0.1})
    with pytest.raises(lh.UnsupportedFeatureError, match="checkpoint"):
        run.log_artifact("model.pt")
    with pytest.raises(wandb.ConfigError, match="allow_val_change") as changed:
        wandb.config.lr = 0.2
    assert isinstance(changed.value, ValueError)
    wandb.config.update({"lr": 0.2}, allow_val_change=True)
    assert getattr(wandb.config, "missing", "default") == "default"
    with pytest.raises(KeyError):
        wandb.config["missing"]
    # accepted no-ops
    assert wandb.login() is True and wandb.watch(object()) is None and wandb.save("*.pt") == []
    wandb.finish()


def test_importing_the_drop_in_apis_pulls_in_no_heavy_dependency() -> None:
    done = run_python(
        """
        import sys
        import launchhelm.wandb, launchhelm.tensorboard
        heavy = [m for m in ("torch", "pandas", "pyarrow", "altair", "IPython", "wandb", "tensorboard")
                 if m in sys.modules]
        print(",".join(heavy) or "none")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"


def test_the_record_is_plain_json_under_the_documented_key(in_process_store: str) -> None:
    run = _init(in_process_store, project="p", config={"lr": 0.1})
    run.log({"loss": float("nan")})
    run.finish()
    body = json.loads(lh.Api(in_process_store).store.read(wandb.compat_key(run.id)))
    assert body["format"] == "launchhelm.wandb/1" and body["run"] == run.id
    assert math.isnan(body["summary"]["loss"])
