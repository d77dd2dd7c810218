"""The ``launchhelm`` command line: ``demo``, ``runs``, ``show``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from launchhelm._api import Api
from launchhelm._exceptions import LaunchHelmError

__all__ = ["main"]


def _fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _cmd_runs(args: argparse.Namespace) -> int:
    api = Api(args.store)
    frame = api.runs(args.project)
    if frame.empty:
        print(f"no runs in project {args.project!r} (store {api.store.url})")
        return 0
    import pandas as pd

    with pd.option_context("display.max_columns", None, "display.width", 200):
        shown = frame.copy()
        for col in ("created", "last_heartbeat"):
            shown[col] = shown[col].dt.tz_convert(None).dt.strftime("%Y-%m-%d %H:%M:%S")
        print(shown.to_string(index=False))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    api = Api(args.store)
    run = api.run(args.run)
    summary = run.summary()
    print(f"run      {run.id}  {run.name!r}")
    print(f"project  {run.project}")
    print(f"status   {summary['status']}")
    print(f"step     {summary['step']} (furthest reached)")
    print(f"created  {_fmt_time(run.created)}")
    print(f"sessions {summary['sessions']}, rewinds {summary['rewinds']}")
    if run.config:
        print("config   " + ", ".join(f"{k}={v!r}" for k, v in run.config.items()))
    print("events:")
    for event in run.events():
        detail = {k: v for k, v in event.items() if k not in ("seq", "type", "time", "process")}
        print(f"  {event['seq']:>4}  {_fmt_time(event['time'])}  {event['type']:<16} {detail}")
    rewinds = run.rewinds()
    if rewinds:
        print("rewinds:")
        for rewind in rewinds:
            print(f"  {rewind.describe()} (checkpoint {rewind.checkpoint}, attempt {rewind.attempt})")
    checkpoints = run.checkpoints()
    if checkpoints:
        print("checkpoints:")
        for ck in checkpoints:
            marks = " (chosen for resume)" if ck.chosen_for_resume else ""
            print(
                f"  {ck.id}  step {ck.step:<7} {_fmt_time(ck.saved_at)}  {ck.size:>12,} B  "
                f"steps to redo {ck.steps_to_redo}{marks}"
            )
    history = run.history(duplicates="last")
    keys = [c for c in history.columns if c not in ("step", "attempt", "time")]
    print(f"metrics: {len(history)} steps" + (f", keys {', '.join(keys)}" if keys else ""))
    if len(history):
        print("  last: " + ", ".join(f"{k}={history[k].iloc[-1]:.6g}" for k in keys))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from launchhelm._demo import run_demo

    return run_demo(store=args.store, steps=args.steps)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launchhelm", description="Experiment tracking that survives crashes.")
    parser.add_argument(
        "--store", default=None, help="store URL or path (default: $LAUNCHHELM_STORE, else ~/.launchhelm)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small PyTorch model, SIGKILL it, resume it, print the run")
    demo.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    demo.set_defaults(func=_cmd_demo)
    runs = sub.add_parser("runs", help="table of a project's runs")
    runs.add_argument("project")
    runs.set_defaults(func=_cmd_runs)
    show = sub.add_parser("show", help="a run's status, events and metrics as text")
    show.add_argument("run")
    show.set_defaults(func=_cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``launchhelm`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (LaunchHelmError, ValueError) as exc:
        print(f"launchhelm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
