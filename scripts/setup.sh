#!/usr/bin/env bash
# Create .venv (if missing) and install LaunchHelm into it with what the
# given extras need. Sourced by scripts/demo.sh and scripts/test.sh.
#   usage: source scripts/setup.sh [extras]      default "torch"; the tests use "dev,torch,lightning,transformers,docs,ray"
# It also builds the widgets' front end with npm (Node.js 18+) when needed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
# no wheel cache: a fresh machine installs once, and the cache would double what the install
# takes on disk (a CI machine once ran out of space mid-install)
export PIP_NO_CACHE_DIR=1
python -m pip install --quiet --upgrade pip
extras=${1:-torch}
# torch 2.13.0: its CPU wheel lies on these machines' disk (the demo trains a
# PyTorch model; the tests run real torch and torch.distributed)
python -m pip install --quiet -e ".[$extras]" "torch==2.13.0"
# the notebook widgets' front end (js/ -> launchhelm/widgets/static/, gitignored):
# npm ci + esbuild, only when the bundle is missing or older than its sources
bash js/build.sh
