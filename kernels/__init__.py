"""Pagoda's GPU kernels (Triton), each with a pure-torch twin in `reference`.

Callers use the dispatch functions below; they run the Triton kernel on CUDA
(or under `TRITON_INTERPRET=1`) and the torch twin otherwise. Importing this
package does not import Triton.
"""

from pagoda.kernels.ops import (
    add_lora,
    paged_attention,
    reshape_and_cache,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    use_triton,
)

__all__ = [
    "add_lora",
    "paged_attention",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "use_triton",
]
