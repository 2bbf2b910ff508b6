"""The attention-backend interface and the paged KV cache layout.

Every backend reads and writes the same cache layout, so the runtime can switch
backends without touching the cache:

    kv_cache[layer]: Tensor[2, num_blocks, block_size, num_kv_heads, head_size]
                     kv_cache[0] holds keys, kv_cache[1] values.

A token's slot is `block_id * block_size + offset_in_block`; the slot mapping
gives one slot per token of the step, and a request's block table lists its
block ids in order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


def kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
) -> tuple[int, ...]:
    return (2, num_blocks, block_size, num_kv_heads, head_size)


@dataclass
class AttentionMetadata:
    """One step's flattened batch, as attention needs it.

    Requests are laid out back to back: request i owns query tokens
    `query_start_loc[i]:query_start_loc[i+1]`. A request's queries are the
    last `query_len` positions of its `seq_len` tokens of context, so a prefill
    chunk may start in the middle of a block and attends causally to itself and
    to everything cached before it; a decode is the case query_len == 1.

    Device tensors (on the model's device):
      query_start_loc int32 [num_reqs + 1]
      seq_lens        int32 [num_reqs]   context length including this step
      block_table     int32 [num_reqs, max_num_blocks_per_req]
      slot_mapping    int64 [num_actual_tokens]
    Host copies (`*_cpu`, torch CPU tensors) let a backend make launch
    decisions without a device sync.
    """

    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor


class AttentionBackend(ABC):
    """Computes paged attention for one layer over a flattened batch."""

    name: str = ""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # kv_cache_shape(...)
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Write this step's key/value into the cache at `slot_mapping`, then
        attend every query to its request's cached context.

        The write happens before any read, for all requests of the step: a
        request may read blocks another request of the same step writes (two
        samples of one prompt share its blocks through the prefix cache).
        """
