"""Where the training thread's stalls come from: a GIL watchdog and phase tags on the background work.

A watchdog thread sleeps 0.2 ms in a loop; when it wakes more than
``threshold`` late, some other thread held the GIL that long (or the OS did
not run the process: the noise floor, measured the same way beside a loop
that does no background work). Each late wake-up is put down to the phase
the background threads were in for most of that time: the phases are the
library's steps (chunk encoding, compaction's decode, Parquet writing,
summaries, store calls...), tagged by wrapping those functions while the
watch runs, and the garbage collector, tagged through ``gc.callbacks``.

Used by ``bench_log.py --explain`` and ``bench_soak.py``; nothing here is
imported by the library.
"""

from __future__ import annotations

import bisect
import functools
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

IDLE = "(no background step: noise, or the training thread itself)"


class RunDelay:
    """Seconds a thread has waited for a CPU so far (Linux schedstat; 0.0 elsewhere).

    A stall of the training thread is wall time it did not run: waiting for a
    CPU (other processes on a busy machine: noise) or blocked on the GIL
    (another thread of ours). The kernel counts the first per thread.
    """

    def __init__(self, native_id: int | None = None) -> None:
        tid = threading.get_native_id() if native_id is None else native_id
        try:
            self._fd: int | None = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 64, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):  # the thread ended
            return 0.0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Others:
    """The run-queue delay of every other thread of the process (refreshed as threads come and go)."""

    def __init__(self) -> None:
        self._me = threading.get_native_id()
        self._threads: dict[int, RunDelay] = {}
        self._listed = 0.0

    def __call__(self) -> dict[int, float]:
        now = time.monotonic()
        if now - self._listed > 0.5:
            self._listed = now
            try:
                alive = {int(t) for t in os.listdir("/proc/self/task")} - {self._me}
            except OSError:
                alive = set()
            for tid in set(self._threads) - alive:
                self._threads.pop(tid).close()
            for tid in alive - set(self._threads):
                self._threads[tid] = RunDelay(tid)
        return {tid: rd() for tid, rd in self._threads.items()}


