#!/usr/bin/env bash
# The test suite: creates or reuses .venv, installs the project, runs pytest (slow tests included).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" test
cd "$ROOT"
exec python -m pytest -q -p no:cacheprovider "$@"
