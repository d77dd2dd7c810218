#!/usr/bin/env bash
# The whole test suite: set up .venv with the dev extras, then lint, type-check
# and run every test (moto_server and other helpers are started by the tests).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" "dev,torch"
echo "== ruff"
ruff check launchhelm tests benchmarks examples
ruff format --check launchhelm tests benchmarks examples
echo "== mypy"
mypy
echo "== pytest"
python -m pytest "$@"
