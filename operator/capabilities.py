"""What the runtime this operator deploys can do today: the one place to lift a limit.

`pagoda serve` refuses `--tensor-parallel-size` above 1 until tensor
parallelism lands in the runtime. Rather than roll out pods that exit at
start, the CRD (a CEL rule) and the operator (its Python twin, both generated
in `model.py` from the values below) refuse such a spec with a message that
says why. When the runtime gains tensor parallelism, raise
`MAX_TENSOR_PARALLEL_SIZE` to `MAX_GPUS_PER_POD` and regenerate the CRD
(`python -m pagoda.operator.crd`); nothing else in the operator changes.
"""

from __future__ import annotations

# The most GPUs one pod may request, and so the largest tensor-parallel size.
MAX_GPUS_PER_POD = 16

# Largest --tensor-parallel-size `pagoda serve` accepts (1: no tensor parallelism yet).
MAX_TENSOR_PARALLEL_SIZE = 1

TENSOR_PARALLEL_UNSUPPORTED = (
    f"tensorParallelSize above {MAX_TENSOR_PARALLEL_SIZE} is not supported yet: the Pagoda "
    "runtime (pagoda serve) runs each replica on a single GPU until it gains tensor "
    f"parallelism; use tensorParallelSize: {MAX_TENSOR_PARALLEL_SIZE}"
)


def tensor_parallel_supported(size: int) -> bool:
    """Whether the runtime can shard one replica over `size` GPUs."""
    return size <= MAX_TENSOR_PARALLEL_SIZE
