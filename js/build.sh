#!/usr/bin/env bash
# Build the widgets' front end (js/ -> launchhelm/widgets/static/) when the
# bundle is missing or older than its sources; `--force` rebuilds anyway.
# Called by scripts/setup.sh. Needs Node.js 18+ and npm.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
static=../launchhelm/widgets/static
outputs=("$static/chart.js" "$static/picker.js" "$static/evaluations.js" "$static/details.js" "$static/runs_table.js" "$static/compare.js" "$static/media.js" "$static/widgets.css")
sources=(src build.mjs package.json package-lock.json)

stale=0
[ "${1:-}" = "--force" ] && stale=1
for out in "${outputs[@]}"; do
    if [ ! -f "$out" ] || [ -n "$(find "${sources[@]}" -newer "$out" -print -quit)" ]; then
        stale=1
    fi
done
[ "$stale" = 1 ] || exit 0

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "js/build.sh: npm (with Node.js 18+) is needed to build the notebook widgets' front end into" >&2
    echo "launchhelm/widgets/static/, and it is not on PATH. Install it (Debian: apt-get install -y nodejs npm)" >&2
    echo "and run scripts/setup.sh again." >&2
    exit 1
fi
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "js/build.sh: npm ci (vega, vega-lite, vega-embed, esbuild)"
    npm ci --no-audit --no-fund --loglevel=error
fi
node build.mjs
touch "${outputs[@]}"
