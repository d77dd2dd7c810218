"""Media the store has not taken yet wait on local disk, in the spool: never dropped, never a stalled log().

What a user would notice if these failed: a run logging pictures faster than
the store takes them stalls its training loop (log() waiting), or loses the
last pictures when ``finish()`` runs out of time or the process is killed, or
a recovery tried twice shows the same picture twice.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lhtest import child_env, helper_pids

import launchhelm as lh
from launchhelm.media._index import IndexRow, choose_index_objects, encode_index
from launchhelm.media._read import decode_image, read_media_index
from launchhelm.media._recover import recover_media
from launchhelm.media._spill import RECOVERED_BASE, read_spilled, spill_paths, write_spilled
from launchhelm.media._types import PreparedHistogram, PreparedImage, PreparedTable
from launchhelm.storage import open_store
from launchhelm.storage._keys import media_index_key, media_index_prefix, media_object_key

ITEMS = 600


def _picture(step: int) -> np.ndarray:
    """A 128x128 picture only ``step`` makes: its object, and its pixels read back, are its own."""
    rng = np.random.default_rng(step)
    return rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)


def _check_all_back(store: str, run_id: str, count: int) -> None:
    items = lh.Api(store).run(run_id).media("sample")
    assert [i.step for i in items] == list(range(count))
    for item in items[:: max(1, count // 25)]:
        assert np.array_equal(item.load(), _picture(item.step)), item.step


@pytest.mark.slow
def test_media_past_the_memory_bound_go_to_the_spool_and_every_one_reaches_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(spool))
    store = str(tmp_path / "store")
    run = lh.init("spill", store=store, flush_interval=3600, compaction_memory="4MiB", capture_console=False)
    seen_on_disk = 0
    for step in range(ITEMS):
        run.log({"sample": lh.Image(_picture(step))}, step=step)
        seen_on_disk = max(seen_on_disk, len(spill_paths(spool / run.id, run.session_id)))
    # 4 MiB holds about 85 of these pictures: the rest waited on disk, log() did not wait for the store
    assert run._media.spilled >= ITEMS // 2, run._media.spilled
    assert seen_on_disk > 0
    run.finish()
    _check_all_back(store, run.id, ITEMS)
    assert not (spool / run.id).exists() or not spill_paths(spool / run.id, run.session_id)


@pytest.mark.slow
def test_what_finish_cannot_store_in_its_time_waits_in_the_spool_and_recover_stores_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool"
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(spool))
    store = str(tmp_path / "store")
    run = lh.init("spill", store=store, flush_interval=3600, compaction_memory="4MiB", capture_console=False)
    for step in range(ITEMS):
        run.log({"sample": lh.Image(_picture(step)), "loss": 1.0 / (step + 1)}, step=step)
    monkeypatch.setenv("LAUNCHHELM_FINISH_TIMEOUT", "0.1")  # the media thread is far from done
    with caplog.at_level(logging.WARNING, logger="launchhelm"):
        run.finish()
    assert "wait in the spool" in caplog.text and f"launchhelm recover {run.id}" in caplog.text, caplog.text
    # read from the store itself: an Api on this host would recover the spool when it opens the run
    stored = read_media_index(open_store(store), run.id).num_rows
    waiting = spill_paths(spool / run.id, run.session_id)
    assert stored < ITEMS and len(waiting) == ITEMS - stored, (stored, len(waiting))

    # a real `launchhelm recover` while this process (whose session ended) still runs
    def recover() -> subprocess.CompletedProcess[str]:
        exe = str(Path(sys.executable).with_name("launchhelm"))
        env = child_env(LAUNCHHELM_SPOOL=str(spool))
        return subprocess.run([exe, "--store", store, "recover", run.id], capture_output=True, text=True, env=env)

    done = recover()
    assert done.returncode == 0, done.stderr
    assert f"run {run.id}: recovered" in done.stdout, done.stdout
    assert not (spool / run.id).exists()
    _check_all_back(store, run.id, ITEMS)
    assert len(lh.Api(store).run(run.id).history()) == ITEMS  # the points, stored by finish() itself
    again = recover()
    assert "recovered 0" in again.stdout, again.stdout
    _check_all_back(store, run.id, ITEMS)


def test_a_recovery_cut_short_before_it_deleted_its_files_indexes_nothing_twice(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    for seq in range(5):
        write_spilled(
            directory / f"01sess.media-{seq:08d}.lhm",
            "sample",
            seq,
            0,
            1.0,
            [PreparedImage(_picture(seq)[:16, :16].copy(), f"s{seq}", "png", None)],
        )
    kept = tmp_path / "kept"
    shutil.copytree(directory, kept)
    store = open_store(str(tmp_path / "store"))
    run_id = "runspill1"
    assert recover_media(store, run_id, "01sess", directory) == 5
    assert not spill_paths(directory, "01sess")
    # the same files again, as if the first recovery died after its index chunk and before its deletes
    for path in kept.iterdir():
        shutil.copy(path, directory / path.name)
    assert recover_media(store, run_id, "01sess", directory) == 5
    index = read_media_index(store, run_id).to_pylist()
    assert sorted((row["step"], row["caption"]) for row in index) == [(s, f"s{s}") for s in range(5)]


def _spill_tiny(directory: Path, count: int) -> None:
    """``count`` spilled calls of one 4x4 picture each, step = file number, each picture its own."""
    directory.mkdir(exist_ok=True)
    for seq in range(count):
        pixels = np.zeros((4, 4, 3), dtype=np.uint8)
        pixels.reshape(-1)[:3] = (seq & 255, (seq >> 8) & 255, 7)
        write_spilled(
            directory / f"01sess.media-{seq:08d}.lhm", "sample", seq, 0, 1.0, [PreparedImage(pixels, None, "png", None)]
        )


def _chosen_index_objects(store: Any, run_id: str) -> list[tuple[str, str, int, int]]:
    prefix = media_index_prefix(run_id)
    return choose_index_objects(store.list(prefix))


#: Spilled files per recovered index chunk in the two tests below: the product's 1,000, scaled down so that
#: three batches take 25 files, not 2,500 (the naming and the merge do not depend on the size)
SMALL_BATCH = 10


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> int:
    import launchhelm.media._recover

    monkeypatch.setattr(launchhelm.media._recover, "BATCH", SMALL_BATCH)
    return SMALL_BATCH


def test_a_long_recovery_leaves_one_index_object_that_a_reader_fetches_alone(
    tmp_path: Path, small_batches: int
) -> None:
    # 25 spilled calls are three batches: before, three index objects, one GET each for every reader
    directory = tmp_path / "spool"
    _spill_tiny(directory, 25)
    store = open_store(str(tmp_path / "store"))
    assert recover_media(store, "runspill3", "01sess", directory) == 25
    chosen = _chosen_index_objects(store, "runspill3")
    spans = [(first, last) for _, _, first, last in chosen]
    assert spans == [(RECOVERED_BASE, RECOVERED_BASE + 3 * small_batches - 1)], chosen
    rows = read_media_index(store, "runspill3").to_pylist()
    assert sorted(row["step"] for row in rows) == list(range(25))  # each call once: none lost or doubled
    row = next(row for row in rows if row["step"] == 17)
    pixels = decode_image(store.read(media_object_key("runspill3", row["object"])))
    assert tuple(pixels[0, 0]) == (17, 0, 7)


def test_a_recovery_by_the_earlier_naming_reads_and_a_retry_over_it_indexes_nothing_twice(
    tmp_path: Path, small_batches: int
) -> None:
    # a store where a recovery of the earlier version (chunks named first-first) stored batch 0 and was
    # killed before deleting its files: this version's retry writes its own names, and each call reads once
    directory = tmp_path / "spool"
    _spill_tiny(directory, 15)
    kept = tmp_path / "kept"
    shutil.copytree(directory, kept)
    store = open_store(str(tmp_path / "store"))
    assert recover_media(store, "runspill4", "01sess", directory) == 15
    rows = read_media_index(store, "runspill4").to_pylist()
    first_batch = [row for row in rows if row["step"] < small_batches]
    prefix = media_index_prefix("runspill4")
    for name in store.list(prefix):
        store.delete(f"{prefix}/{name}")
    store.create(
        media_index_key("runspill4", "01sess", RECOVERED_BASE, RECOVERED_BASE),
        encode_index([IndexRow(**row) for row in first_batch]),
    )
    steps = sorted(row["step"] for row in read_media_index(store, "runspill4").to_pylist())
    assert steps == list(range(small_batches))  # the earlier naming reads
    for path in kept.iterdir():  # the killed recovery's files, all still there
        shutil.copy(path, directory / path.name)
    assert recover_media(store, "runspill4", "01sess", directory) == 15
    steps = sorted(row["step"] for row in read_media_index(store, "runspill4").to_pylist())
    assert steps == list(range(15))
    assert [(f, last) for _, _, f, last in _chosen_index_objects(store, "runspill4")] == [
        (RECOVERED_BASE, RECOVERED_BASE + 2 * small_batches - 1)
    ]


def test_a_spilled_file_reads_back_every_kind_and_a_foreign_file_is_refused_not_run(tmp_path: Path) -> None:
    picture = _picture(1)[:8, :8].copy()
    table = PreparedTable(["a", "img"], [[1.5, PreparedImage(picture, "cell", "png", None)], [None, "x"]], "t")
    histogram = PreparedHistogram([1, 2], [0.0, 0.5, 1.0], None)
    path = tmp_path / "s.media-00000000.lhm"
    write_spilled(path, "k", 7, 2, 3.5, [PreparedImage(picture, "c", "jpeg", 80), table, histogram])
    key, step, attempt, when, items = read_spilled(path)
    assert (key, step, attempt, when) == ("k", 7, 2, 3.5)
    image, got_table, got_histogram = items
    assert isinstance(image, PreparedImage) and np.array_equal(image.pixels, picture)
    assert (image.caption, image.format, image.quality) == ("c", "jpeg", 80)
    assert isinstance(got_table, PreparedTable) and got_table.rows[1] == [None, "x"]
    assert np.array_equal(got_table.rows[0][1].pixels, picture)
    assert got_histogram == histogram
    foreign = tmp_path / "f.media-00000000.lhm"
    foreign.write_bytes(b"\x80\x04\x95" + os.urandom(64))  # a pickle's opening: never unpickled
    with pytest.raises(ValueError, match="not a spilled media file"):
        read_spilled(foreign)


_KILLED = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import launchhelm as lh
    run = lh.init("spill-kill", store=sys.argv[1], flush_interval=3600, compaction_memory="4MiB", capture_console=False)
    for step in range(int(sys.argv[2])):
        pixels = np.random.default_rng(step).integers(0, 256, (128, 128, 3), dtype=np.uint8)
        run.log({"sample": lh.Image(pixels)}, step=step)
    print(run.id, run._media.spilled, flush=True)
    time.sleep(3600)
    """
)


@pytest.mark.slow
def test_a_killed_process_s_spilled_media_reach_the_store_through_its_helper(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    store = str(tmp_path / "store")
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED, store, str(ITEMS)],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(LAUNCHHELM_SPOOL=str(spool)),
    )
    assert proc.stdout is not None
    run_id, spilled = proc.stdout.readline().split()
    deadline = time.monotonic() + 30
    while not helper_pids(proc.pid):
        assert time.monotonic() < deadline, "the trainer's helper process started"
        time.sleep(0.1)
    assert int(spilled) > 0
    proc.send_signal(signal.SIGKILL)  # no finish(), no atexit: only the helper can store them
    deadline = time.monotonic() + 120
    while (spool / run_id).exists():
        assert time.monotonic() < deadline, "the helper drained the spool"
        time.sleep(0.2)
    proc.wait()
    items = lh.Api(store).run(run_id).media("sample")
    steps = [i.step for i in items]
    # the spilled ones at least (those in memory at the kill died with it), each once and pixel-exact
    assert len(steps) >= int(spilled) and len(set(steps)) == len(steps), (len(steps), spilled)
    for item in items[:: max(1, len(items) // 25)]:
        assert np.array_equal(item.load(), _picture(item.step)), item.step
