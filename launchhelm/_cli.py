"""The ``launchhelm`` command line: ``demo``, ``runs``, ``show``, ``tune``, ``watch``, ``gc``, ``export``..."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from launchhelm._api import Api
from launchhelm._evaluation._cli import add_commands as add_evaluation_commands
from launchhelm._evaluation._cli import print_evaluations
from launchhelm._exceptions import InvalidArgumentError, LaunchHelmError, StorageError
from launchhelm._gc import add_commands as add_gc_commands
from launchhelm._types import JSONValue
from launchhelm.importers._cli import add_commands as add_import_commands

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

    from launchhelm._views._runs import readable_runs

    with pd.option_context("display.max_columns", None, "display.width", 200):
        # local time and "3 min ago", durations: as the runs table in a notebook says it
        print(readable_runs(frame).to_string(index=False))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from launchhelm._views._humanize import STATUS_MEANING
    from launchhelm._views._runs import row_detail

    api = Api(args.store)
    run = api.run(args.run)
    summary = run.summary()
    status = summary["status"]
    print(f"run      {run.id}  {run.name!r}")
    print(f"project  {run.project}")
    print(f"status   {status}: {STATUS_MEANING.get(status, '')}")
    if status == "hung":
        print(f"hang     {summary.get('hang', '')}")
    detail = row_detail(summary)
    loop = run._restart_loop()
    if detail and status != "hung" and not loop:
        print(f"         {detail}")
    if loop:
        print(
            f"restart loop: the last {len(loop)} attempts each ended without a step past where they resumed; "
            "an auto_resume launch is refused until a checkpoint is chosen for resume"
        )
        for failed in loop:
            where = f" from checkpoint {failed['checkpoint']}" if failed["checkpoint"] else ""
            print(
                f"  {failed['session']}: {failed['ending']} ({failed['detail'] or 'no detail'}), "
                f"resumed at step {failed['step']}{where}"
            )
    heartbeat = run.last_heartbeat
    print(f"heartbeat {_fmt_time(heartbeat)}" + (f" ({time.time() - heartbeat:.0f}s ago)" if heartbeat else ""))
    print(f"step     {summary['step']} (furthest reached)")
    print(f"created  {_fmt_time(run.created)}")
    restarts = summary.get("restarts")
    print(
        f"sessions {summary['sessions']}, rewinds {summary['rewinds']}"
        + (f", restarts {restarts}" if isinstance(restarts, int) and restarts else "")
    )
    if run.config:
        print("config   " + ", ".join(f"{k}={v!r}" for k, v in run.config.items()))
    tunables = run.tunables
    if tunables:
        print("tunables " + ", ".join(f"{k}={v!r}" for k, v in tunables.items()))
    if status == "running":
        print(f"control  {run.control_state}")
    attempts = run.attempts()
    live = attempts[-1] if attempts and attempts[-1].ending == "running" else None
    if live is not None and live.helper is not None:
        # what `ps` on that host shows beside the training process
        print(f"helper   pid {live.helper}" + (f" on {live.host}" if live.host else ""))
    changes = run.control_changes()
    if changes:
        print("control changes:")
        for change in changes:
            what = change["what"]
            if what == "tunables":
                what = "set " + ", ".join(f"{k}={v!r}" for k, v in change["changes"].items())
            done = change["applied_at_step"]
            outcome = f"applied at step {done}" if done is not None else "pending"
            print(f"  {change['seq']:>4}  {_fmt_time(change['time'])}  {what:<28} {outcome}")
    if len(attempts) > 1 or any(a.launcher for a in attempts):
        print("attempts:")
        for i, attempt in enumerate(attempts):
            after = attempts[i + 1] if i + 1 < len(attempts) else None
            print(f"  {i + 1:>3}  {_fmt_time(attempt.started_at)}  {attempt.describe(after)}")
    rewinds = run.rewinds()
    if rewinds:
        print("rewinds:")
        for rewind in rewinds:
            print(f"  {rewind.describe()} (checkpoint {rewind.checkpoint}, attempt {rewind.attempt})")
    checkpoints = run.checkpoints()
    if checkpoints:
        latest = checkpoints[-1].id
        resume = run.resume_checkpoint()
        print('checkpoints ("latest" and "resume" say what load_checkpoint would restore now):')
        for ck in checkpoints:
            marks = []
            if ck.id == latest:
                marks.append("latest")
            if resume is not None and ck.id == resume.id:
                marks.append("resume" + (": chosen" if ck.chosen_for_resume else ""))
            if ck.before_last_control_change:
                marks.append("before last control change")
            line = f"  {ck.id}  step {ck.step:<7} {_fmt_time(ck.saved_at)}  {ck.size:>12,} B  "
            line += f"steps to redo {ck.steps_to_redo:<6}" + (f" [{'; '.join(marks)}]" if marks else "")
            print(line.rstrip())
    print_evaluations(run)
    if args.events:
        print("events:")
        for event in run.events():
            fields = {k: v for k, v in event.items() if k not in ("seq", "type", "time", "process")}
            print(f"  {event['seq']:>4}  {_fmt_time(event['time'])}  {event['type']:<16} {fields}")
    history = run.history(duplicates="last")
    keys = [c for c in history.columns if c not in ("step", "attempt", "time", "abandoned")]
    print(f"metrics: {len(history)} steps" + (f", keys {', '.join(keys)}" if keys else ""))
    if len(history):
        last = {k: history[k].dropna() for k in keys}
        print("  last: " + ", ".join(f"{k}={v.iloc[-1]:.6g}" for k, v in last.items() if len(v)))
    return 0


def _parse_value(text: str) -> JSONValue:
    """``1e-4`` -> 0.0001, ``true`` -> True, ``[0.9, 0.99]`` -> list; anything else stays a string."""
    try:
        value: JSONValue = json.loads(text)
    except ValueError:
        return text
    return value


def _cmd_tune(args: argparse.Namespace) -> int:
    changes: dict[str, JSONValue] = {}
    for item in args.changes:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgumentError(f"{item!r}: write NAME=VALUE, e.g. lr=1e-4")
        changes[name] = _parse_value(value)
    run = Api(args.store).run(args.run)
    seq = run.set_tunables(**changes)
    print(f"control change {seq}: {', '.join(f'{k}={v!r}' for k, v in changes.items())} for run {run.id}")
    print("the training process applies it at its next step boundary (see `launchhelm show RUN`)")
    return 0


def _cmd_control(args: argparse.Namespace) -> int:
    run = Api(args.store).run(args.run)
    seq = run.control(args.action)
    print(f"control change {seq}: {args.action} for run {run.id}; applied at its next step boundary")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from launchhelm._demo import run_demo

    return run_demo(store=args.store, steps=args.steps)


def _cmd_compact(args: argparse.Namespace) -> int:
    from launchhelm._metrics._compact import compact_run
    from launchhelm._metrics._layout import list_metrics, read_manifest

    api = Api(args.store)
    if not args.run and args.project is None:
        print("launchhelm compact: give run ids, or --project P (or both)", file=sys.stderr)
        return 2
    api.store.require_coordination("compacting a run's metrics")
    for run_id in args.run:
        api.run(run_id)  # RunNotFoundError before any write
        result = compact_run(api.store, run_id, by="launchhelm compact")
        listing = list_metrics(api.store, run_id)
        manifest = read_manifest(api.store, run_id, listing.newest_manifest)
        where = f"{len(manifest.segments)} segments (manifest {manifest.seq})"
        if result is None or not result.chunks:
            print(f"run {run_id}: nothing to compact; its points are in {where}")
            continue
        print(
            f"run {run_id}: compacted {result.chunks} chunks; its points are in {where}"
            + (f"; deleted {result.deleted} objects past the grace period" if result.deleted else "")
        )
    if args.project is not None:
        held = api.build_project_history(args.project)
        print(
            f"project {args.project}: its history dataset holds {held} settled runs "
            "(runs still running, or stopped without ending their session, are read by themselves)"
        )
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    from launchhelm._metrics._spool import recover_run, spool_root
    from launchhelm._runlog._runinfo import run_record
    from launchhelm._runlog._table import mark_row

    api = Api(args.store)
    root = spool_root()
    run_ids = args.run or sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else args.run
    if not run_ids:
        print(f"nothing to recover: no spooled metrics in {root}")
        return 0
    for run_id in run_ids:
        points = recover_run(api.store, run_id)
        if points:
            # the run changed without a session: touch its row so the runs table and the project
            # history dataset, which trust a row while its marker is unchanged, read it afresh
            mark_row(api.store, run_record(api.store, run_id)["project"], run_id, "recovered", "recovered")
        where = "" if points else " (none spooled by a dead session for this store)"
        print(f"run {run_id}: recovered {points} spooled point(s) and media item(s){where}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from launchhelm._views._runs import compare_text

    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    print(compare_text(Api(args.store), args.run, keys))
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    run = Api(args.store).run(args.run)
    if args.tail is not None and args.tail < 0:
        raise InvalidArgumentError(f"--tail {args.tail}: give a number of lines >= 0")
    if not args.follow:
        text = run.console(tail=args.tail)
        sys.stdout.write(text)
        if not text:
            print(f"run {run.id} has no console output (was it started with capture_console=False?)", file=sys.stderr)
        return 0
    follower = run.console_follower(tail=args.tail)
    try:
        while True:
            running = run.status == "running"
            text = follower.poll()  # after the status: what a session wrote before ending is read
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
            if not running:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def _cmd_export(args: argparse.Namespace) -> int:
    try:
        from launchhelm.torch._interop import export_checkpoint
    except ImportError as exc:
        from launchhelm._exceptions import MissingExtraError

        raise MissingExtraError(
            f"exporting a checkpoint needs torch ({exc}); install it with: pip install 'launchhelm[torch]'",
            extra="torch",
            package="torch",
        ) from None
    api = Api(args.store)
    done = export_checkpoint(api.store, args.run, args.checkpoint, format=args.format, out=args.out)
    how = (
        "torch.load(path, weights_only=True)"
        if done["format"] == "torch"
        else "torch.distributed.checkpoint.load(state_dict, checkpoint_id=path)"
    )
    print(
        f"checkpoint {done['checkpoint']} (step {done['step']}) of run {args.run} -> {done['path']}; read it with {how}"
    )
    return 0


def _cmd_watch(args: argparse.Namespace) -> int:
    from launchhelm._runlog._events import validate_project
    from launchhelm._watch import (
        DEFAULT_LEASE,
        Notice,
        Watcher,
        exec_delivery,
        parse_events,
        parse_since,
        post_delivery,
    )

    validate_project(args.project)
    events = parse_events(args.events)
    since = parse_since(args.since) if args.since is not None else None
    lease = DEFAULT_LEASE if args.lease is None else args.lease
    # a delivery must end well within the lease, or another watcher would tell the change again
    budget = lease / 2
    deliveries = []
    if args.exec is not None:
        deliveries.append(exec_delivery(args.exec, budget / (2 if args.post is not None else 1)))
    if args.post is not None:
        deliveries.append(post_delivery(args.post, budget / (2 if args.exec is not None else 1)))

    def deliver(notice: Notice) -> None:
        for one in deliveries:
            one(notice)
        print(f"told {notice['event']:<12} run {notice['run']} step {notice['step']}: {notice['detail']}", flush=True)

    api = Api(args.store)
    watcher = Watcher(
        api.store,
        args.project,
        deliver if deliveries else None,
        events=events,
        interval=args.interval,
        since=since,
        lease=lease,
    )
    if deliveries:
        how = " and ".join(w for w, given in (("--exec", args.exec), ("--post", args.post)) if given)
        print(
            f"watching project {args.project} on {api.store.url}: telling {','.join(events)} by {how}", file=sys.stderr
        )
    else:
        print(
            f"watching project {args.project} on {api.store.url}: printing changes only (no --exec or --post: "
            "nothing is claimed, so other watchers still tell them)",
            file=sys.stderr,
        )
    try:
        while True:
            try:
                told = watcher.poll()
            except StorageError as exc:  # the store may come back: a watcher outlives a blip
                if args.once:
                    raise
                print(f"launchhelm watch: the store did not answer ({exc}); trying again", file=sys.stderr)
                told = []
            if not deliveries:
                for notice in told:
                    print(json.dumps(notice), flush=True)
            if args.once:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


class _HelpWithExample(argparse.RawDescriptionHelpFormatter):
    """Wraps descriptions as argparse does; keeps an ``examples:`` epilog's lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example"):
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


