"""Benchmark of logging and reading media (issue 43) against baselines measured in the same run.

What is measured (one process, fresh temporary local stores):

``log()`` of an image in the training thread
    ``run.log({"img": lh.Image(a)})`` of a 512x512x3 uint8 array, ``--images`` calls (default 100)
    with a 100 ms sleep between them (a training step; the media thread, ~35 ms an image on the
    development machine, keeps up, so no call waits on the 64 MiB bound: logging images faster
    than the media thread stores them makes ``log()`` wait, by design), one ``perf_counter_ns``
    pair around each call; the baseline is
    ``a.copy()`` of the same array timed in the same loop, just before each ``log()``. p50, p99
    and max in µs. Target: ``log()`` p99 <= copy p99 + 20 µs. For scale (info): a ``log()`` of
    one float and an empty Python call, each after its own 100 ms sleep in the same loop.

Stalls with images
    Batches of 100 ``log()`` calls of 3 scalars then a 5 ms sleep (bench_log's shape), for
    ``--stall-seconds`` each (default 5): without images, then with one 512x512x3 image in the
    first call of every 10th batch (an image every ~60 ms, within the media thread's pace).
    Per-batch wall p50, p99 and max in ms, of every batch (the media thread works during the
    batches without an image too), beside the same without images: both variants run in the same
    process one after the other, so the machine's noise is the baseline. Target (the issue's): the
    run with images meets bench_log's targets for a batch, p99.9 <= 1 ms and max <= 2 ms, its max
    being that of the batches holding an image; printed on the wall clock and, as bench_log does,
    less the time the kernel kept the thread waiting for a CPU (other processes' noise on a shared
    machine; a wait for the GIL is kept). With a helper process (a local store with a spool, the
    default) the images are encoded and stored there; the script says which.

Opening a long run's media
    A run of ``--steps`` steps (default 200; ``--full``: 10,000) x 4 image keys, a flush after
    every step (the worst case for the index: one chunk per flush), then
    ``Api(store).run(id).media()``: its wall time and the store requests it made, counted at the
    Store interface (a listing is one request: a run's index is far below S3's 1,000 keys a page;
    ``read_many`` of n keys is n requests). Target: <= 20 requests for 10,000 steps x 4 keys.
    The <= 1 s on S3 with 20 ms latency of the issue is not measured here.

Stored bytes per image
    The object LaunchHelm stores for a 512x512x3 image (a smooth gradient with noise, as a
    photo-like picture) and its thumbnail, beside the PNG Pillow writes of the same pixels (default
    settings) when Pillow is installed. Target: the object within 5% of the PNG's size.

The development machine is shared by other jobs: tails (p99, max) are noisy there, and a figure
taken under load says so (the script prints it as a reminder).

Run it from the repository root::

    python benchmarks/bench_media.py                 # < 1 min
    python benchmarks/bench_media.py --full          # 10,000 steps x 4 keys for the Media read
    python benchmarks/bench_media.py --full --memory # the same requests, written to memory:// (faster)
    python benchmarks/bench_media.py --check         # exit 1 on a missed target
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from bench_log import percentile, print_table

import launchhelm as lh
from launchhelm.storage import Store, open_store

SIDE = 512
KEYS = ("samples/a", "samples/b", "samples/c", "samples/d")
TARGET_EXTRA_US = 20.0
TARGET_REQUESTS = 20
TARGET_BYTES_RATIO = 1.05
#: bench_log's targets for a batch of 100 ``log()`` calls, which a batch with an image must meet too.
STALL_P999_MS = 1.0
STALL_MAX_MS = 2.0


def picture(seed: int = 0) -> np.ndarray:
    """A photo-like 512x512x3 uint8 image: smooth gradients plus a little noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float64)
    base = np.stack([x / SIDE, y / SIDE, (x + y) / (2 * SIDE)], axis=-1) * 200
    return np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)


def media_thread_ms(rounds: int = 5) -> float:
    """Median ms the media thread spends on one 512x512x3 image: PNG, thumbnail, their hashes."""
    import hashlib
    import statistics

    from launchhelm.media._writer import encode_image, thumbnail_pixels

    a = picture()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        hashlib.sha256(encode_image(a)).digest()
        hashlib.sha256(encode_image(thumbnail_pixels(a))).digest()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _empty() -> None:
    """A Python call that does nothing, timed cold as the others are."""


