"""Building the CPU kernels survives a builder killed mid-compile (a pod
deleted during its first start): the next start builds instead of waiting
forever on the lock file torch's loader leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pagoda.kernels.cpu import build, build_directory

BUILD = [sys.executable, "-m", "pagoda.kernels.cpu"]


@pytest.mark.slow
def test_a_killed_build_leaves_no_lock_that_blocks_the_next(tmp_path):
    env = {**os.environ, "PAGODA_KERNEL_CACHE": str(tmp_path), "PYTHONSAFEPATH": "1"}
    builder = subprocess.Popen(BUILD, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Wait until the compile is under way (torch's lock file exists), then kill it.
    deadline = time.monotonic() + 120
    locks = []
    while time.monotonic() < deadline and not locks:
        locks = list(tmp_path.glob("cpu-*/lock"))
        time.sleep(0.05)
    builder.kill()
    builder.wait()
    assert locks, "the build never started"
    assert locks[0].exists()  # what torch leaves behind
    done = subprocess.run(BUILD, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ready" in done.stdout


def test_build_directory_follows_sources_and_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path))
    folder = build_directory()
    assert folder.parent == tmp_path and folder.name.startswith("cpu-")
    assert build_directory() == folder  # stable for the same sources, flags, torch, CPU


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_a_vector_cpu_gets_the_packed_linears():
    """AVX-512, or AVX2 with FMA and F16C (AMD Zen 2/3 has no AVX-512), runs
    the packed linears in both dtypes: without them the model's linears fall
    back to oneDNN, which a CPU graph cannot replay."""
    flags = _cpu_flags()
    vector = "avx512f" in flags or {"avx2", "fma", "f16c"} <= flags
    if not vector:
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA")
    ext = build()
    assert ext.linear_supported(torch.float32)
    assert ext.linear_supported(torch.bfloat16)
