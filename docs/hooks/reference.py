"""MkDocs hooks of the reference pages.

- ``docs/reference/cli.md`` holds a marker; it is replaced with ``launchhelm --help`` and each
  subcommand's ``--help``, so the page always says what the parser says.
- Docstrings name other objects with Sphinx roles (:class:`RunHandle`), which mkdocstrings renders
  as a literal ``:class:`` before the name: the role is dropped, the name's code kept.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

MARKER = "<!-- launchhelm-cli-help -->"
WIDTH = "80"  # argparse wraps at $COLUMNS: a fixed width keeps the page the same on every machine
SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj|py:\w+):(?=<code>)")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_reference() -> str:
    """The reference as Markdown: the top-level help, then one section per subcommand."""
    from launchhelm._cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        parts = ["## launchhelm", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in _subcommands(parser).items():
            parts += [f"## launchhelm {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    return SPHINX_ROLE.sub("", html)