class Watch:
    """Collect late wake-ups (stalls) and the background phases' timeline."""

    def __init__(self, threshold_ms: float = 1.0, nap_s: float = 0.0002) -> None:
        self.threshold = threshold_ms / 1000
        self.nap = nap_s
        self.stalls: list[tuple[float, float]] = []  # (start, end) in perf_counter seconds
        self.wakeups = 0
        self.noise = 0  # late wake-ups explained by waiting for a CPU, not for the GIL
        # timeline: (time, thread ident, innermost phase or None) appended on every enter and exit
        self.timeline: list[tuple[float, int, str | None]] = []
        self._stacks: dict[int, list[str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._patched: list[tuple[Any, str, Any]] = []
        self._main = threading.main_thread().ident

    # -- phases -------------------------------------------------------------------------
    def enter(self, name: str) -> None:
        ident = threading.get_ident()
        stack = self._stacks.setdefault(ident, [])
        stack.append(name)
        self.timeline.append((time.perf_counter(), ident, name))

    def leave(self) -> None:
        ident = threading.get_ident()
        stack = self._stacks.get(ident)
        if stack:
            stack.pop()
        self.timeline.append((time.perf_counter(), ident, stack[-1] if stack else None))

    def wrap(self, owner: Any, attr: str, name: str | None = None, *, main_too: bool = False) -> None:
        """Tag calls of ``owner.attr`` (a function or method) as phase ``name`` in background threads
        (and in the training thread too with ``main_too``)."""
        original = owner.__dict__[attr] if attr in getattr(owner, "__dict__", {}) else getattr(owner, attr)
        fn = original.__func__ if isinstance(original, staticmethod) else original
        label = name or attr
        watch = self
        main = -1 if main_too else self._main

        @functools.wraps(fn)
        def tagged(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == main:
                return fn(*args, **kwargs)
            watch.enter(label)
            try:
                return fn(*args, **kwargs)
            finally:
                watch.leave()

        replacement: Any = staticmethod(tagged) if isinstance(original, staticmethod) else tagged
        setattr(owner, attr, replacement)
        self._patched.append((owner, attr, original))

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() == self._thread_ident():
            return
        if phase == "start":
            self.enter(
                f"gc gen{info['generation']}" + (" (training thread)" if threading.get_ident() == self._main else "")
            )
        else:
            self.leave()

    def _thread_ident(self) -> int | None:
        return self._thread.ident if self._thread is not None else None

    # -- the watchdog ---------------------------------------------------------------------
    def _run(self) -> None:
        pc = time.perf_counter
        nap, threshold = self.nap, self.threshold
        stop = self._stop.is_set
        sleep = time.sleep
        queued, others = RunDelay(), Others()
        while not stop():
            q0, o0 = queued(), others()
            t0 = pc()
            sleep(nap)
            t1 = pc()
            self.wakeups += 1
            late = t1 - t0 - nap
            if late > threshold:
                # waiting for a CPU (the run queue) is the machine's noise, ours and the GIL holder's
                # (whichever other thread waited longest); the rest is waiting for the GIL
                o1 = others()
                holder = max((o1[t] - o0[t] for t in o1.keys() & o0.keys()), default=0.0)
                gil = late - (queued() - q0) - holder
                if gil > threshold:
                    self.stalls.append((t1 - gil, t1))
                else:
                    self.noise += 1

    def start(self) -> None:
        gc.callbacks.append(self._gc)
        self._thread = threading.Thread(target=self._run, name="gil-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched.clear()

    # -- the findings ------------------------------------------------------------------------
    def attribute(self) -> dict[str, list[float]]:
        """Stall lengths (ms) by the phase that overlapped each stall most."""
        times = [t for t, _, _ in self.timeline]
        # the innermost phase of each thread over time: replay the timeline
        per_thread: dict[int, list[tuple[float, str | None]]] = {}
        for t, ident, phase in self.timeline:
            per_thread.setdefault(ident, []).append((t, phase))
        out: dict[str, list[float]] = {}
        for start, end in self.stalls:
            best, best_overlap = IDLE, 0.0
            for spans in per_thread.values():
                ts = [t for t, _ in spans]
                i = max(0, bisect.bisect_right(ts, start) - 1)
                while i < len(spans) and spans[i][0] < end:
                    t, phase = spans[i]
                    nxt = spans[i + 1][0] if i + 1 < len(spans) else end
                    overlap = min(end, nxt) - max(start, t)
                    if phase is not None and overlap > best_overlap:
                        best, best_overlap = phase, overlap
                    i += 1
            out.setdefault(best, []).append((end - start) * 1000)
        del times
        return out

    def table(self, title: str) -> list[str]:
        """Lines: phase, count of stalls over the threshold, longest and total (ms)."""
        found = self.attribute()
        lines = [
            f"{title}: {self.wakeups:,} watchdog wake-ups; {len(self.stalls)} waited over "
            f"{self.threshold * 1000:.1f} ms for the GIL, {self.noise} more were late waiting for a CPU (noise)",
            f"    {'phase holding the GIL':<52}{'count':>7}{'max ms':>9}{'total ms':>10}",
        ]
        for phase, lengths in sorted(found.items(), key=lambda kv: -max(kv[1])):
            lines.append(f"    {phase[:52]:<52}{len(lengths):>7}{max(lengths):>9.2f}{sum(lengths):>10.1f}")
        if not found:
            lines.append("    (none)")
        return lines


def tag_library(watch: Watch) -> None:
    """Wrap the background steps of a live session (flusher, compactor, summaries, store calls)."""
    import launchhelm._metrics._compact as compact_module
    import launchhelm._metrics._flusher as flusher_module
    import launchhelm._metrics._segments as segments_module
    import launchhelm._metrics._spool as spool_module
    import launchhelm._run as run_module
    import launchhelm._runlog._summary_writer as summary_module
    import launchhelm.storage as storage_module

    run_cls = run_module.Run
    for attr, name in (
        ("_flush", "flush (other)"),
        ("_compact", "compact (other)"),
        ("_poll_controls", "control poll"),
        ("_flush_console", "console"),
    ):
        if hasattr(run_cls, attr):
            watch.wrap(run_cls, attr, name)
    flusher = flusher_module.MetricFlusher
    for attr, name in (("write_chunk", "flush: write chunk (other)"), ("put_back", "flush: put back")):
        watch.wrap(flusher, attr, name)
    watch.wrap(flusher, "cut", "cut buffer (training thread)", main_too=True)
    for attr, name in (
        ("encode_buffer", "flush: encode chunk (Arrow IPC)"),
        ("read_spool", "flush: read spool"),
        ("give_back_free_heap", "heap trim (malloc_trim)"),
    ):
        watch.wrap(flusher_module, attr, name)
    writer = summary_module.SummaryWriter
    for attr, name in (("note_latest", "flush: latest values"), ("heartbeat", "heartbeat"), ("put", "summary: put")):
        watch.wrap(writer, attr, name)
    comp = compact_module.Compactor
    for attr, name in (
        ("_write_segment", "compact: write segment (other)"),
        ("_segment_files", "compact: segment files"),
        ("_upload", "compact: upload"),
        ("_collect_live", "compact: collect"),
        ("collect", "compact: collect"),
        ("_keep_local", "compact: keep local"),
    ):
        if hasattr(comp, attr):
            watch.wrap(comp, attr, name)
    for attr, name in (
        ("decode_chunk", "compact: decode chunk"),
        ("plain_points", "compact: plain points"),
        ("give_back_free_heap", "heap trim (malloc_trim)"),
    ):
        if hasattr(compact_module, attr):
            watch.wrap(compact_module, attr, name)
    del segments_module
    spool_cls = spool_module.Spool
    for attr, name in (("flushed", "spool: flushed (unlink)"), ("pending", "spool: pending")):
        watch.wrap(spool_cls, attr, name)
    watch.wrap(spool_cls, "_open_next", "spool: next file (training thread)", main_too=True)
    watch.wrap(spool_cls, "prepare", "spool: prepare next file")
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        watch.wrap(pq.ParquetWriter, "write_table", "compact: Parquet write_table")
        watch.wrap(pq.ParquetWriter, "close", "compact: Parquet close")
        watch.wrap(pq.ParquetWriter, "__init__", "compact: Parquet open")
        watch.wrap(pa, "concat_tables", "compact: concat_tables")
        watch.wrap(pc, "min_max", "compact: min_max")
    except ImportError:
        pass
    # the store's calls, whatever the store
    for cls in vars(storage_module).values():
        if isinstance(cls, type) and issubclass(cls, storage_module.Store):
            for attr in ("create", "put", "read_many", "delete_many", "download", "upload", "get", "list"):
                if attr in cls.__dict__:
                    watch.wrap(cls, attr, f"store.{attr}")


@contextmanager
def watching(threshold_ms: float = 1.0, tag: bool = True) -> Iterator[Watch]:
    """A running :class:`Watch` (with the library's steps tagged unless ``tag`` is False)."""
    watch = Watch(threshold_ms)
    if tag:
        tag_library(watch)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


def run_with(fn: Callable[[], Any], threshold_ms: float = 1.0) -> tuple[Any, Watch]:
    with watching(threshold_ms) as watch:
        result = fn()
    return result, watch


# -- each background step alone ----------------------------------------------------------------
def _longest_hold(fn: Callable[[], Any], repeat: int, nap: float = 0.0002) -> tuple[float, float, float]:
    """Run ``fn`` ``repeat`` times in a worker thread while this thread naps 0.2 ms in a loop.

    Returns the longest wait for the GIL during one call (ms; the run-queue
    waits of both threads taken out), as the median over the calls and the
    largest, and the median wall time of one call (ms). The median is what
    the step does; the largest has the machine's noise in it too.
    """
    pc = time.perf_counter
    walls: list[float] = []
    holds: list[float] = []
    current = [0.0]
    state = {"running": False, "done": False, "tid": 0}

    def work() -> None:
        state["tid"] = threading.get_native_id()
        for _ in range(repeat):
            time.sleep(0.005)  # the watchdog settles
            current[0] = 0.0
            state["running"] = True
            t0 = pc()
            fn()
            walls.append(pc() - t0)
            state["running"] = False
            holds.append(current[0])
        state["done"] = True

    queued = RunDelay()
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    while not state["tid"]:
        time.sleep(0.0001)
    holder = RunDelay(int(state["tid"]))
    while not state["done"]:
        q0, h0 = queued(), holder()
        running = state["running"]
        t0 = pc()
        time.sleep(nap)
        late = pc() - t0 - nap - (queued() - q0) - (holder() - h0)
        if running or state["running"]:
            current[0] = max(current[0], late)
    thread.join()
    holder.close()
    queued.close()
    holds.sort()
    walls.sort()
    return holds[len(holds) // 2] * 1000, holds[-1] * 1000, walls[len(walls) // 2] * 1000


def probe_steps(repeat: int = 5) -> list[tuple[str, float, float, float]]:
    """Each background step of a live session alone, on realistic sizes: (step, longest GIL hold ms
    (median over calls, and largest), median wall ms). A step that holds the GIL long stalls the
    training thread that long. The first row, a call that does nothing, is the machine's noise."""
    import tempfile
    from pathlib import Path

    import numpy as np

    from launchhelm._metrics._buffer import KeyIds, PointBuffer, read_spool
    from launchhelm._metrics._compact import Compactor
    from launchhelm._metrics._points import encode_buffer
    from launchhelm._metrics._segments import decode_chunk
    from launchhelm._metrics._spool import Spool
    from launchhelm.storage import open_store

    def buffer(values: int, per_row: int = 5) -> PointBuffer:
        keys = KeyIds()
        out = PointBuffer(keys, 1 << 62)
        for s in range(values // per_row):
            x = float(s)
            out.append(s, 0, 1.7e9 + x, {f"m{j}": x + j for j in range(per_row)})
        return out

    results: list[tuple[str, float, float, float]] = []

    def probe(name: str, fn: Callable[[], Any], times: int = repeat) -> None:
        results.append((name, *_longest_hold(fn, times)))

    probe("nothing (the noise floor)", lambda: None)
    tmp = Path(tempfile.mkdtemp(prefix="gilwatch-"))
    try:
        small, full = buffer(1_000), buffer(512 * 1024)
        probe("encode a chunk, 1k values (a 2 s flush at 500 values/s)", lambda: encode_buffer(small))
        probe("encode a chunk, 512k values (a full buffer at 64 MiB)", lambda: encode_buffer(full))
        probe("latest values of a 512k-value buffer (summary)", full.latest)
        probe("step range of a 512k-value buffer", full.step_range)
        blob = encode_buffer(full)
        probe("decode a 512k-value chunk (compaction)", lambda: decode_chunk(blob))
        store = open_store(str(tmp / "store"))
        probe("store.create of a 512k-value chunk (local)", lambda: store.create(f"x/{os.urandom(6).hex()}", blob))
        compactor = Compactor(store, "probe", by="probe")
        small_blob = encode_buffer(small)
        pending: dict[str, Path] = {}

        def level0() -> Any:
            return compactor._write_segment(iter([decode_chunk(small_blob) for _ in range(32)]), 0, pending)

        probe("write an L0 segment of 32 chunks x 1k values", level0)
        big = [compactor._write_segment(iter([decode_chunk(blob)]), 1, pending) for _ in range(8)]
        for ref in big:
            compactor._local[ref.key] = pending.pop(ref.key)
        probe(
            "merge 8 segments of 512k points (a level-2 merge)",
            lambda: compactor._write_segment(compactor._segment_batches(big), 2, pending),
            times=3,
        )
        spool = Spool("probe", "s", {}, directory=tmp / "spool")
        for s in range(100_000):
            spool.append(s, 0, 1.7e9, {"loss": 1.0, "lr": 2.0, "grad_norm": float(s)})
        with spool._lock:
            end, names = spool.position(), spool.key_names()
        probe(
            "read back 100k spooled rows (spilled flush)",
            lambda: list(read_spool(spool.dir, "s", (0, 8), end, names, max_bytes=12 * 512 * 1024)),
        )
        spool.close(remove=True)
        compactor.close()
        del np
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return results
