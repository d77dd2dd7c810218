"""Storing what a dead or ended session spilled (see :mod:`launchhelm.media._spill`).

The helper's drain, ``launchhelm recover``, a reader or a relaunch on this
host call it: one index chunk per :data:`BATCH` files, numbered from
:data:`RECOVERED_BASE` plus the batch's first file number, so a recovery cut
short and tried again finds its chunk already there instead of indexing the
items twice. Each chunk is named for its batch's whole span of file numbers
(``first-last``, last = first + 999; before 2026-12 ``first-first``, which
still reads), so a recovery's chunks are adjacent and it merges them into
one object at its end. Files handed to the helper (``.media-h<n>.lhm``) are stored by
:func:`launchhelm.media._handoff.store_handoff`, which skips those a helper
indexed already.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from launchhelm._exceptions import AlreadyExistsError
from launchhelm.media._index import IndexRow, encode_index
from launchhelm.media._spill import _SUFFIX, BATCH, RECOVERED_BASE, is_handoff, read_spilled, spill_paths
from launchhelm.media._writer import object_name, store_items
from launchhelm.storage._keys import media_index_key, media_object_key

__all__ = ["recover_media"]


def recover_media(store: Any, run_id: str, session_id: str, directory: Path) -> int:
    """Store a dead or ended session's spilled media and index them; return the items stored.

    Files are deleted once their index chunk is stored; a file that cannot be
    read (not ours, damaged) is left where it is, with a line saying so.
    """

    def put(data: bytes, extension: str) -> str:
        name = object_name(data, extension)
        try:
            store.create(media_object_key(run_id, name), data)
        except AlreadyExistsError:
            pass
        return name

    for tmp in directory.glob(f"{session_id}.media-*{_SUFFIX}.tmp"):
        tmp.unlink(missing_ok=True)  # a write the kill cut short: never renamed, never counted
    batches: dict[int, list[tuple[int, Path]]] = {}
    for seq, path in spill_paths(directory, session_id):
        if is_handoff(path):
            continue  # below
        batches.setdefault(seq // BATCH, []).append((seq, path))
    stored = 0
    for batch, files in sorted(batches.items()):
        rows: list[IndexRow] = []
        done: list[Path] = []
        for _, path in files:
            try:
                key, step, attempt, when, items = read_spilled(path)
            except (ValueError, KeyError, TypeError) as exc:
                logging.getLogger("launchhelm").warning("launchhelm: left %s in the spool: %s", path, exc)
                continue
            rows += store_items(put, key, step, attempt, when, items)
            done.append(path)
        if rows:
            # the chunk claims its batch's whole span of file numbers, so that consecutive batches are
            # adjacent spans, merged into one object below (a retry's chunk has the same name)
            number = RECOVERED_BASE + batch * BATCH
            try:
                store.create(media_index_key(run_id, session_id, number, number + BATCH - 1), encode_index(rows))
            except AlreadyExistsError:
                pass  # an earlier recovery stored this batch's chunk and was cut short before deleting
        for path in done:
            path.unlink(missing_ok=True)
        stored += len(rows)
    from launchhelm.media._handoff import merge_spans, seal_handed, store_handoff

    if batches:  # a reader then fetches one object for them all (an earlier try's too), not one per 1,000 calls
        merge_spans(store, run_id, session_id, RECOVERED_BASE, RECOVERED_BASE * 2)
    handed = store_handoff(store, run_id, session_id, directory)
    if handed:
        seal_handed(store, run_id, session_id, directory)  # the session is over: its helper's index in one object
    return stored + handed
