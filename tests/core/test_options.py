"""Run options are typed once: a misspelt option is caught by the type checker, and refused before any I/O.

What a user would notice if this failed: ``lh.init("p", flush_intervall=2.0)``
passing ``mypy --strict`` and failing only at run time; a refusal that does
not say which option was meant; a refused call that already created the
store; an option missing from the reference.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import launchhelm as lh
import launchhelm.torch as lht
from launchhelm._compat import SessionOptions
from launchhelm._options import RUN_OPTIONS

ROOT = Path(__file__).resolve().parents[2]

# mypy as a user's project runs it (strict, on the oldest Python launchhelm supports), reading launchhelm
# from this checkout (the working folder comes first on mypy's search path). Errors inside launchhelm are
# not the user's; the frameworks and heavy libraries are not followed: their types are not what is checked
# here, and following torch alone takes minutes.
MYPY_CONFIG = """\
[mypy]
strict = True
python_version = 3.10

[mypy-launchhelm.*]
follow_imports = silent

[mypy-torch.*,lightning.*,lightning_utilities.*,transformers.*,accelerate.*,pandas.*,pyarrow.*,numpy.*,\
fsspec.*,s3fs.*,gcsfs.*,adlfs.*,azure.*,aiohttp.*,IPython.*,ipywidgets.*,anywidget.*,altair.*,tqdm.*,\
awscrt.*,psutil.*,pynvml.*,safetensors.*,msgspec.*,grimp.*]
follow_imports = skip
ignore_missing_imports = True
"""

SCRIPT = """\
import launchhelm as lh
import launchhelm.torch as lht
from launchhelm.lightning import LaunchHelmLogger
from launchhelm.transformers import LaunchHelmCallback

lh.init("p", {0})
lht.init("p", {1})
LaunchHelmLogger("p", {2})
LaunchHelmCallback("p", {3})
"""


def _mypy(folder: Path, script: str) -> tuple[int, list[str]]:
    """mypy's exit status and error lines for ``script``; the cache is shared by the scripts of one test."""
    folder.mkdir()
    (folder / "mypy.ini").write_text(MYPY_CONFIG)
    (folder / "user_script.py").write_text(script)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(folder / "mypy.ini"),
            "--cache-dir",
            str(folder.parent / "mypy-cache"),
            "--no-error-summary",
            str(folder / "user_script.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert not done.stderr.strip(), done.stderr
    return done.returncode, [line for line in done.stdout.splitlines() if ": error:" in line]


@pytest.mark.slow
def test_mypy_strict_names_each_misspelt_option_and_passes_the_right_spelling(tmp_path: Path) -> None:
    misspelt = ["flush_intervall", "heartbeat_intervall", "compaction_memori", "storage_option"]
    wrong = SCRIPT.format(
        "flush_intervall=2.0", "heartbeat_intervall=5.0", 'compaction_memori="64MiB"', "storage_option={}"
    )
    status, errors = _mypy(tmp_path / "wrong", wrong)
    assert status == 1, errors
    for line, name in enumerate(misspelt, start=6):
        assert [e for e in errors if f"user_script.py:{line}: error:" in e and f'"{name}"' in e], (name, errors)
    assert len(errors) == len(misspelt), errors

    right = SCRIPT.format(
        "flush_interval=2.0", "heartbeat_interval=5.0", 'compaction_memory="64MiB"', 'storage_options={"anon": True}'
    )
    assert _mypy(tmp_path / "right", right) == (0, [])

    # the values are typed too
    status, errors = _mypy(tmp_path / "types", SCRIPT.format('takeover="no"', "", "", ""))
    assert status == 1 and len(errors) == 1 and 'type "str"' in errors[0] and "bool" in errors[0], errors


@pytest.mark.parametrize(
    ("call", "misspelt", "meant"),
    [
        (lambda store: lh.init("p", store=store, flush_intervall=2.0), "flush_intervall", "flush_interval"),
        (
            lambda store: lht.init("p", store=store, heartbeat_intervall=5.0),
            "heartbeat_intervall",
            "heartbeat_interval",
        ),
        (lambda store: lh.init("p", store=store, confg={"lr": 1}), "confg", "config"),
        (lambda store: lh.init("p", store=store, zzz=1), "zzz", None),
    ],
)
def test_a_misspelt_option_is_refused_with_the_closest_name_before_the_store_is_touched(
    call: Callable[[str], object], misspelt: str, meant: str | None, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    with pytest.raises(lh.UnknownOptionError) as info:
        call(str(store))
    error = info.value
    assert isinstance(error, TypeError) and isinstance(error, lh.LaunchHelmError)
    assert error.option == misspelt and error.suggestion == meant
    assert f"unknown option {misspelt!r}" in str(error)
    if meant is not None:
        assert f"did you mean {meant!r}?" in str(error)
    assert "compaction_memory" in str(error)  # the valid names are listed
    assert not store.exists(), "a refused call wrote to the store"


def test_every_option_has_a_docstring_and_is_named_by_init() -> None:
    tree = ast.parse((ROOT / "launchhelm" / "_options.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunOptions"]
    documented = []
    for field, after in zip(cls.body, [*cls.body[1:], None], strict=True):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
            docstring = (
                after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
            )
            assert isinstance(docstring, str) and docstring.strip(), f"RunOptions.{field.target.id} has no docstring"
            documented.append(field.target.id)
    assert tuple(documented) == RUN_OPTIONS == tuple(lh.RunOptions.__annotations__)
    assert lh.init.__doc__ is not None
    assert [name for name in RUN_OPTIONS if f"``{name}``" not in lh.init.__doc__] == []


def test_the_drop_in_apis_options_are_run_options_of_the_same_types() -> None:
    def spelled(annotations: dict[str, object]) -> dict[str, object]:
        return {k: getattr(v, "__forward_arg__", v) for k, v in annotations.items()}

    run_options, session_options = spelled(lh.RunOptions.__annotations__), spelled(SessionOptions.__annotations__)
    assert {k: run_options.get(k) for k in session_options} == session_options