# every help ends with an example (tests/core/test_cli_help.py parses each one with this parser)
_EXAMPLES = {
    "launchhelm": """examples:
  launchhelm runs quickstart     # the project's runs, newest first
  launchhelm show 1o5sxsjc       # one run: status, rewinds, checkpoints, metrics
  launchhelm --store s3://bucket/prefix runs quickstart""",
    "demo": "examples:\n  launchhelm demo --steps 300",
    "runs": "examples:\n  launchhelm runs quickstart\n  launchhelm --store s3://bucket/prefix runs quickstart",
    "show": "examples:\n  launchhelm show 1o5sxsjc --events",
    "tune": "examples:\n  launchhelm tune 1o5sxsjc lr=1e-4 grad_clip=0.5",
    "control": "examples:\n  launchhelm control 1o5sxsjc pause\n  launchhelm control 1o5sxsjc checkpoint",
    "compact": "examples:\n  launchhelm compact 1o5sxsjc\n  launchhelm compact --project quickstart",
    "recover": "examples:\n  launchhelm recover  # every run this host spooled",
    "compare": "examples:\n  launchhelm compare 1o5sxsjc 7k2m0qpz --keys train/loss,eval/accuracy",
    "logs": "examples:\n  launchhelm logs 1o5sxsjc --follow --tail 20",
    "import": "examples:\n  launchhelm import tensorboard runs/ --project vision\n"
    "  launchhelm import mlflow sqlite:///mlflow.db --project vision --experiment baseline\n"
    "  launchhelm import wandb wandb/ --project vision\n"
    "  launchhelm import dcp outputs/checkpoint/step-1000 --project llama --run from-torchtitan",
    "export": "examples:\n  launchhelm export 1o5sxsjc --format torch --out model.pt\n"
    "  launchhelm export 1o5sxsjc ckpt-00000064-3fa2b1c9 --format dcp --out ckpt-64/",
    "watch": "examples:\n  launchhelm watch vision --exec 'python notify.py' --events crashed,hung,restart_loop\n"
    "  launchhelm --store s3://bucket/prefix watch vision --post https://hooks.example.com/lh --interval 30",
    "gc": "examples:\n  launchhelm gc --keep-last 3 --dry-run  # list what would go\n"
    "  launchhelm --store s3://bucket/prefix gc --older-than 48h",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launchhelm",
        description="Experiment tracking that survives crashes.",
        epilog=_EXAMPLES["launchhelm"],
        formatter_class=_HelpWithExample,
    )
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
    show = sub.add_parser("show", help="a run's status, tunables, rewinds, checkpoints and metrics as text")
    show.add_argument("run")
    show.add_argument("--events", action="store_true", help="also print the run's whole event log")
    show.set_defaults(func=_cmd_show)
    tune = sub.add_parser("tune", help="change a running (or stopped) run's tunables: tune RUN lr=1e-4")
    tune.add_argument("run")
    tune.add_argument("changes", nargs="+", metavar="NAME=VALUE", help="values are JSON (1e-4, true, [1, 2])")
    tune.set_defaults(func=_cmd_tune)
    control = sub.add_parser("control", help="pause, resume, stop or checkpoint a running run")
    control.add_argument("run")
    control.add_argument("action", choices=["pause", "resume", "stop", "checkpoint"])
    control.set_defaults(func=_cmd_control)
    compact = sub.add_parser(
        "compact", help="merge a run's metric chunks into Parquet segments now (finishes what a dead session left)"
    )
    compact.add_argument("run", nargs="*")
    compact.add_argument(
        "--project",
        default=None,
        help="also merge the project's settled runs into its history dataset (what Api.history(project) reads)",
    )
    compact.set_defaults(func=_cmd_compact)
    recover = sub.add_parser(
        "recover", help="upload metrics a killed process on this host spooled but never flushed (all runs, or RUN)"
    )
    recover.add_argument("run", nargs="*")
    recover.set_defaults(func=_cmd_recover)
    compare = sub.add_parser("compare", help="runs side by side: their latest values and config diff")
    compare.add_argument("run", nargs="+", help="two or more run ids")
    compare.add_argument("--keys", default=None, help="metric keys to show, comma-separated (default: all)")
    compare.set_defaults(func=_cmd_compare)
    logs = sub.add_parser("logs", help="what a run's process printed (stdout and stderr), --follow while it runs")
    logs.add_argument("run")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new output until the run stops")
    logs.add_argument("--tail", "-n", type=int, default=None, help="only the last N lines (to start from)")
    logs.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    logs.set_defaults(func=_cmd_logs)
    export = sub.add_parser(
        "export",
        help="write a checkpoint as one torch.save file or a torch.distributed.checkpoint folder",
        description="Write a run's checkpoint (format /1, /2 or /3: shards are consolidated and verified) as one "
        "file torch.load(weights_only=True) reads, or a folder torch.distributed.checkpoint loads: the model, the "
        "optimizer, the step, and the scheduler and scaler when saved. Nothing is overwritten.",
    )
    export.add_argument("run")
    export.add_argument(
        "checkpoint",
        nargs="?",
        default="latest",
        help="a checkpoint id as `launchhelm show RUN` lists it (default: latest)",
    )
    export.add_argument("--format", required=True, metavar="torch|dcp", help="torch: one file; dcp: a DCP folder")
    export.add_argument("--out", required=True, metavar="PATH", help="where to write it (must not exist)")
    export.set_defaults(func=_cmd_export)
    watch = sub.add_parser(
        "watch",
        help="tell someone when a project's runs start, crash, hang, finish...: once, however many watchers run",
        description="Follow a project and, for each change of a run, run a command with the change as JSON on its "
        "stdin (--exec) or POST it to a URL (--post). Each change is claimed on the store first, so any number of "
        "watchers, on any machines, tell it exactly once; a change made while none ran is told when one starts. "
        "Without --exec or --post, changes are printed (as JSON lines) and nothing is claimed.",
    )
    watch.add_argument("project")
    watch.add_argument(
        "--store", dest="store", default=argparse.SUPPRESS, help="store URL (same as launchhelm --store)"
    )
    watch.add_argument("--exec", default=None, metavar="CMD", help="shell command run once per change, JSON on stdin")
    watch.add_argument("--post", default=None, metavar="URL", help="POST each change as JSON to URL (retried on 5xx)")
    watch.add_argument(
        "--events",
        default=None,
        metavar="E1,E2",
        help="changes to tell (default: all): started, relaunched, preempted, crashed, hung, restart_loop, finished, "
        "evaluation_failed",
    )
    watch.add_argument("--interval", type=float, default=10.0, metavar="S", help="seconds between polls (default 10)")
    watch.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="tell changes since WHEN: all, a time (2026-12-06T03:00:00Z), or how long ago (2h); default: since the "
        "last watcher of the project stopped, else now",
    )
    watch.add_argument("--once", action="store_true", help="poll once, tell what is new, and exit (cron, tests)")
    watch.add_argument("--lease", type=float, default=None, help=argparse.SUPPRESS)  # tests: seconds a claim holds
    watch.set_defaults(func=_cmd_watch)
    add_evaluation_commands(sub)
    add_gc_commands(sub)
    add_import_commands(sub)
    for name, command in sub.choices.items():
        command.formatter_class = _HelpWithExample
        command.epilog = command.epilog or _EXAMPLES.get(name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``launchhelm`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (LaunchHelmError, ValueError, TypeError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"launchhelm: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
