#!/usr/bin/env bash
# Builds the llama.cpp peers: libllama (CPU, native SIMD, OpenMP) from the llama.cpp sources vendored in the
# llama-cpp-python sdist pinned in requirements-bench.txt, and two drivers on llama.h linked to it:
#   llamacpp_batched_bench (scripts/llamacpp_batched_bench.cpp): fixed PP/TG shapes at B sequences;
#   llamacpp_serve_batch (scripts/llamacpp_serve_batch.cpp): a workload file served with continuous batching.
# A benchmark peer, never part of the runtime.
#   bash scripts/build_llamacpp_bench.sh            # prints the folder of both binaries, build/llamacpp/bin
# Needs cmake and a C++17 compiler; 10-15 min on 2 idle cores. Re-running with the binaries current does nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${LLAMACPP_BUILD:-$ROOT/build/llamacpp}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
# the pin is a comment of requirements-bench.txt: the sdist is downloaded for its sources, never installed
PIN="$(grep -oE 'llama-cpp-python==[0-9][0-9.]*' "$ROOT/requirements-bench.txt" | head -1)"
[ -n "$PIN" ] || { echo "requirements-bench.txt names no llama-cpp-python==VERSION" >&2; exit 1; }
DRIVERS=(llamacpp_batched_bench llamacpp_serve_batch)
STAMP="$PIN $(cd "$ROOT/scripts" && cat "${DRIVERS[@]/%/.cpp}" llamacpp_batch.h | sha256sum | cut -c1-16)"
if [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ] && [ -x "$OUT/bin/${DRIVERS[0]}" ] \
   && [ -x "$OUT/bin/${DRIVERS[1]}" ]; then
  echo "$OUT/bin"; exit 0
fi
mkdir -p "$OUT/src" "$OUT/bin"
SDIST="$(ls -t "$OUT"/src/llama_cpp_python-*.tar.gz 2>/dev/null | head -1 || true)"   # none yet: empty
if [ -z "$SDIST" ]; then
  # The sdist carries the exact llama.cpp commit that llama-cpp-python binds.
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
for d in "${DRIVERS[@]}"; do
  "${CXX:-g++}" -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$ROOT/scripts/$d.cpp" -o "$OUT/bin/$d" \
    "${LIBS[@]}" -fopenmp -lpthread -ldl -lm
done
echo "$STAMP" > "$OUT/.stamp"
echo "$OUT/bin"
