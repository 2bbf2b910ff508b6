#!/usr/bin/env bash
# Build llama.cpp's llama-server from the source vendored in the PyPI sdist of
# llama-cpp-python (a pinned llama.cpp, fetched through pip like any other
# package), once, into a cache outside the repository.
#
#   benchmarks/peers/build_llama_server.sh        # prints the binary's path
#
# CPU build for x86-64: GGML_NATIVE=OFF and the instruction sets this CPU has
# (read from /proc/cpuinfo) listed explicitly, because ggml's AMX code dies
# with an illegal instruction on the AVX-512 boxes' worker threads (AMX stays
# off), and an AVX-512 build dies on an AVX2-only CPU (AMD Zen 2/3). The
# build is cached per version and instruction sets. About 15 minutes on 2
# cores.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${PAGODA_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagoda-peers}"
PIP="${PIP:-python -m pip}"
JOBS="${JOBS:-$(nproc)}"
SRC="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ "$FLAGS" == *" $1 "* ]] && echo ON || echo OFF; }
ISA=(
    -DGGML_SSE42="$(has sse4_2)" -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)"
    -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)"
    -DGGML_AVX_VNNI="$(has avx_vnni)"
    -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)"
    -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)"
)
ISA_TAG="$(printf '%s\n' "${ISA[@]}" | sha256sum | cut -c1-8)"
BUILD="$CACHE/build-$VERSION-$ISA_TAG"
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
    "${ISA[@]}" \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DGGML_OPENMP=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$BUILD" --target llama-server -j "$JOBS" >&2
echo "$BIN"
