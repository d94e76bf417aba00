#!/usr/bin/env bash
# Builds llama.cpp's own `llama-batched-bench` (CPU, native SIMD) from the llama.cpp sources vendored in the
# llama-cpp-python sdist pinned in requirements-bench.txt: a benchmark peer, never part of the runtime.
#   bash scripts/build_llamacpp_bench.sh            # -> build/llamacpp/cmake/bin/llama-batched-bench
# Needs cmake and a C++17 compiler; about 3-6 min on 2 cores. Re-running with the binary present does nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${LLAMACPP_BUILD:-$ROOT/build/llamacpp}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
PIN="$(grep -E '^llama-cpp-python==' "$ROOT/requirements-bench.txt" | head -1)"
[ -n "$PIN" ] || { echo "requirements-bench.txt pins no llama-cpp-python==VERSION" >&2; exit 1; }
BIN="$OUT/cmake/bin/llama-batched-bench"
if [ -x "$BIN" ] && [ "$(cat "$OUT/.pin" 2>/dev/null)" = "$PIN" ]; then
  echo "$BIN"; exit 0
fi
mkdir -p "$OUT/src"
# The sdist carries the exact llama.cpp commit that llama-cpp-python binds: one source for both peers.
"$PY" -m pip download -q --no-deps --no-binary :all: "$PIN" -d "$OUT/src"
SDIST="$(ls -t "$OUT"/src/llama_cpp_python-*.tar.gz | head -1)"
tar xzf "$SDIST" -C "$OUT/src"
SRC="$(ls -d "$OUT"/src/llama_cpp_python-*/vendor/llama.cpp | head -1)"
cmake -S "$SRC" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build "$OUT/cmake" --target llama-batched-bench -j "$JOBS" >/dev/null
echo "$PIN" > "$OUT/.pin"
echo "$BIN"
