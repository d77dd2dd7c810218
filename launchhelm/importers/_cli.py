"""``launchhelm import SOURCE ...``: one subcommand per source, each added by one function.

A new source (``launchhelm import dcp``) is a function taking the ``import``
command's subparsers, appended to :data:`SOURCES`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    from launchhelm.importers._common import ImportResult

    #: The subparsers of a command (``parser.add_subparsers()``).
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["SOURCES", "add_commands"]

_STORE_HELP = "the LaunchHelm store to import into (default: $LAUNCHHELM_STORE, else ~/.launchhelm)"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", "-p", required=True, help="the LaunchHelm project the runs go into")
    # SUPPRESS: without --store here, `launchhelm --store URL import ...` keeps the top-level value
    parser.add_argument("--store", default=argparse.SUPPRESS, help=_STORE_HELP)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _done(result: ImportResult) -> int:
    print(
        f"{len(result.imported)} run(s) imported, {len(result.skipped)} already imported, into project "
        f"{result.project!r}; list them with `launchhelm runs {result.project}`"
    )
    return 0


def _tensorboard(sources: Subparsers) -> None:
    def run(args: argparse.Namespace) -> int:
        from launchhelm.importers import import_tensorboard

        return _done(
            import_tensorboard(args.logdir, args.project, store=args.store, progress=not args.no_progress, report=print)
        )

    parser = sources.add_parser(
        "tensorboard",
        help="TensorBoard event files: each folder holding events.out.tfevents.* becomes a run",
        description="Import TensorBoard logs: each folder under LOGDIR with event files becomes a run named by its "
        "path; scalars exactly as stored (float32), hparams as config. Importing again adds nothing.",
    )
    parser.add_argument("logdir", metavar="LOGDIR", help="the log folder (a local path or an fsspec URL)")
    _common(parser)
    parser.set_defaults(func=run)


def _mlflow(sources: Subparsers) -> None:
    def run(args: argparse.Namespace) -> int:
        from launchhelm.importers import import_mlflow

        return _done(
            import_mlflow(
                args.tracking_uri,
                args.project,
                experiment=args.experiment,
                store=args.store,
                progress=not args.no_progress,
                report=print,
            )
        )

    parser = sources.add_parser(
        "mlflow",
        help="an MLflow tracking store: runs, params as config, tags, every metric's full history",
        description="Import the runs of an MLflow tracking store through MLflow's client "
        "(pip install 'launchhelm[import-mlflow]'). Importing again adds nothing.",
    )
    parser.add_argument("tracking_uri", metavar="TRACKING_URI", help="sqlite:///mlflow.db, ./mlruns, http://host:5000")
    parser.add_argument("--experiment", "-e", default=None, help="only this experiment's runs (default: all)")
    _common(parser)
    parser.set_defaults(func=run)


def _wandb(sources: Subparsers) -> None:
    def run(args: argparse.Namespace) -> int:
        from launchhelm.importers import import_wandb

        return _done(
            import_wandb(args.path, args.project, store=args.store, progress=not args.no_progress, report=print)
        )

    parser = sources.add_parser(
        "wandb",
        help="W&B run folders (wandb/offline-run-*): config, history, summary",
        description="Import W&B runs from their folders, read with W&B's own reader "
        "(pip install 'launchhelm[import-wandb]'); nothing is sent anywhere. Importing again adds nothing.",
    )
    parser.add_argument("path", metavar="PATH", help="the wandb/ folder, one run folder, or a run-*.wandb file")
    _common(parser)
    parser.set_defaults(func=run)


def _neptune(sources: Subparsers) -> None:
    def run(args: argparse.Namespace) -> int:
        from launchhelm.importers import import_neptune

        return _done(
            import_neptune(
                args.path,
                args.project,
                step_multiplier=args.step_multiplier,
                store=args.store,
                progress=not args.no_progress,
                report=print,
            )
        )

    parser = sources.add_parser(
        "neptune",
        help="Neptune runs exported by neptune-exporter (Parquet): parameters, float series",
        description="Import the Parquet files `neptune-exporter export` wrote (its --data-path): parameters as "
        "config, float series as metrics. Importing again adds nothing.",
    )
    parser.add_argument("path", metavar="PATH", help="the exporter's data folder (default ./exports/data)")
    parser.add_argument(
        "--step-multiplier", type=int, default=1, help="Neptune steps are decimals: multiply them into integers"
    )
    _common(parser)
    parser.set_defaults(func=run)


def _dcp(sources: Subparsers) -> None:
    def run(args: argparse.Namespace) -> int:
        from launchhelm.importers import import_dcp

        result = import_dcp(args.path, args.project, name=args.run, step=args.step, store=args.store, report=print)
        run_id = result.run_ids[0]
        print(
            f"resume it with lht.init({result.project!r}, resume={run_id!r}) and "
            'load_checkpoint("resume"), on any number of ranks'
        )
        return 0

    parser = sources.add_parser(
        "dcp",
        help="a torch.distributed.checkpoint folder (torchtitan's, say) as the checkpoint of a new run",
        description="Record a DCP checkpoint (a folder of __<rank>_<n>.distcp files and a .metadata) as the "
        "checkpoint of a new run, stored in LaunchHelm's sharded format with checksums, so that "
        "load_checkpoint('resume') restores it on any number of ranks. Its .metadata is read with an unpickler "
        "that admits only DCP's metadata classes; values that are not tensors or plain data are refused. "
        "Importing the same checkpoint again adds nothing.",
    )
    parser.add_argument("path", metavar="DIR", help="the DCP checkpoint folder (a local path or an fsspec URL)")
    parser.add_argument("--project", "-p", required=True, help="the LaunchHelm project of the new run")
    parser.add_argument("--run", default=None, metavar="NAME", help="the new run's name (default: a random one)")
    parser.add_argument(
        "--step", type=int, default=None, help="the step it restores (default: its step or train_state.step entry)"
    )
    parser.add_argument("--store", default=argparse.SUPPRESS, help=_STORE_HELP)
    parser.set_defaults(func=run)


#: One function per source: each adds its subcommand to ``launchhelm import``.
SOURCES: list[Callable[[Subparsers], None]] = [_tensorboard, _mlflow, _wandb, _neptune, _dcp]


def add_commands(sub: Subparsers) -> None:
    """Add ``import`` (and under it one subcommand per source) to the ``launchhelm`` command's subparsers."""
    parser = sub.add_parser(
        "import",
        help="import runs from TensorBoard, MLflow, W&B, a Neptune export, or a DCP checkpoint "
        "(importing again adds nothing)",
    )
    sources = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for add in SOURCES:
        add(sources)
