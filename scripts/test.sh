#!/usr/bin/env bash
# The test suite: creates or reuses .venv, installs the project, runs pytest (slow tests included) on two
# pytest-xdist workers (MS_ATB_TEST_WORKERS: another number; 0 runs in this process).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" test
cd "$ROOT"
WORKERS="${MS_ATB_TEST_WORKERS:-2}"
XDIST=()
if [ "$WORKERS" != 0 ]; then
  XDIST=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
exec python -m pytest -q -p no:cacheprovider "${XDIST[@]}" "$@"
