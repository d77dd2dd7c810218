"""The package surface: light to import, one sorted public namespace, an
exception tree whose members are also the built-ins callers catch."""

from __future__ import annotations

import pytest
from lhtest import run_python

import launchhelm as lh
import launchhelm.storage


def test_import_launchhelm_pulls_in_no_heavy_dependency() -> None:
    done = run_python(
        """
        import sys
        import launchhelm, launchhelm.storage, launchhelm.widgets
        heavy = [m for m in ("torch", "pandas", "pyarrow", "altair", "IPython", "numpy", "fsspec") if m in sys.modules]
        print(",".join(heavy) or "none")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"


@pytest.mark.parametrize("module", [lh, launchhelm.storage])
def test_public_names_are_sorted_and_exist(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert names == sorted(names)
    for name in names:
        assert getattr(module, name) is not None, name
        obj = getattr(module, name)
        if callable(obj):
            assert obj.__doc__, f"{name} has no docstring"


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (lh.StorageError, OSError),
        (lh.AlreadyExistsError, FileExistsError),
        (lh.ObjectNotFoundError, FileNotFoundError),
        (lh.RunNotFoundError, KeyError),
        (lh.RunClosedError, RuntimeError),
        (lh.RunInUseError, RuntimeError),
        (lh.InvalidMetricError, ValueError),
        (lh.CheckpointError, RuntimeError),
        (lh.CoordinationUnsupportedError, lh.StorageError),
    ],
)
def test_every_error_is_a_launchhelm_error_and_the_builtin_callers_catch(error: type, builtin: type) -> None:
    assert issubclass(error, lh.LaunchHelmError)
    assert issubclass(error, builtin)


def test_run_not_found_message_is_readable_not_a_repr() -> None:
    assert str(lh.RunNotFoundError("no run 'x'")) == "no run 'x'"


def test_privacy_says_one_thing_every_package_without_an_underscore_is_public() -> None:
    """CONTRIBUTING.md's rule: a package with nothing for users is named ``_pkg``; the others export a surface."""
    import importlib
    import pkgutil

    import launchhelm

    offenders = []
    for info in pkgutil.iter_modules(launchhelm.__path__):
        if not info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"launchhelm.{info.name}")
        doc = (module.__doc__ or "").lower()
        if not getattr(module, "__all__", None) or "private" in doc.split("\n\n")[0]:
            offenders.append(info.name)
    assert offenders == [], f"packages that call themselves private but have no underscore: {offenders}"
