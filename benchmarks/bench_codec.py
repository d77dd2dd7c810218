"""Benchmark of the JSON codec behind the run log: the standard library beside msgspec.

Records (events, summaries, heartbeats, run and checkpoint records) are TypedDicts encoded with
``json``. msgspec's ``Struct`` types and codec were the other choice; this measures what it would
change where a person waits for JSON:

* a real run's events, made here: a torch run on a local store that logs, saves ``--checkpoints``
  checkpoints and rewinds a few times (each a real ``load_checkpoint``), then finishes;
* decoding and encoding those events' bytes, ``--rounds`` times over, with ``json`` and with
  ``msgspec.json`` (untyped: the same dicts come back), best of 5;
* beside that, what a reader waits for end to end: a fresh ``EventLog(...).state()`` of the run
  from the store (listing, reading and folding every event), best of 5. The JSON share of it is
  the most a faster codec could save.

Run it from the project's virtual environment (msgspec is not a dependency: install it to run this)::

    python benchmarks/bench_codec.py [--checkpoints 200]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _best(fn: Callable[[], object], tries: int = 5) -> float:
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    import msgspec
    import torch

    import launchhelm.torch as lht
    from launchhelm._runlog._events import EventLog
    from launchhelm.storage import open_store
    from launchhelm.storage._keys import events_prefix

    root = Path(tempfile.mkdtemp(prefix="bench-codec-"))
    tr = lht.init("bench-codec", store=str(root), system_metrics=False, capture_console=False)
    model = torch.nn.Linear(8, 8)
    tr.watch(model, torch.optim.SGD(model.parameters(), lr=0.1))
    saved: list[str] = []
    for step in range(1, args.checkpoints + 1):
        tr.log({"loss": 1.0 / step}, step=step)
        saved.append(str(tr.save_checkpoint(extra={"step": step})))
        if step % 50 == 0:
            tr.load_checkpoint(saved[-10])  # a rewind event
    tr.finish()

    store = open_store(str(root))
    keys = [k for k in store.list(events_prefix(tr.id)) if "snapshot" not in k]
    blobs = [store.read(f"{events_prefix(tr.id)}/{k}") for k in keys]
    events = [json.loads(b) for b in blobs]
    assert msgspec.json.decode(blobs[0]) == events[0]
    size = sum(map(len, blobs))
    decoder, encoder = msgspec.json.Decoder(), msgspec.json.Encoder()

    def each(fn: Callable[[bytes], object]) -> Callable[[], None]:
        return lambda: [fn(b) for _ in range(args.rounds) for b in blobs] and None

    def each_event(fn: Callable[[object], object]) -> Callable[[], None]:
        return lambda: [fn(e) for _ in range(args.rounds) for e in events] and None

    n = len(blobs) * args.rounds
    rows = {
        "decode, json.loads": _best(each(json.loads)),
        "decode, msgspec.json": _best(each(decoder.decode)),
        "encode, json.dumps": _best(each_event(lambda e: json.dumps(e, separators=(",", ":")).encode())),
        "encode, msgspec.json": _best(each_event(encoder.encode)),
    }
    state = _best(lambda: EventLog(store, tr.id).state())
    json_share = rows["decode, json.loads"] / args.rounds / state

    print(f"== {len(blobs)} events of a real run ({size / len(blobs):.0f} bytes each on average) ==")
    for name, seconds in rows.items():
        print(f"{name}: {seconds / n * 1e6:.2f} µs an event")
    print(
        f"msgspec decodes {rows['decode, json.loads'] / rows['decode, msgspec.json']:.1f}x as fast, "
        f"encodes {rows['encode, json.dumps'] / rows['encode, msgspec.json']:.1f}x"
    )
    print(
        f"reading the run's state from a local store: {state * 1e3:.1f} ms, of which json.loads "
        f"{json_share:.0%}: the most a faster codec saves there (and less on an object store)"
    )


if __name__ == "__main__":
    main()
