"""Pictures are encoded and stored by the helper process, not in the training process.

What a user would notice if these failed: logging images stalls the training
loop while PNGs are encoded in its process (the GIL), or a helper killed while
storing them loses pictures or shows one twice, or ``finish()`` returns before
the last pictures are readable.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from lhtest import run_python

import launchhelm as lh
from launchhelm.media._handoff import (
    HANDOFF_BASE,
    HandoffStorer,
    handed_files,
    one_storer,
    seal_handed,
    store_handoff,
)
from launchhelm.media._read import read_media_index
from launchhelm.media._recover import recover_media
from launchhelm.media._spill import handoff_name, write_spilled
from launchhelm.media._types import PreparedImage
from launchhelm.storage import open_store
from launchhelm.storage._keys import media_index_prefix


def _picture(step: int, side: int = 64) -> np.ndarray:
    rng = np.random.default_rng(step)
    return rng.integers(0, 256, (side, side, 3), dtype=np.uint8)


_ENCODED_ELSEWHERE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import launchhelm as lh
    import launchhelm.media._png as png
    import launchhelm.media._writer as writer

    calls = []
    def counting(name, real):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return wrapped
    # every way this process could encode an image: none is taken while its helper lives
    writer.encode_image = counting("encode_image", writer.encode_image)
    writer.encode_png = counting("encode_png", writer.encode_png)
    png.encode_png = counting("png.encode_png", png.encode_png)

    run = lh.init("handoff", store=sys.argv[1], flush_interval=3600, capture_console=False)
    for step in range(20):
        pixels = np.random.default_rng(step).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        run.log({"sample": lh.Image(pixels, caption=f"s{step}")}, step=step)
    run.log({"photo": lh.Image(np.full((32, 32, 3), 200, np.uint8), format="jpeg", quality=90)}, step=20)
    run.finish()
    print(json.dumps({"run": run.id, "calls": calls, "handed": run._media.handed, "pil": "PIL" in sys.modules}))
    """
)


