"""``launchhelm import dcp``: a ``torch.distributed.checkpoint`` folder as the checkpoint of a new run.

The work (reading DCP safely, writing format /3) is ``launchhelm.torch._interop``'s;
this module gives it the importers' shape: a run id derived from the source
(its URL and its ``.metadata`` checksum), so importing the same checkpoint
again adds nothing, and an :class:`ImportResult`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from launchhelm._exceptions import MissingExtraError, SourceReadError
from launchhelm._runlog._events import validate_project
from launchhelm.importers._common import ImportedRun, ImportResult, derive_run_id
from launchhelm.storage import Store, open_store

__all__ = ["import_dcp"]


def _metadata_checksum(source: str, options: Mapping[str, object]) -> str:
    import fsspec

    from launchhelm.storage._checksum import crc64nvme

    fs, root = fsspec.core.url_to_fs(source, **options)
    path = f"{root.rstrip('/')}/.metadata"
    try:
        if fs.size(path) > 1 << 30:
            raise SourceReadError(f"{source}/.metadata is larger than DCP metadata may be")
        raw = fs.cat_file(path)
    except (FileNotFoundError, NotADirectoryError):
        raise SourceReadError(
            f"{source} holds no .metadata: not a torch.distributed.checkpoint folder (or its save did not finish)"
        ) from None
    return f"{crc64nvme(raw):016x}"


def import_dcp(
    path: str | os.PathLike[str],
    project: str,
    *,
    name: str | None = None,
    step: int | None = None,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    source_options: Mapping[str, object] | None = None,
    report: Callable[[str], None] | None = None,
) -> ImportResult:
    """Record a ``torch.distributed.checkpoint`` (DCP) folder as the checkpoint of a new run.

    The run can then be resumed as if LaunchHelm had saved it:
    ``lht.init(project, resume=run_id)`` and ``load_checkpoint("resume")``,
    on any number of ranks (the checkpoint is stored in format /3, with
    CRC64NVME checksums and a JSON manifest).

    Parameters
    ----------
    path:
        The DCP folder (``.metadata`` and ``__<rank>_<n>.distcp`` files), local or an fsspec URL.
    project:
        The LaunchHelm project of the new run.
    name:
        The run's display name (default: a random one).
    step:
        The step the checkpoint restores; default: its ``step`` or
        ``train_state["step"]`` entry.
    store, storage_options:
        The LaunchHelm store, as for :func:`launchhelm.init`.
    source_options:
        fsspec options for reading ``path``.
    report:
        Called with one line saying what was done (the command line prints it).

    Returns
    -------
    ImportResult
        One run, imported now or found imported before (``skipped``).

    Raises
    ------
    SourceReadError
        Not a DCP folder, or its metadata or a value is refused (pickled
        code, an object that is not a tensor or plain value, a top-level key
        with no place in a LaunchHelm checkpoint). Nothing is created.
    MissingExtraError
        torch is not installed.
    """
    validate_project(project)
    try:
        from launchhelm.torch._interop import import_dcp_checkpoint
    except ImportError as exc:
        raise MissingExtraError(
            f"importing a DCP checkpoint needs torch ({exc}); install it with: pip install 'launchhelm[torch]'",
            extra="torch",
            package="torch",
        ) from None
    source = os.fspath(path)
    if "://" not in source:
        source = str(Path(source).expanduser().absolute())
    options = dict(source_options or {})
    run_id = derive_run_id("dcp", project, f"{source}\0{_metadata_checksum(source, options)}")
    st = open_store(store, storage_options)
    done = import_dcp_checkpoint(
        source, project, run_id=run_id, name=name, step=step, store=st, storage_options=options
    )
    result = ImportResult(project)
    result._add(ImportedRun(source=source, name=name or "", run_id=run_id), done["skipped"])
    if report is not None:
        if done["skipped"]:
            report(f"already imported  {source} -> run {run_id} (checkpoint {done['checkpoint']}, step {done['step']})")
        else:
            mapped = done["mapped"]
            report(
                f"imported          {source} -> run {run_id}: checkpoint {done['checkpoint']} at step {done['step']} "
                f"({mapped['model']} model tensors, optimizer state of {mapped['optimizer']} parameters"
                + (", scheduler" if mapped["scheduler"] else "")
                + (f", extra {', '.join(mapped['extra'])}" if mapped["extra"] else "")
                + ")"
            )
    return result
