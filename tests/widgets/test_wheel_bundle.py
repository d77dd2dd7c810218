"""Every install carries the widgets' front end: the esbuild bundle (vega,
vega-lite and vega-embed inside, nothing fetched from a CDN) is gitignored
build output, so the package build itself runs npm (a hatch-jupyter-builder
hook). Built here from a clean ``git clone``, as ``pip install git+…`` does."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from lhtest import ROOT, child_env

BUNDLE = (
    "chart.js",
    "picker.js",
    "evaluations.js",
    "details.js",
    "runs_table.js",
    "compare.js",
    "media.js",
    "widgets.css",
)
CDNS = ("cdn.jsdelivr.net", "unpkg.com", "esm.sh", "cdnjs")


def check_bundle(files: dict[str, bytes]) -> None:
    """``files``: bundle name -> its bytes, from a wheel or an sdist."""
    assert sorted(files) == sorted(BUNDLE)
    chart = files["chart.js"].decode("utf-8")
    assert len(chart) > 300_000  # vega + vega-lite + vega-embed, minified
    for marker in ("vega-lite", "vega-embed"):
        assert marker in chart
    for text in files.values():
        assert not any(cdn in text.decode("utf-8") for cdn in CDNS)
    for name in BUNDLE[1:4]:
        assert b"vega" not in files[name]  # the small widgets stay small


def test_the_built_bundle_holds_vega_and_loads_nothing_from_a_cdn() -> None:
    static = ROOT / "launchhelm" / "widgets" / "static"
    check_bundle({name: (static / name).read_bytes() for name in BUNDLE})


def clean_clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    done = subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (clone / "launchhelm" / "widgets" / "static").exists()  # gitignored: a clone has no bundle
    return clone


def build(clone: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # --no-isolation: the dev extras (hatchling, hatch-jupyter-builder) are the build's requirements
    return subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), *args],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(**env),
    )


@pytest.mark.slow
def test_a_wheel_and_an_sdist_from_a_clean_clone_carry_the_front_end(tmp_path: Path) -> None:
    clone = clean_clone(tmp_path)
    dist = tmp_path / "dist"
    done = build(clone, dist)  # the sdist (npm runs here), then the wheel built from that sdist
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "npm run build" in done.stdout + done.stderr

    (wheel,) = dist.glob("launchhelm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        static = "launchhelm/widgets/static/"
        check_bundle({n.rsplit("/", 1)[1]: archive.read(n) for n in names if n.startswith(static)})
    assert "launchhelm/widgets/_chart.py" in names and "launchhelm/_ipython.py" in names
    assert not any(n.startswith("js/") or "node_modules" in n for n in names)

    (sdist,) = dist.glob("launchhelm-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1]: m for m in archive.getmembers() if m.isfile()}
        static = {
            name.rsplit("/", 1)[1]: archive.extractfile(member).read()  # type: ignore[union-attr]
            for name, member in members.items()
            if name.startswith("launchhelm/widgets/static/")
        }
    check_bundle(static)
    assert "js/src/chart.js" in members and "js/package-lock.json" in members  # it can be rebuilt
    assert not any("node_modules" in name for name in members)


EDITABLE = """
import sys
import hatchling.build
print(hatchling.build.build_editable(sys.argv[1]))
"""


@pytest.mark.slow
def test_an_editable_install_from_a_clean_clone_builds_the_front_end(tmp_path: Path) -> None:
    clone = clean_clone(tmp_path)
    out = tmp_path / "editable"
    # the PEP 660 hook `pip install -e . --no-build-isolation` calls (called directly: pip would also
    # uninstall the launchhelm this test environment runs from, and the clone has no node_modules)
    done = subprocess.run(
        [sys.executable, "-c", EDITABLE, str(out)],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "npm run build" in done.stdout + done.stderr
    static = clone / "launchhelm" / "widgets" / "static"
    check_bundle({name: (static / name).read_bytes() for name in BUNDLE})  # built in place, beside the sources

    (wheel,) = out.glob("launchhelm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (pth,) = [n for n in archive.namelist() if n.endswith(".pth")]
        assert archive.read(pth).decode().strip() == str(clone)  # the install imports the clone itself
    # and that clone's widgets find their front end
    shown = subprocess.run(
        [sys.executable, "-c", "from launchhelm.widgets._base import front_end; print(repr(front_end('chart.js')[2]))"],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(PYTHONPATH=str(clone)),
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.strip() == "''"  # nothing missing


@pytest.mark.slow
def test_a_build_that_ends_without_the_bundle_fails_loudly(tmp_path: Path) -> None:
    clone = clean_clone(tmp_path)
    # npm skipped: hatch-jupyter-builder's ensured-targets must stop the build rather than ship a wheel without it
    done = build(clone, tmp_path / "dist", "--wheel", HATCH_JUPYTER_BUILDER_SKIP_NPM="1")
    assert done.returncode != 0
    assert "launchhelm/widgets/static/chart.js" in done.stdout + done.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))