def bench_log_latency(store: str, images: int) -> dict[str, list[int]]:
    """ns per ``log()`` of an image and per ``copy()`` of the same array, alternating in one loop."""
    a = picture()
    run = lh.init("bench-media", store=store, flush_interval=1.0)
    for step in range(20):  # warm-up: the media thread started, the encoder's first calls paid
        run.log({"img": lh.Image(a)}, step=step)
    run.flush()
    pc = time.perf_counter_ns
    out: dict[str, list[int]] = {"log": [], "copy": [], "scalar": [], "empty": []}
    for step in range(20, 20 + images):
        t0 = pc()
        a.copy()
        t1 = pc()
        run.log({"img": lh.Image(a)}, step=step)
        t2 = pc()
        out["copy"].append(t1 - t0)
        out["log"].append(t2 - t1)
        time.sleep(0.1)
        # the scale of the cold path: a log() of one number and an empty call, each after the same
        # 100 ms step (what any Python costs once the step evicted the caches; info, no target)
        t0 = pc()
        run.log({"loss": 0.5}, step=step)
        t1 = pc()
        out["scalar"].append(t1 - t0)
        time.sleep(0.1)
        t0 = pc()
        _empty()
        t1 = pc()
        out["empty"].append(t1 - t0)
        time.sleep(0.1)
    run.finish()
    return out


def bench_flood(store: str, spool: str, seconds: float) -> dict[str, float]:
    """``log()`` of 64x64x3 images as fast as the loop goes for ``seconds``, a 4 MiB bound: past it they spill.

    Returns calls made, items spilled to the spool, the p99 and max ``log()`` ns, what ``finish()``
    stored and what it left in the spool (a relaunch or ``launchhelm recover`` stores those).
    """
    from launchhelm.media._spill import spill_paths

    os.environ["LAUNCHHELM_SPOOL"] = spool
    pictures = [np.full((64, 64, 3), v, dtype=np.uint8) for v in range(256)]
    for n, p in enumerate(pictures):
        p[0, 0, 1] = n  # each its own object
    run = lh.init("bench-media", store=store, flush_interval=1.0, compaction_memory="4MiB", capture_console=False)
    pc = time.perf_counter_ns
    calls: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = pc()
        run.log({"img": lh.Image(pictures[len(calls) % 256])}, step=len(calls))
        calls.append(pc() - t0)
    spilled = run._media.spilled
    os.environ["LAUNCHHELM_FINISH_TIMEOUT"] = "5"
    try:
        run.finish()
    finally:
        del os.environ["LAUNCHHELM_FINISH_TIMEOUT"]
    from launchhelm.media._read import read_media_index

    # the helper stores on after finish() gave up waiting: a count taken while it commits a batch would
    # see it in neither place, so the files are counted on both sides of the index's read until they agree
    for _ in range(150):
        waiting = len(spill_paths(Path(spool) / run.id, run.session_id))
        stored = read_media_index(open_store(store), run.id).num_rows
        if len(spill_paths(Path(spool) / run.id, run.session_id)) == waiting:
            break
        time.sleep(0.2)
    return {
        "calls": float(len(calls)),
        "spilled": float(spilled),
        "p99": percentile(calls, 99),
        "max": float(max(calls)),
        "stored": float(stored),
        "waiting": float(waiting),
    }


def _batches(seconds: float, log: Callable[[int, int, dict[str, Any]], None]) -> tuple[list[int], list[int]]:
    """Per batch of 100 ``log`` calls (then a 5 ms sleep), for ``seconds``: its wall ns, and its wall ns
    less the time the kernel kept the thread waiting for a CPU (bench_log's "less CPU waits": other
    processes' noise on a busy machine; a wait for the GIL is kept)."""
    from _gilwatch import RunDelay

    queued = RunDelay()
    pc = time.perf_counter_ns
    walls: list[int] = []
    own: list[int] = []
    step = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = len(walls)
        q0 = queued()
        t0 = pc()
        for i in range(100):
            x = float(step)
            log(batch, i, {"loss": 1.0 / (x + 1.0), "lr": 3e-4, "grad_norm": x})
            step += 1
        wall = pc() - t0
        walls.append(wall)
        own.append(max(0, wall - int((queued() - q0) * 1e9)))
        time.sleep(0.005)
    queued.close()
    return walls, own


