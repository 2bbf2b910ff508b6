"""C++ kernels for the CPU, compiled on first use for the CPU they run on.

The torch path stays the reference and the fallback: where no C++ compiler
or ninja is found, or the build fails, `decode_attention_op()` returns None
with one warning and attention runs in torch. The build is cached per source
version (torch's extension cache, `TORCH_EXTENSIONS_DIR` or
~/.cache/torch_extensions), so only the first start on a machine pays it
(about 20 s on 2 cores); `python -m pagoda.kernels.cpu` builds it ahead of
time (the Makefile's install step and the runtime image do).

`-march=native` because the build happens where it runs: AVX-512 where the
CPU has it, without a fat binary. `-ffast-math` lets the compiler vectorize
the softmax's exp and the dot products' reductions; the kernel's inputs are
finite (it starts its running maximum at the lowest finite float, not -inf).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name("decode_attention.cpp")]
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


@functools.cache
def _extension():
    from torch.utils import cpp_extension

    _ninja_on_path()
    return cpp_extension.load(
        name="pagoda_cpu_kernels",
        sources=[str(p) for p in SOURCES],
        extra_cflags=EXTRA_CFLAGS,
        extra_ldflags=EXTRA_LDFLAGS,
        verbose=False,
    )


def build() -> object:
    """Compile (or load the cached build of) the extension; raises on failure."""
    return _extension()


@functools.cache
def decode_attention_op() -> Callable | None:
    """`decode_attention(out, query, kv_cache, block_table, seq_lens,
    token_index, scale)`, or None where the extension cannot be built."""
    try:
        return build().decode_attention
    except Exception as exc:  # a missing compiler, ninja, or headers: keep serving
        logger.warning(
            "C++ CPU kernels unavailable, decode attention runs in torch (slower): %s",
            str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__,
        )
        return None
