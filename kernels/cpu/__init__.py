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
import json
import logging
import os
import platform
import shutil
import time
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
HEADERS = [
    Path(__file__).with_name(name) for name in ("check.h", "cpu_common.h", "graph.h", "vec.h")
]
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
    bfloat16 runs as pair dot products on AVX512-BF16, or as float32 FMAs on
    the same layout widened in registers from `bf16_widen_rows()` rows, and
    is widened to float32 elsewhere)."""
    ext = extension()
    if ext is None or not ext.linear_supported(dtype):
        return None
    return ext.pack_linear_weight, ext.packed_linear


# bf16 linears of at least this many rows run widened to float32 (`packed_linear`'s
# `widen_from_rows`); 0: never. Overrides the measured choice.
WIDEN_ROWS_ENV = "PAGODA_CPU_BF16_WIDEN_ROWS"
# The row counts the choice is measured at, from a decode step's to a
# prefill's. Widening in registers costs two instructions per weight vector
# per row tile, so where it wins at all it wins from a few rows: on an Intel
# Xeon with AVX512-BF16 and no AMX, 1.1x at 2 rows, 1.3x at 4, 1.4-1.6x
# from 16, and 0.8-0.9x at 1 row, where a call is a read of the weight.
# Each is one more than a power of two: a decode step of b requests replays
# the CPU graph of the smallest captured size >= b (1, 2, 4, 8, 16), and
# the two ways round differently, so a threshold must not fall between a
# batch and its graph's size (at 4, an eager step of 3 rows ran as pairs and
# its graph's 4 rows widened: the replay's logprobs differed from eager).
WIDEN_CANDIDATE_ROWS = (2, 5, 17, 65, 257)


def choose_widen_rows(timings: dict[int, tuple[float, float]], margin: float = 0.1) -> int:
    """From `{rows: (pair seconds, widened seconds)}`, the fewest rows r at
    which the widened call is faster by `margin`, and the calls of r rows
    and more measured, taken together, too (one count's dip does not decide
    alone); 0 where there is none."""
    counts = sorted(timings)
    for i, rows in enumerate(counts):
        pairs, widened = timings[rows]
        pairs_on = sum(timings[r][0] for r in counts[i:])
        widened_on = sum(timings[r][1] for r in counts[i:])
        if widened <= pairs * (1 - margin) and widened_on <= pairs_on * (1 - margin):
            return rows
    return 0


def _measure_widening(
    ext: object, features: int = 1024, reps: int = 9
) -> dict[int, tuple[float, float]]:
    """{rows: (pair seconds, widened seconds)} of one bf16 call, the fastest
    of `reps` (the least disturbed by whatever else the machine runs)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(features, features, generator=gen).to(torch.bfloat16)
    packed = ext.pack_linear_weight(weight)
    timings = {}
    for rows in WIDEN_CANDIDATE_ROWS:
        x = torch.randn(rows, features, generator=gen).to(torch.bfloat16)
        best = {0: float("inf"), rows: float("inf")}
        for _ in range(reps + 1):  # the first round warms up
            for widen in best:  # alternating, so that drift hits both
                start = time.perf_counter()
                ext.packed_linear(x, packed, features, None, widen)
                best[widen] = min(best[widen], time.perf_counter() - start)
        timings[rows] = (best[0], best[rows])
    return timings


@functools.cache
def bf16_widen_rows() -> int:
    """The `widen_from_rows` for this machine's bf16 linears: from how many
    rows a call runs faster as float32 FMAs on the weight widened in
    registers than as AVX512-BF16 pair dot products (0: never; always 0
    where bf16 is not run as pairs).

    Where the pair instruction is fast (AMD Zen 4: bf16 ~2x float32)
    widening loses; where it is not (an Intel Xeon with AVX512-BF16 and no
    AMX: pairs at 120-180 GFLOP/s, widened 165-290 at 16-256 rows) it wins
    from a few rows. It is measured,
    not guessed from the CPU's name, once per machine: the result is kept
    beside the loaded extension (in its `build_directory()`, which is per
    CPU, torch and source version), so every process of a
    pod (tensor-parallel workers too) and every restart makes the same
    choice, and results do not change with a timing's noise between runs.
    `PAGODA_CPU_BF16_WIDEN_ROWS` overrides it."""
    if os.environ.get(WIDEN_ROWS_ENV):
        return max(0, int(os.environ[WIDEN_ROWS_ENV]))
    ext = extension()
    if ext is None or not ext.linear_bf16_pairs():
        return 0
    record = Path(ext.__file__).with_name("bf16_widen_rows.json")
    return recorded_widen_rows(record, lambda: _measure_widening(ext))


def recorded_widen_rows(record: Path, measure: Callable[[], dict[int, tuple[float, float]]]) -> int:
    """The choice kept in `record`, or `measure()`d, chosen and kept there;
    one process measures at a time (the others then read its record)."""
    with open(record.with_suffix(".flock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            return int(json.loads(record.read_text())["widen_from_rows"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not measured yet, or a damaged record: measure again
        timings = measure()
        chosen = choose_widen_rows(timings)
        measured = {str(rows): list(pair) for rows, pair in timings.items()}
        try:
            record.write_text(
                json.dumps({"widen_from_rows": chosen, "seconds_pairs_widened": measured})
            )
        except OSError as exc:  # a read-only cache: measured again by the next process
            logger.warning("could not keep the bf16 linear choice in %s: %s", record, exc)
    logger.info("bf16 linears widen to float32 from %d rows (0: never): %s", chosen, timings)
    return chosen