def bench_stalls(store: str, seconds: float) -> dict[str, list[int]]:
    a = picture()
    out: dict[str, list[int]] = {}
    for name, with_image in (("numbers", False), ("images", True)):
        run = lh.init("bench-media", store=store, flush_interval=0.5, capture_console=False)
        time.sleep(1.0)  # the helper process started (its imports) before the timed part, in both variants

        def log(batch: int, i: int, d: dict[str, Any], run: Any = run, with_image: bool = with_image) -> None:
            if with_image and i == 0 and batch % 10 == 0:
                d["img"] = lh.Image(a)
            run.log(d)

        out[name], out[f"{name}_own"] = _batches(seconds, log)
        if with_image:
            out["handed"] = [run._media.handed]  # items the helper process stored (0: encoded in this process)
        run.finish()
    return out


class _Counted:
    """Counts a Store's requests: a listing or a read is one, ``read_many`` one per key."""

    def __init__(self, store: Store) -> None:
        self.requests = 0
        for name, per_key in (("list", False), ("list_info", False), ("read", False), ("exists", False)):
            self._wrap(store, name, per_key)
        self._wrap(store, "read_many", True)

    def _wrap(self, store: Store, name: str, per_key: bool) -> None:
        inner = getattr(store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.requests += len(list(args[0])) if per_key else 1
            return inner(*args, **kwargs)

        setattr(store, name, counted)


def bench_open(store_dir: str, steps: int) -> dict[str, float]:
    """A run of ``steps`` x 4 image keys, a flush after each step; then one ``media()``: seconds, requests."""
    run = lh.init("bench-media", store=store_dir, flush_interval=3600)
    for step in range(steps):
        cell = np.full((4, 4, 3), step % 256, dtype=np.uint8)
        cell[0, 0, 0] = step // 256  # a different object each step, as real samples are
        run.log({key: lh.Image(cell + n) for n, key in enumerate(KEYS)}, step=step)
        run.flush()
    run.finish()
    store = open_store(store_dir)
    counter = _Counted(store)
    t0 = time.perf_counter()
    items = lh.Api(store).run(run.id).media()
    seconds = time.perf_counter() - t0
    assert len(items) == steps * len(KEYS), len(items)
    return {"seconds": seconds, "requests": float(counter.requests), "items": float(len(items))}


def bench_open_s3(steps: int) -> dict[str, float]:
    """The Media tab of a run of ``steps`` x 4 image keys opened on moto S3 behind a 20 ms proxy.

    The run is written to ``memory://`` (a flush each step, as :func:`bench_open`), then its records,
    its media index and the objects of the step the tab opens at are copied to moto: the tab reads
    nothing else (the other pictures load when the slider reaches them). Returns the seconds from
    ``MediaPanel(...)`` to the first step's four thumbnails in hand, and the requests that took.
    """
    import subprocess

    from bench_relaunch import ROOT, _free_port, _wait_for

    from launchhelm.widgets import MediaPanel

    sys.path.insert(0, str(ROOT / "tests"))
    from http_proxy import RequestCounter

    memory = "memory://bench-media-s3"
    # index objects merged away are deleted after a grace period (10 min): a run of hours keeps only
    # the last minutes' worth, so this one (written in a minute or two) keeps none
    os.environ["LAUNCHHELM_COMPACTION_GRACE"] = "0"
    run = lh.init("bench-media", store=memory, flush_interval=3600, capture_console=False)
    for step in range(steps):
        cell = np.full((4, 4, 3), step % 256, dtype=np.uint8)
        cell[0, 0, 0] = step // 256
        run.log({key: lh.Image(cell + n) for n, key in enumerate(KEYS)}, step=step)
        run.flush()
    run.finish()
    del os.environ["LAUNCHHELM_COMPACTION_GRACE"]
    source = open_store(memory)
    last = [i for i in lh.Api(source).run(run.id).media() if i.step == steps - 1]
    wanted = {f"runs/{run.id}/media/objects/{name}" for i in last for name in (i.object, i.thumbnail) if name}
    keys = [k for k in source.list("") if "/media/objects/" not in k or k in wanted]
    port = _free_port()
    moto = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "moto_serial.py"), "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proxy = None
    try:
        _wait_for(f"http://127.0.0.1:{port}/moto-api/")
        for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
            os.environ.setdefault(name, value)
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket="bench")
        direct = open_store("s3://bench/media", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}})
        for key, data in source.read_many(keys).items():
            assert data is not None
            direct.create(key, data)
        proxy = RequestCounter(port, latency=0.02)
        store = open_store("s3://bench/media", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
        proxy.reset()
        import cProfile
        import pstats

        profile = cProfile.Profile() if os.environ.get("BENCH_PROFILE") else None
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        panel = MediaPanel(run.id, store=store, interval=3600)
        try:
            _, buffers = panel.pictures(steps - 1, list(KEYS))
            seconds = time.perf_counter() - t0
            if profile is not None:
                profile.disable()
                pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
            assert len(buffers) == len(KEYS) and len(panel.state["steps"]) == steps, len(panel.state["steps"])
        finally:
            panel.close()
        print("Media tab on S3: requests by kind:", dict(proxy.snapshot()))
        return {"seconds": seconds, "requests": float(proxy.total), "copied": float(len(keys))}
    finally:
        if proxy is not None:
            proxy.close()
        moto.terminate()
        moto.wait()


def bench_bytes(store_dir: str) -> dict[str, float]:
    a = picture(1)
    run = lh.init("bench-media", store=store_dir)
    run.log({"img": lh.Image(a)}, step=0)
    run.finish()
    (item,) = lh.Api(store_dir).run(run.id).media()
    assert np.array_equal(item.load(), a)
    store = open_store(store_dir)
    thumb = len(store.read(f"runs/{run.id}/media/objects/{item.thumbnail}")) if item.thumbnail else 0
    png = float("nan")
    try:
        import io

        import PIL.Image

        out = io.BytesIO()
        PIL.Image.fromarray(a).save(out, format="PNG")
        png = float(len(out.getvalue()))
    except ImportError:
        pass
    return {"object": float(item.size), "thumbnail": float(thumb), "png": png}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=100, help="timed log() calls of a 512x512x3 image")
    parser.add_argument("--stall-seconds", type=float, default=5.0, help="seconds of batches, each variant")
    parser.add_argument("--steps", type=int, default=200, help="steps x 4 image keys for the media() read")
    parser.add_argument("--full", action="store_true", help="the issue's size: 10,000 steps x 4 keys")
    parser.add_argument(
        "--memory", action="store_true", help="write the long run to memory:// (the same requests, no disk: faster)"
    )
    parser.add_argument("--s3", action="store_true", help="also open the Media tab on moto S3 behind 20 ms")
    parser.add_argument("--flood-seconds", type=float, default=1.0, help="seconds of log() of images, no pause")
    parser.add_argument("--check", action="store_true", help="exit with status 1 if a target is missed")
    args = parser.parse_args(argv)
    steps = 10_000 if args.full else args.steps
    print(f"bench_media: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPU(s)")
    print("note: on a machine shared with other jobs the tails (p99, max) carry their noise; say so with the figures")
    with tempfile.TemporaryDirectory(prefix="bench-media-") as tmp:
        lat = bench_log_latency(str(Path(tmp) / "lat"), args.images)
        stalls = bench_stalls(str(Path(tmp) / "stall"), args.stall_seconds) if args.stall_seconds > 0 else None
        t0 = time.perf_counter()
        opened = bench_open("memory://bench-media-open" if args.memory else str(Path(tmp) / "open"), steps)
        print(f"(the {steps:,}-step run took {time.perf_counter() - t0:.0f} s to write)")
        size = bench_bytes(str(Path(tmp) / "bytes"))
        on_s3 = bench_open_s3(steps) if args.s3 else None
        flood = bench_flood(str(Path(tmp) / "flood"), str(Path(tmp) / "spool"), args.flood_seconds)
    pace = media_thread_ms()

    def us(values: list[int], q: float) -> float:
        return (max(values) if q == 100 else percentile(values, q)) / 1000

    copy99 = us(lat["copy"], 99)
    rows: list[tuple[str, float, float, str, bool | None]] = [
        ("log() 512x512x3 p50 µs (vs copy)", us(lat["log"], 50), us(lat["copy"], 50), "", None),
        (
            "log() 512x512x3 p99 µs (vs copy)",
            us(lat["log"], 99),
            copy99,
            f"<= copy + {TARGET_EXTRA_US:.0f}",
            us(lat["log"], 99) <= copy99 + TARGET_EXTRA_US,
        ),
        ("log() 512x512x3 max µs (vs copy)", us(lat["log"], 100), us(lat["copy"], 100), "", None),
        ("  log() of one float p50 µs (vs an empty call)", us(lat["scalar"], 50), us(lat["empty"], 50), "", None),
        ("  log() of one float p99 µs (vs an empty call)", us(lat["scalar"], 99), us(lat["empty"], 99), "", None),
    ]
    if stalls is not None:
        for q, label in ((50, "p50"), (99, "p99"), (100, "max")):
            rows.append(
                (
                    f"batch of 100, an image per 10, {label} ms (vs none)",
                    us(stalls["images"], q) / 1000,
                    us(stalls["numbers"], q) / 1000,
                    "",
                    None,
                )
            )
        for q, label in ((99, "p99"), (100, "max")):
            ratio = us(stalls["images"], q) / us(stalls["numbers"], q)
            rows.append((f"  ratio images / none, {label}", ratio, math.nan, "", None))
        # the target: batches with images within bench_log's (p99.9 <= 1 ms, max <= 2 ms); the
        # batches without images, beside, are this machine's own tail
        for suffix, how in (("", "wall"), ("_own", "less CPU waits")):
            for pct, label, limit in ((99.9, "p99.9", STALL_P999_MS), (100.0, "max", STALL_MAX_MS)):
                images = us(stalls[f"images{suffix}"], pct) / 1000
                numbers = us(stalls[f"numbers{suffix}"], pct) / 1000
                rows.append(
                    (
                        f"  per batch, an image per 10, {label} ms ({how}; vs none)",
                        images,
                        numbers,
                        f"<= {limit:g}",
                        images <= limit,
                    )
                )
    full = steps >= 10_000
    where = "memory" if args.memory else "local"
    rows.append(
        (
            f"media() of {steps:,} steps x 4 keys: requests",
            opened["requests"],
            float("nan"),
            f"<= {TARGET_REQUESTS}" + ("" if full else " (at 10,000)"),
            opened["requests"] <= TARGET_REQUESTS if full else None,
        )
    )
    rows.append((f"media() of {steps:,} steps x 4 keys: ms ({where})", opened["seconds"] * 1e3, math.nan, "", None))
    rows.append(
        (
            "stored bytes / Pillow PNG bytes, 512x512x3",
            size["object"],
            size["png"],
            f"ratio <= {TARGET_BYTES_RATIO:.2f}",
            size["object"] <= size["png"] * TARGET_BYTES_RATIO if size["png"] == size["png"] else None,
        )
    )
    rows.append(("  + its thumbnail (bytes)", size["object"] + size["thumbnail"], size["png"], "", None))
    if on_s3 is not None:
        rows.append(
            (
                f"Media tab of {steps:,} steps x 4 keys on S3+20 ms: s",
                on_s3["seconds"],
                math.nan,
                "<= 1" + ("" if full else " (at 10,000)"),
                on_s3["seconds"] <= 1.0 if full else None,
            )
        )
        rows.append(
            (
                f"Media tab of {steps:,} steps x 4 keys on S3+20 ms: requests",
                on_s3["requests"],
                math.nan,
                f"<= {TARGET_REQUESTS}" + ("" if full else " (at 10,000)"),
                on_s3["requests"] <= TARGET_REQUESTS if full else None,
            )
        )
    rows.append(("media thread: ms per 512x512x3 image", pace, float("nan"), "", None))
    lost = flood["calls"] - flood["stored"] - flood["waiting"]
    rows.append(
        (
            f"flood: {flood['calls']:,.0f} log() in {args.flood_seconds:g} s, spilled",
            flood["spilled"],
            math.nan,
            "",
            None,
        )
    )
    rows.append(("flood: log() p99 / max µs", flood["p99"] / 1000, flood["max"] / 1000, "", None))
    rows.append(("flood: stored by finish() / left in the spool", flood["stored"], flood["waiting"], "", None))
    rows.append(("flood: items lost", lost, math.nan, "0", lost == 0))
    print()
    ok = print_table(rows)
    print(f"\nlog() calls timed: {len(lat['log'])}; read back {int(opened['items']):,} media items")
    if stalls is not None:
        handed = stalls["handed"][0]
        where = "the helper process" if handed else "the training process (no helper)"
        print(f"stall run: images encoded and stored by {where} ({handed} handed over)")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
