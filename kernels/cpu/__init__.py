"""C++ kernels for the CPU, compiled on first use for the CPU they run on:
paged decode and prefill attention (`decode_attention.cpp`,
`prefill_attention.cpp`) and the cache write (`cache_write.cpp`), linear layers on packed weights (`linear.cpp`),
and RMSNorm with the residual add, RoPE and SiLU-and-mul (`layer_ops.cpp`),
which round where the torch twins round (RoPE gives their bits, RMSNorm and
SiLU-and-mul within one unit in the last place).

The torch path stays the reference and the fallback: where no C++ compiler
or ninja is found, or the build fails, `extension()` returns None with one
warning and the model runs the torch twins. The build is cached per source
version, flags, torch version and CPU (`build_directory()`, under
`PAGODA_KERNEL_CACHE` or ~/.cache/pagoda/kernels), so only the first start
on a machine pays it (about 25 s on 2 cores); `python -m pagoda.kernels.cpu`
builds it ahead of time (the Makefile's install step does).

`-march=native` because the build happens where it runs, without a fat
binary: the kernels are written once over the vector type of `vec.h`, 16
lanes where the CPU has AVX-512 and 8 where it has AVX2 with FMA (AMD Zen
2/3, Intel before Skylake-SP), and keep scalar loops elsewhere. `-ffast-math` lets the compiler vectorize
the softmax's exp and the dot products' reductions; the kernel's inputs are
finite (it starts its running maximum at the lowest finite float, not -inf).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCES = [
    Path(__file__).with_name(name)
    for name in (
        "bindings.cpp",
        "decode_attention.cpp",
        "prefill_attention.cpp",
        "layer_ops.cpp",
        "linear.cpp",
        "cache_write.cpp",
        "graph.cpp",
    )
]
# Included by the sources: part of what a build is cached under.
HEADERS = [Path(__file__).with_name(name) for name in ("cpu_common.h", "graph.h", "vec.h")]
EXTRA_CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
# at::parallel_for is OpenMP in a header: without -fopenmp it runs on one
# thread. The libgomp.so.1 torch already loaded serves the extension (same
# soname), so there is one OpenMP runtime and one thread pool.
EXTRA_LDFLAGS = ["-fopenmp"]


def _ninja_on_path() -> None:
    """torch builds with the `ninja` found on PATH; a virtualenv's (the PyPI
    `ninja` package) is not on it unless the venv is activated."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _cpu_identity() -> bytes:
    """What -march=native compiles for: a build must not be reused on a CPU
    with other instruction sets (a cache on a volume shared by nodes)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    wanted = ("model name", "flags")
    return "\n".join(sorted({ln for ln in lines if ln.startswith(wanted)})).encode()


def build_directory() -> Path:
    """Where this source version is built for this CPU and torch:
    `PAGODA_KERNEL_CACHE` (default ~/.cache/pagoda/kernels)/cpu-<hash>."""
    import torch

    digest = hashlib.sha256()
    for part in (
        *(p.read_bytes() for p in SOURCES + HEADERS),
        " ".join(EXTRA_CFLAGS + EXTRA_LDFLAGS).encode(),
        torch.__version__.encode(),
        _cpu_identity(),
    ):
        digest.update(part)
    root = os.environ.get("PAGODA_KERNEL_CACHE") or Path.home() / ".cache" / "pagoda" / "kernels"
    return Path(root) / f"cpu-{digest.hexdigest()[:16]}"


@functools.cache
def _extension():
    from torch.utils import cpp_extension

    _ninja_on_path()
    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    # torch serializes builds with a lock *file* that a process killed while
    # compiling (a pod deleted during its first start) leaves behind, and
    # every later load then waits for it forever. An flock instead dies with
    # its holder; whoever holds it is the only builder, so a torch lock file
    # found then is stale and goes.
    with open(folder / "build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (folder / "lock").unlink(missing_ok=True)
        return cpp_extension.load(
            name="pagoda_cpu_kernels",
            sources=[str(p) for p in SOURCES],
            extra_cflags=EXTRA_CFLAGS,
            extra_ldflags=EXTRA_LDFLAGS,
            build_directory=str(folder),
            verbose=False,
        )


def build() -> object:
    """Compile (or load the cached build of) the extension; raises on failure."""
    return _extension()


@functools.cache
def extension() -> object | None:
    """The built extension, or None (with one warning) where it cannot be
    built: the callers then keep to the torch twins."""
    try:
        return build()
    except Exception as exc:  # a missing compiler, ninja, or headers: keep serving
        logger.warning(
            "C++ CPU kernels unavailable: attention and the layers' elementwise ops run in "
            "torch, linears in oneDNN (slower): %s",
            str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__,
        )
        return None


def decode_attention_op() -> Callable | None:
    """`decode_attention(out, query, kv_cache, block_table, seq_lens,
    token_index, scale)`, or None where the extension cannot be built."""
    ext = extension()
    return ext.decode_attention if ext is not None else None


def prefill_attention_op() -> Callable | None:
    """`prefill_attention(out, query, kv_cache, block_table, seq_lens,
    query_start_loc, rows, scale)`, or None where the extension cannot be
    built. It takes block size 16 and head sizes 64 and 128 only."""
    ext = extension()
    return ext.prefill_attention if ext is not None else None


def reshape_and_cache_op() -> Callable | None:
    """`reshape_and_cache(key, value, kv_cache, slot_mapping)`, or None where
    the extension cannot be built."""
    ext = extension()
    return ext.reshape_and_cache if ext is not None else None


def linear_ops(dtype: object) -> tuple[Callable, Callable] | None:
    """`(pack_linear_weight(weight), packed_linear(x, packed, out_features,
    bias))` for a torch dtype, or None where the extension cannot be built or
    this CPU has no kernel for the dtype (both need AVX-512 or AVX2 with FMA;
    bfloat16 runs as pair dot products on AVX512-BF16 and is widened to
    float32 elsewhere)."""
    ext = extension()
    if ext is None or not ext.linear_supported(dtype):
        return None
    return ext.pack_linear_weight, ext.packed_linear
