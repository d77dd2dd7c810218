"""The integrations stay out of ``import launchhelm``: a user without Lightning or Transformers (or with
them, not training with them) pays nothing for them."""

from __future__ import annotations

import pytest
from lhtest import run_python


def test_import_launchhelm_pulls_in_neither_framework() -> None:
    done = run_python(
        """
        import sys
        import launchhelm, launchhelm.storage
        frameworks = ("lightning", "pytorch_lightning", "transformers", "accelerate", "torch")
        print(",".join(m for m in frameworks if m in sys.modules) or "none")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"


@pytest.mark.parametrize(
    ("module", "name", "framework"),
    [
        ("launchhelm.lightning", "LaunchHelmLogger", "lightning"),
        ("launchhelm.transformers", "LaunchHelmCallback", "transformers"),
    ],
)
def test_the_names_the_spec_fixes_are_public(module: str, name: str, framework: str) -> None:
    pytest.importorskip(framework, reason=f"the {framework} extra is not installed (pip install -e '.[{framework}]')")
    imported = __import__(module, fromlist=[name])
    assert name in imported.__all__
    assert getattr(imported, name).__doc__
