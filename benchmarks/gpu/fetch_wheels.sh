#!/usr/bin/env bash
# The server's packages the GPU machine's image lacks, as wheels in .whl/
# (git-ignored) for benchmarks/gpu/device_checks.sh, which installs them
# there (carry .whl with the call). The image has torch, triton,
# transformers, aiohttp, uvloop and prometheus-client, and Python 3.12;
# these are the versions of this checkout's .venv when the H100 run passed.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .whl
for pkg in fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pyzmq==27.3.0 msgspec==0.22.0 \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection==0.4.5 \
    typing_extensions==4.16.0 opentelemetry-api==1.45.2 gguf==0.19.0 pytest-asyncio==1.5.0; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pkg"
done
ls .whl
