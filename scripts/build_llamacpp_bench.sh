#!/usr/bin/env bash
# Builds the llama.cpp batched-decode peer: libllama (CPU, native SIMD, OpenMP) from the llama.cpp sources
# vendored in the llama-cpp-python sdist pinned in requirements-bench.txt, and scripts/llamacpp_batched_bench.cpp
# linked to it. A benchmark peer, never part of the runtime.
#   bash scripts/build_llamacpp_bench.sh            # prints build/llamacpp/bin/llamacpp_batched_bench
# Needs cmake and a C++17 compiler; 10-15 min on 2 idle cores. Re-running with the binary current does nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${LLAMACPP_BUILD:-$ROOT/build/llamacpp}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
PIN="$(grep -E '^llama-cpp-python==' "$ROOT/requirements-bench.txt" | head -1)"
[ -n "$PIN" ] || { echo "requirements-bench.txt pins no llama-cpp-python==VERSION" >&2; exit 1; }
BIN="$OUT/bin/llamacpp_batched_bench"
DRIVER="$ROOT/scripts/llamacpp_batched_bench.cpp"
STAMP="$PIN $(sha256sum "$DRIVER" | cut -c1-16)"
if [ -x "$BIN" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ]; then
  echo "$BIN"; exit 0
fi
mkdir -p "$OUT/src" "$OUT/bin"
SDIST="$(ls -t "$OUT"/src/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)"
if [ -z "$SDIST" ]; then
  # The sdist carries the exact llama.cpp commit that llama-cpp-python binds: one source for both peers.
  "$PY" -m pip download -q --no-deps --no-binary :all: "$PIN" -d "$OUT/src"
  SDIST="$(ls -t "$OUT"/src/llama_cpp_python-*.tar.gz | head -1)"
fi
[ -d "${SDIST%.tar.gz}" ] || tar xzf "$SDIST" -C "$OUT/src"
SRC="${SDIST%.tar.gz}/vendor/llama.cpp"
cmake -S "$SRC" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$OUT/cmake" --target llama -j "$JOBS" >/dev/null
LIBS=()
for lib in llama ggml ggml-cpu ggml-base; do
  LIBS+=("$(find "$OUT/cmake" -name "lib$lib.a" | head -1)")
done
"${CXX:-g++}" -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$DRIVER" -o "$BIN" "${LIBS[@]}" \
  -fopenmp -lpthread -ldl -lm
echo "$STAMP" > "$OUT/.stamp"
echo "$BIN"
