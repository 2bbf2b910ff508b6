"""One function per op: the Triton kernel where it can run, else its torch twin.

Triton runs on CUDA tensors, and on CPU tensors when `TRITON_INTERPRET=1`
was set before Triton was first imported (the tests do this). Anywhere else
(a CPU run of the runtime) the pure-torch twin from `reference.py` computes
the same thing, so callers never branch. Kernel modules are imported lazily:
importing this module does not import Triton.
"""

from __future__ import annotations

import os

import torch
from pagoda.kernels import reference


def use_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernels can run on tensors like `t`."""
    if t.is_cuda:
        return True
    return t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton(choice: bool | None, t: torch.Tensor) -> bool:
    return use_triton(t) if choice is None else choice


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write `key`/`value` [num_tokens, num_kv_heads, head_size] into `kv_cache`
    [2, num_blocks, block_size, num_kv_heads, head_size] at `slot_mapping`
    (int64 [num_tokens], slot = block_id * block_size + offset; -1 skips)."""
    if use_triton(kv_cache):
        from pagoda.kernels.cache_write import reshape_and_cache_triton

        reshape_and_cache_triton(key, value, kv_cache, slot_mapping)
    else:
        reference.reshape_and_cache_ref(key, value, kv_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of a flattened batch of prefill chunks and decodes over
    the paged KV cache (the cache already holds this step's K/V).

    query [num_tokens, num_heads, head_size] (num_tokens == query_start_loc[-1]);
    kv_cache [2, num_blocks, block_size, num_kv_heads, head_size] in the
    query's dtype or another (kv_cache_dtype: K/V are converted on load);
    block_table int32 [num_reqs, max_blocks]; seq_lens int32 [num_reqs] (context
    including this step); query_start_loc int32 [num_reqs + 1]. `max_query_len`
    and `max_seq_len` are host integers for launch decisions; `num_splits`
    pins the split-KV factor (None: `choose_num_splits`). Writes into `out` if
    given and returns [num_tokens, num_heads, head_size].
    """
    if use_triton(query):
        from pagoda.kernels.paged_attention import paged_attention_triton

        return paged_attention_triton(
            query,
            kv_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            out=out,
            num_splits=num_splits,
        )
    result = reference.paged_attention_ref(
        query, kv_cache, block_table, seq_lens, query_start_loc, scale
    )
    if out is None:
        return result
    out.copy_(result)
    return out


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    triton: bool | None = None,
    cpu: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim of `x` [..., hidden] with `weight` [hidden].
    With `residual`, returns `(norm(x + residual), x + residual)` (new tensors).
    `triton` forces the kernel (True) or the twin (False); None decides by
    `use_triton(x)`. `cpu`: the C++ kernel of `pagoda.kernels.cpu` instead of
    the twin (the caller checked that it built), for 2-D `x` with
    contiguous rows."""
    if _triton(triton, x):
        from pagoda.kernels.rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    if cpu and x.dim() == 2:
        from pagoda.kernels.cpu import build

        if residual is None:
            return build().rms_norm(x, weight, eps)
        return build().fused_add_rms_norm(x, residual, weight, eps)
    return reference.rms_norm_ref(x, weight, eps, residual)


def silu_and_mul(x: torch.Tensor, *, triton: bool | None = None, cpu: bool = False) -> torch.Tensor:
    """`silu(x[..., :d]) * x[..., d:]` for `x` [..., 2d]; returns [..., d].
    `triton` as for `rms_norm`; `cpu`: the C++ kernel instead of the twin,
    for 2-D `x` with contiguous rows."""
    if _triton(triton, x):
        from pagoda.kernels.activation import silu_and_mul_triton

        return silu_and_mul_triton(x)
    if cpu and x.dim() == 2 and x.stride(1) == 1:
        from pagoda.kernels.cpu import build

        return build().silu_and_mul(x)
    return reference.silu_and_mul_ref(x)


def embedding(ids: torch.Tensor, weight: torch.Tensor, *, cpu: bool = False) -> torch.Tensor:
    """`weight[ids]`: the rows of `weight` [vocab, hidden] for `ids` int64
    [tokens]. `cpu`: the C++ kernel (one call a CPU graph can record, and an
    error naming an id outside the vocabulary) instead of F.embedding."""
    if cpu and ids.dim() == 1 and weight.dim() == 2 and weight.stride(1) == 1:
        from pagoda.kernels.cpu import build

        return build().embedding(ids, weight)
    return torch.nn.functional.embedding(ids, weight)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int | None = None,
    *,
    triton: bool | None = None,
    cpu: bool = False,
) -> None:
    """Neox-style RoPE applied in place to `query` and `key`.

    positions int [num_tokens]; query [num_tokens, num_heads, head_size] and key
    [num_tokens, num_kv_heads, head_size] (or 2-D [num_tokens, heads * head_size]
    views, with `head_size` given); cos_sin_cache [max_pos, rot_dim] holding cos
    then sin, rot_dim <= head_size (the rest of each head is left as is).
    `triton` as for `rms_norm`; `cpu`: the C++ kernel instead of the twin.
    """
    if query.dim() == 2:
        assert head_size is not None, "2-D query/key need head_size"
        query = query.view(query.shape[0], -1, head_size)
        key = key.view(key.shape[0], -1, head_size)
    if _triton(triton, query):
        from pagoda.kernels.rotary import rotary_embedding_triton

        rotary_embedding_triton(positions, query, key, cos_sin_cache)
    elif cpu:
        from pagoda.kernels.cpu import build

        build().rotary_embedding(positions, query, key, cos_sin_cache)
    else:
        reference.rotary_embedding_ref(positions, query, key, cos_sin_cache)


def add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    token_slots: torch.Tensor,
    slot_width: int,
    *,
    triton: bool | None = None,
) -> torch.Tensor:
    """Add each token's LoRA delta to `y` [T, out] in place (see
    `pagoda.kernels.lora`): x [T, in]; lora_a [L*R, in]; lora_b [out, L*R];
    token_slots int64 [T], -1 for tokens of the base model."""
    if _triton(triton, x):
        from pagoda.kernels.lora import lora_expand_triton, lora_shrink_triton

        shrunk = lora_shrink_triton(x, lora_a, token_slots, slot_width)
        return lora_expand_triton(shrunk, lora_b, token_slots, slot_width, y)
    return reference.add_lora_ref(y, x, lora_a, lora_b, token_slots, slot_width)
