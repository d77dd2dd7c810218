#!/usr/bin/env bash
# The whole test suite: set up .venv with the dev extras, then lint, type-check and run every test
# (moto_server and the other emulators are started by the tests, one of each per xdist worker).
#   bash scripts/test.sh                 everything, as CI runs it
#   bash scripts/test.sh --quick         what to run after a small change (under 3 minutes): no slow or browser test
#   bash scripts/test.sh tests/storage -x     arguments go to pytest
# pytest runs twice: the tests on LAUNCHHELM_TEST_WORKERS xdist workers (default 4: much of their time is
# waiting, but torch's imports and training are CPU: tests/torch's heaviest modules ran faster on 3 or 4
# workers than on 6 on a 2-core machine, and the browser group keeps one worker), then the `serial` ones alone, since they
# measure time or count heartbeats. The docs site build and the layers contract are tests
# (tests/docs/test_site.py, tests/core/test_import_graph.py), so they run once, in pytest.
set -euo pipefail
quick=0
if [ "${1:-}" = "--quick" ]; then
    quick=1
    shift
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" "dev,torch,lightning,transformers,docs,ray"
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
# SLURM for tests/torch/test_slurm.py (which starts a private slurmctld and slurmd on localhost): Debian's
# slurm-wlm. Without it those tests are skipped on a workstation, and fail in CI (CI=true)
if [ ! -x /usr/sbin/slurmctld ]; then
    echo "== apt-get install slurm-wlm (for tests/torch/test_slurm.py)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm; } >/tmp/launchhelm-apt-slurm.log 2>&1; then
        tail -5 /tmp/launchhelm-apt-slurm.log >&2
        echo "scripts/test.sh: could not install slurm-wlm with apt-get (tests/torch/test_slurm.py needs slurmctld," >&2
        echo "slurmd and sbatch): install it as root (apt-get install -y slurm-wlm); without it those tests are skipped" >&2
        echo "outside CI and fail in CI" >&2
        if [ -n "${CI:-}" ]; then exit 1; fi
    fi
fi
workers=${LAUNCHHELM_TEST_WORKERS:-4}
if [ "$quick" = 1 ]; then
    echo "== pytest --quick (not slow, not browser, not serial; $workers workers)"
    exec python -m pytest -n "$workers" --dist loadgroup -m "not slow and not browser and not serial" --durations=15 "$@"
fi
# pytest's exit 5 is "no test selected": fine for one phase (a folder with no serial test), not for both
reports=$(mktemp -d)
echo "== pytest ($workers workers)"
rc1=0
python -m pytest -n "$workers" --dist loadgroup -m "not serial" --durations=30 --junitxml="$reports/parallel.xml" "$@" || rc1=$?
echo "== pytest (serial: the tests that measure time, alone)"
rc2=0
python -m pytest -p no:xdist -m serial --durations=10 --junitxml="$reports/serial.xml" "$@" || rc2=$?
# one closing line for both phases
python scripts/junit_total.py "$reports"/*.xml || true
rm -rf "$reports"
if [ "$rc1" -eq 5 ] && [ "$rc2" -eq 5 ]; then
    echo "scripts/test.sh: no test selected" >&2
    exit 5
fi
for rc in "$rc1" "$rc2"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
