#!/usr/bin/env bash
# Build llama.cpp's llama-server from the source vendored in the PyPI sdist of
# llama-cpp-python (a pinned llama.cpp, fetched through pip like any other
# package), once, into a cache outside the repository.
#
#   benchmarks/peers/build_llama_server.sh        # prints the binary's path
#
# CPU build for x86-64 with AVX-512: GGML_NATIVE=OFF and the instruction sets
# listed explicitly, because ggml's AMX code dies with an illegal instruction
# on this CPU's worker threads (AMX stays off). About 15 minutes on 2 cores.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${PAGODA_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagoda-peers}"
PIP="${PIP:-python -m pip}"
JOBS="${JOBS:-$(nproc)}"
SRC="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$CACHE/build-$VERSION"
BIN="$BUILD/bin/llama-server"

if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$CACHE"
if [[ ! -d "$SRC" ]]; then
    $PIP download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE" >&2
    tar -xzf "$CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"
fi
cmake -S "$SRC" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF \
    -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF \
    -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DGGML_OPENMP=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$BUILD" --target llama-server -j "$JOBS" >&2
echo "$BIN"
