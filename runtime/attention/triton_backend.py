"""The `triton` attention backend: Pagoda's kernels over the paged KV cache.

Per layer and step it launches the cache-write kernel for all of the step's
tokens, then the unified paged-attention kernel (with its split-KV reduction
when the batch is too small to fill the GPU). Launch decisions use host
integers only (`num_actual_tokens`, `num_reqs`, `max_query_len`,
`max_seq_len`), so a forward never syncs with the device. Runs natively on
CUDA and, for tests, on CPU tensors under `TRITON_INTERPRET=1`. See
docs/kernels.md for the kernels' design.
"""

from __future__ import annotations

import torch
from pagoda.kernels.ops import use_triton
from pagoda.runtime.attention.backend import AttentionBackend, AttentionMetadata


class TritonAttentionBackend(AttentionBackend):
    """Paged attention with the Triton kernels of `pagoda.kernels`.

    `num_splits` pins the split-KV factor (None: chosen per step from the batch
    shape and `max_seq_len`). A CUDA-graph runner that captures decode batches
    may pin it, since a captured grid cannot change between replays; any value
    is correct because each split's range comes from the request's actual
    length inside the kernel.
    """

    name = "triton"

    def __init__(self, num_splits: int | None = None) -> None:
        self.num_splits = num_splits

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Write the step's K/V into `kv_cache`, then attend; see AttentionBackend.

        Rows past `metadata.num_actual_tokens` (padding of a captured batch)
        are neither written to the cache nor attended; their output is zero.
        """
        if not use_triton(query):
            raise RuntimeError(
                "the triton attention backend needs CUDA tensors, or TRITON_INTERPRET=1 set "
                "before triton is imported to run on the CPU; use the torch backend instead"
            )
        # Imported here: importing the backend module must not import Triton.
        from pagoda.kernels.cache_write import reshape_and_cache_triton
        from pagoda.kernels.paged_attention import paged_attention_triton

        n = metadata.num_actual_tokens
        num_reqs = metadata.num_reqs
        # All writes of the step precede all reads: a request may read a block
        # another request of this step writes (shared prefix blocks).
        reshape_and_cache_triton(key[:n], value[:n], kv_cache, metadata.slot_mapping[:n])
        out = torch.empty_like(query) if query.shape[0] == n else torch.zeros_like(query)
        if n == 0:
            return out
        paged_attention_triton(
            query[:n],
            kv_cache,
            metadata.block_table,
            metadata.seq_lens[:num_reqs],
            metadata.query_start_loc[: num_reqs + 1],
            scale,
            max_query_len=metadata.max_query_len,
            max_seq_len=metadata.max_seq_len,
            out=out[:n],
            num_splits=self.num_splits,
        )
        return out
