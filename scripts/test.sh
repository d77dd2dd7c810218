#!/usr/bin/env bash
# The whole test suite: set up .venv with the dev extras, then lint, type-check
# and run every test (moto_server and other helpers are started by the tests).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" "dev,torch,lightning,transformers,docs"
# Azurite (the Azure Storage emulator of the storage tests), from tests/azurite/package-lock.json
if [ ! -x tests/azurite/node_modules/.bin/azurite-blob ] || [ tests/azurite/package-lock.json -nt tests/azurite/node_modules/.package-lock.json ]; then
    echo "== npm ci --prefix tests/azurite (Azurite)"
    npm ci --no-audit --no-fund --prefix tests/azurite >/tmp/launchhelm-azurite-npm.log 2>&1 || { tail -20 /tmp/launchhelm-azurite-npm.log >&2; exit 1; }
fi
echo "== ruff"
ruff check launchhelm tests benchmarks examples docs/hooks
ruff format --check launchhelm tests benchmarks examples docs/hooks
echo "== mypy"
mypy
echo "== lint-imports (the layers contract in pyproject.toml)"
lint-imports
# the front end is checked like the Python: JSDoc types by tsc (strict, --checkJs) and Biome's linter and
# formatter, both from js/package-lock.json's dev dependencies
echo "== tsc, biome (js/)"
if [ ! -x js/node_modules/.bin/tsc ] || [ ! -x js/node_modules/.bin/biome ] || [ js/package-lock.json -nt js/node_modules/.package-lock.json ]; then
    (cd js && npm ci --no-audit --no-fund --loglevel=error)
fi
(cd js && npm run --silent check)
# Chromium for the browser tests (tests/widgets/, marked browser): Debian's package, never a downloaded build
if [ ! -x /usr/bin/chromium ]; then
    echo "== apt-get install chromium (for the browser tests)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/tmp/launchhelm-apt.log 2>&1; then
        tail -5 /tmp/launchhelm-apt.log >&2
        echo "scripts/test.sh: could not install chromium with apt-get (the browser tests in tests/widgets/ need" >&2
        echo "/usr/bin/chromium): install it as root (apt-get install -y chromium), or skip them: bash scripts/test.sh -m 'not browser'" >&2
        exit 1
    fi
fi
# the docs site (mkdocs.yml, the docs extra): strict, so a broken link or a reference entry that no longer
# resolves fails here; nothing is downloaded at build time. tests/docs/ checks what it built.
echo "== mkdocs build --strict"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "${TMPDIR:-/tmp}/launchhelm-site"
echo "== pytest"
python -m pytest --durations=30 "$@"
