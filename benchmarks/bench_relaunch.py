"""Benchmark of relaunches: what listening for a preemption notice costs, and how fast a notice is saved.

Preemption (issue 41 point 4):

Step cost of listening
    A loop of watched optimizer steps (``launchhelm.torch``, a one-parameter model and SGD, local
    store) with ``preemption=False`` and ``preemption=True``, in alternating rounds of ``--steps``
    steps; the median ns per step of each, and the difference (target: at most 0.1 µs a step).
    The signal handler raises the control flag the step hook already reads, so the difference
    should be noise.

Notice to published checkpoint
    A child process trains a model of ``--size-mb`` MB (square ``nn.Linear`` layers, SGD without
    state), first timing one ``save_checkpoint()`` called directly (the baseline), then trains on;
    this script sends SIGTERM and measures from the signal to the ``checkpoint`` event's time
    (same clock: one machine) and to the process's exit. Printed as ratios against the direct
    save measured in the same child. With ``--s3``: a moto_server behind the 20 ms proxy of
    ``tests/http_proxy.py``.

Relaunch to first trained step (auto_resume):
    A first launch (``LAUNCHHELM_RUN_ID`` set, ``auto_resume=True``) trains one step of the same model and
    saves; then, timed from ``Popen`` to the end of the first optimizer step after the restore: the
    relaunch (``import``, ``lht.init`` reopening the run, ``watch``, ``load_checkpoint("resume")``, one
    step), beside the baseline: a process that calls ``torch.load`` on the same bytes (
    ``weights_only=True``), ``load_state_dict`` and one step. Median of ``--relaunches`` each.

Run it on a quiet machine: ``python benchmarks/bench_relaunch.py --size-mb 400 [--s3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import launchhelm.torch as lht
    store, size_mb, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    width = 2048
    layers = max(1, round(size_mb * 1e6 / (width * width * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    tr = lht.init("bench-relaunch", store=store, preemption=True, preemption_budget=120,
                  system_metrics=False, capture_console=False)
    tr.watch(model, opt)
    opt.step()
    t = time.perf_counter()
    tr.save_checkpoint()
    direct = time.perf_counter() - t
    with open(out, "w") as f:
        json.dump({"direct_s": direct, "run_id": tr.id, "bytes": layers * width * width * 4}, f)
    while True:
        opt.step()  # no gradients: the step itself costs little; the boundary is what is measured
        time.sleep(0.001)
    """
)


def step_cost(steps: int, rounds: int) -> dict[str, float]:
    import torch

    import launchhelm.torch as lht

    results: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for on in (False, True):
            model = torch.nn.Linear(1, 1, bias=False)
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            model.weight.grad = torch.zeros_like(model.weight)
            tr = lht.init(
                "bench-relaunch",
                store=tmp,
                preemption=on,
                system_metrics=False,
                capture_console=False,
                flush_interval=3600,
                control_interval=3600,
            )
            tr.watch(model, opt)
            runs[on] = (tr, opt)
        for _ in range(rounds):
            for on in (False, True):
                _, opt = runs[on]
                t = time.perf_counter_ns()
                for _ in range(steps):
                    opt.step()
                results[on].append((time.perf_counter_ns() - t) / steps)
        for tr, _ in runs.values():
            tr.finish()
    off, on_ = statistics.median(results[False]), statistics.median(results[True])
    return {"off_ns": off, "on_ns": on_, "diff_ns": on_ - off}


