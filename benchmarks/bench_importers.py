"""Benchmark of ``launchhelm import`` against each source's own reader reading the same data.

What is measured (one process, temporary folders, local LaunchHelm stores):

MLflow (``--mlflow-runs`` runs, default 100, in a sqlite tracking store made here by MLflow)
    Each run has 5 params, 3 tags and 3 metrics of ``--mlflow-steps`` steps (default 100).
    * baseline: MLflow's client reading everything an export needs: ``search_runs`` (paged) and
      ``get_metric_history`` of every metric of every run (s);
    * ``launchhelm.importers.import_mlflow`` into a fresh store: the same reads plus writing each
      run (segments, events, summary, record) (s), and the ratio import / baseline. The import
      works on 8 runs at once (its reads overlap other runs' writes); the baseline is the plain
      loop over the client a script would write;
    * reading every imported run back with ``Api().history(project)`` (s), against the baseline.

TensorBoard (``--tb-points`` scalars, default 1,000,000: 10 tags, one event per scalar, as
``SummaryWriter.add_scalar`` writes them)
    The event file is written here with TensorBoard's own ``Event`` protocol buffers (writing a
    million through ``SummaryWriter`` would take a minute by itself).
    * baseline: TensorBoard's ``EventAccumulator`` (every scalar kept: ``size_guidance=0``) loading
      the folder and returning each tag's scalars (s);
    * ``launchhelm.importers.import_tensorboard`` into a fresh store (LaunchHelm's own reader of the
      event file, every checksum verified, plus writing the run) (s), and the ratio;
    * reading the imported run back with ``RunHandle.history()`` (s).

Each import is checked against the baseline's values (same count, same float32 values) before
its time is printed. Imports of mlflow and tensorboard happen before any timing.

Run it from the repository root (needs the dev extra: mlflow-skinny, tensorboard)::

    python benchmarks/bench_importers.py
    python benchmarks/bench_importers.py --mlflow-runs 20 --tb-points 100000   # quicker
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TAGS = [f"train/metric_{i}" for i in range(10)]


def _timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def bench_mlflow(tmp: Path, runs: int, steps: int) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    import launchhelm as lh
    from launchhelm.importers import import_mlflow

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    made = time.perf_counter()
    experiment = client.create_experiment("bench")
    t0 = 1_700_000_000_000
    for r in range(runs):
        run_id = client.create_run(experiment, run_name=f"run-{r}", start_time=t0 + r).info.run_id
        metrics = [
            Metric(key, 1.0 / (s + 1) + r + k, t0 + 1000 * s + k, s)
            for s in range(steps)
            for k, key in enumerate(("loss", "acc", "lr"))
        ]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1,000 metrics a batch
            client.log_batch(
                run_id,
                metrics=metrics[i : i + 1000],
                params=[Param(f"p{j}", str(j * r)) for j in range(5)] if i == 0 else [],
                tags=[RunTag(f"t{j}", "x") for j in range(3)] if i == 0 else [],
            )
        client.set_terminated(run_id, end_time=t0 + 1000 * steps)
    points = runs * steps * 3
    made = time.perf_counter() - made
    print(f"MLflow store: {runs} runs x 3 metrics x {steps} steps = {points:,} points ({made:.1f}s to make)")

    def read_with_mlflow() -> int:
        fresh = MlflowClient(tracking_uri=uri)
        count = 0
        token = None
        while True:
            page = fresh.search_runs([experiment], max_results=1000, page_token=token)
            for run in page:
                for key in run.data.metrics:
                    count += len(fresh.get_metric_history(run.info.run_id, key))
            token = page.token
            if not token:
                return count

    base, count = _timed(read_with_mlflow)
    assert count == points, (count, points)
    store = str(tmp / "store-mlflow")
    took, result = _timed(lambda: import_mlflow(uri, "bench", store=store, progress=False))
    assert len(result.imported) == runs and sum(r.points for r in result.imported) == points
    back, frame = _timed(lambda: lh.Api(store).history("bench"))
    assert int(frame[["loss", "acc", "lr"]].notna().sum().sum()) == points
    print(f"  MLflow client reads every run and metric history   {base:8.2f} s")
    print(f"  launchhelm import mlflow (same reads + writing)    {took:8.2f} s   ratio {took / base:5.2f}x the read")
    print(f"  Api().history(project) reads all {runs} runs back   {back:8.2f} s   ratio {back / base:5.2f}x")


def _write_event_file(folder: Path, points: int) -> None:
    from awscrt.checksums import crc32c
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    def masked(data: bytes) -> int:
        crc = crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    folder.mkdir(parents=True)
    with open(folder / f"events.out.tfevents.{int(time.time())}.bench.1.0", "wb") as f:

        def record(data: bytes) -> None:
            header = struct.pack("<Q", len(data))
            f.write(header + struct.pack("<I", masked(header)) + data + struct.pack("<I", masked(data)))

        record(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        t0 = 1_700_000_000.0
        for i in range(points):
            step, tag = divmod(i, len(TAGS))
            value = Summary.Value(tag=TAGS[tag], simple_value=1.0 / (step + 1) + tag)
            record(Event(wall_time=t0 + i * 1e-3, step=step, summary=Summary(value=[value])).SerializeToString())


def bench_tensorboard(tmp: Path, points: int) -> None:
    from tensorboard.backend.event_processing import event_accumulator

    import launchhelm as lh
    from launchhelm.importers import import_tensorboard

    logdir = tmp / "tb"
    made, _ = _timed(lambda: _write_event_file(logdir / "run", points))
    size = sum(p.stat().st_size for p in (logdir / "run").iterdir())
    print(f"TensorBoard log: {points:,} scalars ({len(TAGS)} tags), {size / 2**20:.1f} MiB ({made:.1f}s to write)")

    def read_with_tensorboard() -> dict[str, list[float]]:
        acc = event_accumulator.EventAccumulator(str(logdir / "run"), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    base, expected = _timed(read_with_tensorboard)
    assert sum(map(len, expected.values())) == points
    store = str(tmp / "store-tb")
    took, result = _timed(lambda: import_tensorboard(logdir, "bench", store=store, progress=False))
    assert result.imported[0].points == points
    run = lh.Api(store).run(result.run_ids[0])
    back, frame = _timed(run.history)
    for tag, values in expected.items():
        assert frame[tag].tolist() == values, tag  # the same float32 values, exactly
    print(f"  TensorBoard EventAccumulator loads every scalar    {base:8.2f} s")
    print(f"  launchhelm import tensorboard (read + write)       {took:8.2f} s   ratio {took / base:5.2f}x the read")
    print(f"  RunHandle.history() reads the run back             {back:8.2f} s   ratio {back / base:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mlflow-runs", type=int, default=100)
    parser.add_argument("--mlflow-steps", type=int, default=100)
    parser.add_argument("--tb-points", type=int, default=1_000_000)
    args = parser.parse_args()
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    os.environ.setdefault("LAUNCHHELM_SPOOL", "off")
    started, _ = _timed(lambda: (__import__("mlflow.tracking"), __import__("tensorboard.compat.proto.event_pb2")))
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs; importing mlflow and tensorboard: {started:.1f}s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        bench_mlflow(Path(tmp), args.mlflow_runs, args.mlflow_steps)
        bench_tensorboard(Path(tmp), args.tb_points)


if __name__ == "__main__":
    main()
