"""Import runs from TensorBoard, MLflow, W&B and Neptune exports, and DCP checkpoints: ``launchhelm import SOURCE``.

Each source run becomes one LaunchHelm run, under an id derived from the
source's own ids: importing the same source again adds nothing. A run
appears only once it is complete; one that fails leaves nothing behind. The
sources' readers are optional extras, imported only when an import runs
(``pip install 'launchhelm[import-mlflow]'``, ``[import-wandb]``); TensorBoard's
event files and Neptune's Parquet exports need none. See docs/importers.md.

Examples
--------
>>> from launchhelm.importers import import_mlflow
>>> import_mlflow("sqlite:///mlflow.db", "migrated")   # doctest: +SKIP
<ImportResult migrated: 100 imported, 0 already imported>
"""

from launchhelm._exceptions import ImportFailedError, MissingExtraError, SourceReadError
from launchhelm.importers._common import ImportedRun, ImportResult
from launchhelm.importers._dcp import import_dcp
from launchhelm.importers._mlflow import import_mlflow
from launchhelm.importers._neptune import import_neptune
from launchhelm.importers._tensorboard import import_tensorboard
from launchhelm.importers._wandb import import_wandb

__all__ = [
    "ImportFailedError",
    "ImportResult",
    "ImportedRun",
    "MissingExtraError",
    "SourceReadError",
    "import_dcp",
    "import_mlflow",
    "import_neptune",
    "import_tensorboard",
    "import_wandb",
]