def notice_to_checkpoint(size_mb: float, s3: bool) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cleanup = []
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        if s3:
            sys.path.insert(0, str(ROOT / "tests"))
            from http_proxy import RequestCounter

            port = _free_port()
            moto = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "moto_serial.py"), "127.0.0.1", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            cleanup.append(moto.terminate)
            _wait_for(f"http://127.0.0.1:{port}/moto-api/")
            import boto3

            creds = {
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
            os.environ.update(creds)
            boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket="bench")
            proxy = RequestCounter(port, latency=0.02)
            cleanup.append(proxy.close)
            env.update(creds, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
            store = "s3://bench/relaunch"
        out = Path(tmp) / "child.json"
        child = subprocess.Popen([sys.executable, "-c", CHILD, store, str(size_mb), str(out)], env=env, cwd=ROOT)
        try:
            while not out.exists():
                if child.poll() is not None:
                    raise RuntimeError(f"the child exited {child.returncode}")
                time.sleep(0.05)
            time.sleep(0.5)
            record = json.loads(out.read_text())
            sent = time.time()
            child.send_signal(signal.SIGTERM)
            child.wait(300)
            exited = time.time() - sent
        finally:
            if child.poll() is None:
                child.kill()
        import launchhelm as lh

        events = lh.Api(store).run(record["run_id"]).events()
        [published] = [e for e in events if e["type"] == "checkpoint"][-1:]
        for stop in cleanup:
            stop()
    return {
        "bytes": record["bytes"],
        "direct_s": record["direct_s"],
        "notice_to_published_s": float(published["time"]) - sent,
        "notice_to_exit_s": exited,
        "exit_code": child.returncode,
    }


RELAUNCH = textwrap.dedent(
    """
    import sys, time
    import torch
    store, size_mb, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    width = 2048
    layers = max(1, round(size_mb * 1e6 / (width * width * 4)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(4, width)
    def step():
        opt.zero_grad(); model(x).sum().backward(); opt.step()
    if mode == "baseline":
        state = torch.load(sys.argv[4], weights_only=True)
        model.load_state_dict(state)
        step()
    else:
        import launchhelm.torch as lht
        tr = lht.init("bench-relaunch", store=store, auto_resume=True, system_metrics=False, capture_console=False)
        tr.watch(model, opt)
        tr.load_checkpoint("resume")
        step()
        if mode == "first":
            tr.save_checkpoint()
            torch.save(model.state_dict(), sys.argv[4])
        tr.finish(close_run=False)
    print("stepped", time.time(), flush=True)
    """
)


def relaunch_to_first_step(size_mb: float, relaunches: int) -> dict[str, float]:
    """Median seconds from Popen to the first trained step: a relaunch (reopen + resume) vs torch.load."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), LAUNCHHELM_RUN_ID="benchrelaunch")
    with tempfile.TemporaryDirectory() as tmp:
        store, bundle = str(Path(tmp) / "store"), str(Path(tmp) / "weights.pt")

        def timed(mode: str) -> float:
            started = time.time()
            done = subprocess.run(
                [sys.executable, "-c", RELAUNCH, store, str(size_mb), mode, bundle],
                env=env, cwd=ROOT, capture_output=True, text=True, check=True,
            )  # fmt: skip
            return float(done.stdout.split()[-1]) - started

        timed("first")
        relaunch, baseline = [], []
        for _ in range(relaunches):  # alternated: a drift of the machine touches both alike
            relaunch.append(timed("relaunch"))
            baseline.append(timed("baseline"))
    return {"relaunch_s": statistics.median(relaunch), "baseline_s": statistics.median(baseline)}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, default=400.0)
    parser.add_argument("--steps", type=int, default=20000, help="steps a round in the step-cost loop")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--s3", action="store_true", help="also notice-to-checkpoint on moto S3 behind 20 ms")
    parser.add_argument("--relaunches", type=int, default=5, help="relaunches timed (each beside a baseline)")
    args = parser.parse_args()
    r = relaunch_to_first_step(args.size_mb, args.relaunches)
    print(
        f"relaunch to first trained step, {args.size_mb:.0f} MB, local store, median of {args.relaunches}: "
        f"{r['relaunch_s']:.2f} s (auto_resume reopen + load_checkpoint('resume')) vs {r['baseline_s']:.2f} s "
        f"(process start + torch.load of the same bytes): {r['relaunch_s'] / r['baseline_s']:.2f}x"
    )
    cost = step_cost(args.steps, args.rounds)
    print(
        f"watched optimizer step, median of {args.rounds} rounds of {args.steps}: preemption off "
        f"{cost['off_ns']:.0f} ns, on {cost['on_ns']:.0f} ns, listening costs {cost['diff_ns']:+.1f} ns a step "
        f"(target <= 100 ns)"
    )
    for s3 in (False, True) if args.s3 else (False,):
        r = notice_to_checkpoint(args.size_mb, s3)
        where = "S3 (moto) + 20 ms" if s3 else "local"
        print(
            f"{where}: {r['bytes'] / 1e6:.0f} MB: save called directly {r['direct_s']:.2f} s; SIGTERM to published "
            f"checkpoint {r['notice_to_published_s']:.2f} s ({r['notice_to_published_s'] / r['direct_s']:.2f}x the "
            f"direct save); to exit {r['notice_to_exit_s']:.2f} s (status {r['exit_code']})"
        )


if __name__ == "__main__":
    main()
