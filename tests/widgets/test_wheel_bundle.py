"""The wheel ships the widgets' front end: the esbuild bundle (with vega,
vega-lite and vega-embed inside, nothing fetched from a CDN) is gitignored
build output, so hatch must be told to include it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from lhtest import ROOT

BUNDLE = ("chart.js", "picker.js", "evaluations.js", "details.js", "widgets.css")


def test_the_built_bundle_holds_vega_and_loads_nothing_from_a_cdn() -> None:
    static = ROOT / "launchhelm" / "widgets" / "static"
    chart = (static / "chart.js").read_text(encoding="utf-8")
    assert len(chart) > 300_000  # vega + vega-lite + vega-embed, minified
    for marker in ("vega-lite", "vega-embed"):
        assert marker in chart
    for cdn in ("cdn.jsdelivr.net", "unpkg.com", "esm.sh", "cdnjs"):
        assert cdn not in chart
    for name in BUNDLE[1:4]:
        assert "vega" not in (static / name).read_text(encoding="utf-8")  # the small widgets stay small


def test_the_wheel_contains_the_front_end_bundle(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = tmp_path.glob("launchhelm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in BUNDLE:
            member = f"launchhelm/widgets/static/{name}"
            assert member in names
            source = ROOT / "launchhelm" / "widgets" / "static" / name
            assert archive.read(member) == source.read_bytes()
    assert "launchhelm/widgets/_chart.py" in names and "launchhelm/_ipython.py" in names
    assert not any(n.startswith("js/") or "node_modules" in n for n in names)
