"""A training script that hangs, or crashes right after its load (``test_hangs.py``).

    python hang_worker.py --store URL --run-id ID [--stuck-at S --how py|gil|pause] [--crash-after-load]
        [--no-auto-resume] [--hang-timeout T] [--steps N] [--dist]

``--stuck-at S``: at step S the loop calls ``stuck_here()``, which blocks in ``time.sleep`` (``py``), in a C
call that keeps the GIL (``gil``: a mutex locked twice through ``ctypes.PyDLL``), or for ``--stuck-for`` seconds
and then goes on (``pause``). Checkpoints every 10 steps (``launchhelm.torch``); ``load_checkpoint("resume")`` on every
launch; ``--crash-after-load`` exits 1 right after the load, as a bad checkpoint or environment would.
``--dist``: a one-rank gloo process group, one ``all_reduce`` per step (torch's flight recorder records them).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

import launchhelm.torch as lht


def stuck_here(how: str, seconds: float) -> None:
    if how == "gil":
        # PyDLL: the GIL stays held for the whole call. Not libc's sleep(): the watchdog's dump signal ends it
        # early, and the thread then lets go of the GIL; a mutex locked twice waits through any signal.
        libc = ctypes.PyDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeroed: glibc's PTHREAD_MUTEX_INITIALIZER
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # a deadlock in C that keeps the GIL
    time.sleep(seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stuck-at", type=int, default=-1)
    parser.add_argument("--how", default="py")
    parser.add_argument("--stuck-for", type=float, default=3600.0)
    parser.add_argument("--hang-timeout", default="auto")
    parser.add_argument("--no-auto-resume", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--crash-after-load", action="store_true")
    parser.add_argument("--dist", action="store_true")
    args = parser.parse_args()
    if args.dist:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    timeout: float | str | None = args.hang_timeout
    if timeout not in ("auto", "none"):
        timeout = float(args.hang_timeout)
    elif timeout == "none":
        timeout = None
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    options: dict[str, object] = {"hang_timeout": timeout, "heartbeat_interval": 0.5, "control_interval": 0.5}
    if args.no_auto_resume:  # the script reopens by id, as without auto_resume: never refused
        if args.resume:
            run = lht.init("hangs", store=args.store, resume=args.run_id, **options)  # type: ignore[arg-type]
        else:
            run = lht.init("hangs", store=args.store, run_id=args.run_id, **options)  # type: ignore[arg-type]
    else:
        run = lht.init("hangs", store=args.store, run_id=args.run_id, auto_resume=True, **options)  # type: ignore[arg-type]
    run.watch(model, optimizer)
    start = 0
    if run.resumed:
        run.load_checkpoint("resume")
        start = run.global_step
        if args.crash_after_load:
            print("crashing right after the load", flush=True)
            os._exit(1)
    print(f"pid {os.getpid()} starts at step {start}", flush=True)
    while run.global_step < args.steps:
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if args.dist:
            dist.all_reduce(x)
        optimizer.step()  # advances run.global_step
        step = run.global_step
        run.log({"loss": float(loss)})
        if step % 10 == 0:
            run.save_checkpoint()
        print(f"step {step}", flush=True)
        if step == args.stuck_at:
            stuck_here(args.how, args.stuck_for)
        time.sleep(0.02)
    run.finish(close_run=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
