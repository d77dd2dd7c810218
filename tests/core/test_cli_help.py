"""`launchhelm --help` and every subcommand's help end with an example, and every example parses.

What a user would notice if this failed: a help page that tells what the options are but not how a
command line with them looks, or an example that the command itself rejects.
"""

from __future__ import annotations

import argparse
import shlex

import pytest

from launchhelm._cli import build_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def _helps() -> dict[str, str]:
    parser = build_parser()
    helps = {"launchhelm": parser.format_help()}
    helps.update({name: sub.format_help() for name, sub in _subcommands(parser).items()})
    return helps


def _examples(help_text: str) -> list[str]:
    """The command lines of the help's last paragraph, which must be its ``examples:``."""
    last = help_text.rstrip().split("\n\n")[-1].splitlines()
    assert last[0] in ("example:", "examples:"), f"the help ends with {last[0]!r}, not with an example"
    assert len(last) > 1, "an examples: heading with no example under it"
    return [line.strip() for line in last[1:]]


def test_every_subcommand_is_checked() -> None:
    names = set(_helps())
    # the commands of this release; one added later is checked by the test below too
    assert {"launchhelm", "demo", "runs", "show", "tune", "control", "compare", "logs", "gc"} <= names
    assert {"evaluate", "policy", "compact", "recover"} <= names


@pytest.mark.parametrize("name", sorted(_helps()))
def test_help_ends_with_an_example_the_parser_accepts(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    help_text = _helps()[name]
    examples = _examples(help_text)
    for example in examples:
        argv = shlex.split(example, comments=True)
        assert argv[0] == "launchhelm", example
        if name != "launchhelm":
            assert name in argv, f"the example of `launchhelm {name}` runs another command: {example}"
        args = build_parser().parse_args(argv[1:])  # a rejected example exits with SystemExit(2)
        assert name == "launchhelm" or args.command == name
