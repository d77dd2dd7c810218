"""Helpers for tests that run real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """The current environment (with any AWS_* of the moto fixture) for a child."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def spawn(code: str, *args: str, prefix: list[str] | None = None, **env: str) -> subprocess.Popen[str]:
    """Start ``python -c code args...`` with stdout piped, text mode."""
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(**env),
        cwd=ROOT,
    )


def run_python(code: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code args...`` to completion and return the result."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=child_env(**env),
        cwd=ROOT,
        timeout=timeout,
    )
