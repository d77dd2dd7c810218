"""The docs site builds strictly, and its reference covers every public name and command.

It builds the site with ``mkdocs build --strict`` (the ``docs`` extra) into a temporary folder and
reads the objects inventory mkdocstrings writes (``objects.inv``, the names the API reference
documents). Also the first-five-minutes promises of the README, the changelog's brevity, and the
LICENSE and CONTRIBUTING files.

What a user would notice if this failed: a public name with no reference page, a command missing
from the command line reference, a broken link in the site, a README that buries how to start.
"""

from __future__ import annotations

import ast
import html
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import launchhelm
import launchhelm.torch
import launchhelm.widgets
from launchhelm._cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed (pip install -e '.[docs]'?):\n{done.stderr[-6000:]}"
    return out


def inventory(site: Path) -> dict[str, str]:
    """Name -> page of every object in the site's Sphinx-style inventory."""
    raw = (site / "objects.inv").read_bytes()
    header, _, body = raw.partition(b"zlib.\n")
    assert header.startswith(b"# Sphinx inventory version 2"), header[:40]
    names = {}
    for line in zlib.decompress(body).decode().splitlines():
        name, _domain, _priority, page, *_ = line.split(" ")
        names[name] = page
    return names


def static_all(package: Path) -> list[str]:
    """A package's ``__all__`` as its ``__init__.py`` spells it."""
    tree = ast.parse((package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [str(ast.literal_eval(e)) for e in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{package} has no __all__")


@pytest.mark.slow
def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    names = inventory(site)
    public = [f"launchhelm.{n}" for n in launchhelm.__all__]
    public += [f"launchhelm.torch.{n}" for n in launchhelm.torch.__all__]
    public += [f"launchhelm.widgets.{n}" for n in launchhelm.widgets.__all__]
    for integration in ("lightning", "transformers"):  # read, not imported: importing them imports the framework
        public += [f"launchhelm.{integration}.{n}" for n in static_all(ROOT / "launchhelm" / integration)]
    missing = [n for n in public if n not in names]
    assert not missing, f"no reference entry (add a `::: name` line to docs/reference/*.md): {missing}"
    assert all(names[n].startswith("reference/") for n in public)
    # the pages name things by their public paths, never by the private modules that define them
    # (the inventory also lists those, as aliases of the same entries, for cross-references)
    for page in (site / "reference").glob("*/index.html"):
        text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))
        private = set(re.findall(r"launchhelm(?:\.\w+)*\._(?!_version__)\w+", text))
        assert not private, f"{page}: {sorted(private)}"
        assert not re.search(r":(class|func|meth|attr|exc):", text), f"{page}: a Sphinx role shown as text"
    # the members come along: a class's methods are entries too
    assert {"launchhelm.Run.log", "launchhelm.RunHandle.history", "launchhelm.torch.TorchRun.save_checkpoint"} <= set(
        names
    )


@pytest.mark.slow
def test_the_command_line_reference_has_every_subcommands_help(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name in subparsers.choices:
        assert f"usage: launchhelm {name}" in page, name
    assert page.count("examples:") >= len(subparsers.choices) + 1


@pytest.mark.slow
def test_the_site_shows_the_run_panel_screenshot_and_the_storage_format(site: Path) -> None:
    assert (site / "images" / "run-panel.png").stat().st_size > 10_000
    assert 'src="images/run-panel.png"' in (site / "index.html").read_text()
    assert (site / "storage" / "index.html").exists()
    assert "Unreleased" in (site / "changelog" / "index.html").read_text()


def test_the_readme_is_for_the_first_five_minutes() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 210, f"README.md has {len(lines)} lines: move the detail into docs/"
    first = "\n".join(lines[:40])
    assert "bash scripts/demo.sh" in first and "bash scripts/test.sh" in first
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", "\n".join(lines))
    assert "docs/images/run-panel.png" in images
    assert all((ROOT / image).exists() for image in images if "://" not in image)


def test_changelog_entries_are_a_line_or_two_for_users() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and "Keep a Changelog" in text
    entries = re.split(r"\n(?=- )|\n\n|\n#", text)
    long = [e for e in entries if e.startswith("- ") and (len(e.splitlines()) > 3 or len(e) > 400)]
    assert not long, f"entries over three lines (measurements go to docs/benchmarks.md): {long[:3]}"


def test_license_and_contributing_are_there() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert "bash scripts/test.sh" in contributing and "benchmarks/" in contributing
