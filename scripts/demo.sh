#!/usr/bin/env bash
# The main job: set up .venv, then run `launchhelm demo` on the local store
# (~/.launchhelm unless LAUNCHHELM_STORE says otherwise).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
launchhelm demo "$@"