@pytest.mark.slow
def test_images_logged_with_a_helper_are_encoded_in_the_helper_not_the_training_process(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = run_python(_ENCODED_ELSEWHERE, store, LAUNCHHELM_SPOOL=str(tmp_path / "spool"))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["calls"] == [], out  # no PNG, no thumbnail encoded in the training process
    assert out["pil"] is False, "Pillow (the JPEG's encoder) was imported by the training process"
    assert out["handed"] == 21
    run = lh.Api(store).run(out["run"])
    items = run.media("sample")
    assert [i.step for i in items] == list(range(20))  # finish() returned with every one readable
    for item in items:
        assert np.array_equal(item.load(), _picture(item.step)), item.step
        assert item.caption == f"s{item.step}"
    (photo,) = run.media("photo")
    assert photo.load().shape == (32, 32, 3)
    # the helper's index objects were sealed into one at finish()
    names = open_store(store).list(media_index_prefix(out["run"]))
    assert any(name.endswith(f"/{HANDOFF_BASE:08d}-{HANDOFF_BASE + 20:08d}.parquet") for name in names), names


_HELPER_KILLED = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import numpy as np
    import launchhelm as lh

    count = int(sys.argv[2])
    run = lh.init("handoff", store=sys.argv[1], flush_interval=0.3, capture_console=False)
    killed = []
    for step in range(count):
        pixels = np.random.default_rng(step).integers(0, 256, (128, 128, 3), dtype=np.uint8)
        run.log({"sample": lh.Image(pixels)}, step=step)
        time.sleep(0.005)
        if step in (count // 3, 2 * count // 3):
            deadline = time.monotonic() + 30
            while run._helper is None or run._helper.process.pid in killed:  # the replacement, once started
                assert time.monotonic() < deadline, "a helper ran"
                time.sleep(0.05)
            pid = run._helper.process.pid
            os.kill(pid, signal.SIGKILL)  # while it stores the stream: a real kill, mid-file or between files
            killed.append(pid)
    run.finish()
    print(json.dumps({"run": run.id, "killed": killed, "handed": run._media.handed}))
    """
)


@pytest.mark.slow
def test_a_helper_killed_mid_stream_is_replaced_and_every_image_is_stored_exactly_once(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    count = 240
    done = run_python(_HELPER_KILLED, store, str(count), LAUNCHHELM_SPOOL=str(tmp_path / "spool"), timeout=180)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["killed"]) == 2
    assert out["handed"] == count
    assert "was killed by SIGKILL" in done.stderr and "a new one" in done.stderr, done.stderr
    items = lh.Api(store).run(out["run"]).media("sample")
    assert [i.step for i in items] == list(range(count))  # each once, none lost
    for item in items[::10]:
        assert np.array_equal(item.load(), _picture(item.step, 128)), item.step


def _hand(directory: Path, session: str, seqs: range) -> None:
    for seq in seqs:
        pixels = _picture(seq, 16)
        write_spilled(
            directory / handoff_name(session, seq),
            "sample",
            seq,
            0,
            1.0,
            [PreparedImage(pixels, f"s{seq}", "png", None)],
        )


def test_a_helper_killed_after_its_index_chunk_and_before_its_deletes_stores_nothing_twice(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    store = open_store(str(tmp_path / "store"))
    _hand(directory, "01sess", range(6))
    kept = tmp_path / "kept"
    shutil.copytree(directory, kept)
    assert HandoffStorer(store, "runhand1", "01sess", directory).step() == 6
    assert handed_files(directory, "01sess") == []
    # the files again, as a helper killed after its chunk and before its deletes leaves them, and newer ones
    for path in kept.iterdir():
        shutil.copy(path, directory / path.name)
    _hand(directory, "01sess", range(6, 9))
    replacement = HandoffStorer(store, "runhand1", "01sess", directory)
    assert replacement.step() == 3
    assert handed_files(directory, "01sess") == []
    index = read_media_index(store, "runhand1").to_pylist()
    assert sorted((row["step"], row["caption"]) for row in index) == [(s, f"s{s}") for s in range(9)]
    # `launchhelm recover`'s path (the helper's drain, a relaunch) takes the same care
    for path in kept.iterdir():
        shutil.copy(path, directory / path.name)
    assert recover_media(store, "runhand1", "01sess", directory) == 0
    assert len(read_media_index(store, "runhand1")) == 9


def test_handed_files_with_a_gap_are_indexed_in_spans_that_never_cover_a_missing_file(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    store = open_store(str(tmp_path / "store"))
    _hand(directory, "01sess", range(3))
    _hand(directory, "01sess", range(5, 7))  # 3 and 4 not written yet (another thread writes them)
    assert store_handoff(store, "runhand2", "01sess", directory) == 5
    _hand(directory, "01sess", range(3, 5))
    assert store_handoff(store, "runhand2", "01sess", directory) == 2
    names = sorted(n.rsplit("/", 1)[1] for n in store.list(media_index_prefix("runhand2")))
    b = HANDOFF_BASE
    assert names == [f"{b + f:08d}-{b + la:08d}.parquet" for f, la in ((0, 2), (3, 4), (5, 6))]
    index = read_media_index(store, "runhand2").to_pylist()
    assert sorted(row["step"] for row in index) == list(range(7))


def test_a_seal_never_hides_files_indexed_after_it_behind_a_span_over_a_gap(tmp_path: Path) -> None:
    """finish() gave up waiting and sealed while the helper still stored files 3-4: they must stay read."""
    directory = tmp_path / "spool"
    directory.mkdir()
    store = open_store(str(tmp_path / "store"))
    _hand(directory, "01sess", range(3))
    _hand(directory, "01sess", range(5, 7))
    assert store_handoff(store, "runhand5", "01sess", directory) == 5
    seal_handed(store, "runhand5", "01sess", directory)  # 3 and 4 not indexed yet: no span may cover them
    _hand(directory, "01sess", range(3, 5))
    assert store_handoff(store, "runhand5", "01sess", directory) == 2
    index = read_media_index(store, "runhand5").to_pylist()
    assert sorted(row["step"] for row in index) == list(range(7))
    seal_handed(store, "runhand5", "01sess", directory)  # now without a gap: one object reads all
    index = read_media_index(store, "runhand5").to_pylist()
    assert sorted(row["step"] for row in index) == list(range(7))


def test_two_storers_of_one_session_take_turns(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    store = open_store(str(tmp_path / "store"))
    _hand(directory, "01sess", range(4))
    with one_storer(directory, "01sess") as mine:
        assert mine
        # a second storer (recover, beside a helper still at work) leaves the files to the holder
        assert HandoffStorer(store, "runhand6", "01sess", directory).step(wait=0.2) == 0
    assert HandoffStorer(store, "runhand6", "01sess", directory).step(wait=0.2) == 4


def test_a_long_stream_of_handed_files_keeps_a_few_index_objects(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    store = open_store(str(tmp_path / "store"))
    storer = HandoffStorer(store, "runhand3", "01sess", directory)
    for seq in range(64):  # one file per look: 64 chunks, merged 8 at a time, twice over
        _hand(directory, "01sess", range(seq, seq + 1))
        assert storer.step() == 1
    index = read_media_index(store, "runhand3").to_pylist()
    assert sorted(row["step"] for row in index) == list(range(64))
    from launchhelm.media._index import choose_index_objects

    names = [f"01sess/{n.rsplit('/', 1)[1]}" for n in store.list(media_index_prefix("runhand3"))]
    assert [(first, last) for _, _, first, last in choose_index_objects(names)] == [(HANDOFF_BASE, HANDOFF_BASE + 63)]


def test_a_fence_admits_what_the_helper_indexed_before_it_and_nothing_after(tmp_path: Path) -> None:
    from launchhelm._runlog._runinfo import session_watermark
    from launchhelm._start import _mark_fence

    directory = tmp_path / "spool"
    directory.mkdir()
    store = open_store(str(tmp_path / "store"))
    storer = HandoffStorer(store, "runhand4", "01sess", directory)
    _hand(directory, "01sess", range(3))
    assert storer.step() == 3
    # a relaunch fences the session (as _start does), then the zombie's helper stores two more
    _mark_fence(store, "runhand4", "01sess", session_watermark(store, "runhand4", "01sess"))
    _hand(directory, "01sess", range(3, 5))
    assert storer.step() == 2
    index = read_media_index(store, "runhand4").to_pylist()
    assert sorted(row["step"] for row in index) == [0, 1, 2]
