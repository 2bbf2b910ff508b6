"""Pure-torch twins of every Triton kernel in this package.

Each twin computes what its kernel computes. The tests compare kernel against
twin on random inputs, and the twin is also what the model's layers run
wherever the kernels do not (the CPU, or `--no-fused-kernels`): there is one
torch implementation of each op, so the elementwise ones (RMSNorm, SiLU-and-
mul, RoPE) are written for speed on the CPU as well as for clarity (measured
in docs/benchmarks.md). The attention twins are oracles only: the runtime's
torch attention backend batches differently; the cache twin is also how that
backend writes the cache where no kernel does. Twins never import
Triton.

Numerics follow Hugging Face transformers where the runtime must match it:
the roundings to the model dtype happen where transformers rounds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reshape_and_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter `key`/`value` [num_tokens, num_kv_heads, head_size] into the paged
    cache [2, num_blocks, block_size, num_kv_heads, head_size] at `slot_mapping`
    (slot = block_id * block_size + offset). Slots < 0 mark padding and are skipped."""
    num_tokens = slot_mapping.shape[0]
    _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
    slots = slot_mapping.to(torch.int64)
    key, value = key[:num_tokens], value[:num_tokens]
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    # Rows of the cache seen flat: index_copy_ is several times faster on the
    # CPU than advanced indexing of [blocks, offsets].
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_size)
    flat[0].index_copy_(0, slots, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slots, value.to(kv_cache.dtype))


def paged_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of a flattened batch over the paged cache, one request at a time.

    Request i's queries `query[query_start_loc[i]:query_start_loc[i+1]]` are the
    last positions of its `seq_lens[i]` tokens; query j (0-based within the
    request) sees keys 0 .. seq_len - query_len + j. Returns [num_tokens,
    num_heads, head_size] in the query's dtype; math in float32.
    """
    num_heads = query.shape[1]
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(query)
    qsl = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        start, end = qsl[i], qsl[i + 1]
        if end == start:
            continue
        pos = torch.arange(seq_len, device=query.device)
        blocks = block_table[i].to(torch.int64)[pos // block_size]
        k = kv_cache[0, blocks, pos % block_size].float()  # [seq, kv_heads, d]
        v = kv_cache[1, blocks, pos % block_size].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end].float()
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = seq_len - (end - start) + torch.arange(end - start, device=query.device)
        s = s.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).to(query.dtype)
    return out


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim, as transformers' LlamaRMSNorm computes it.

    With `residual`, first `x = x + residual` (rounded to x's dtype, as the
    model's residual stream is) and returns `(norm(x), x)`, like vLLM's
    fused_add_rms_norm; without it, returns `norm(x)`.
    """
    if residual is not None:
        x = x + residual  # one rounding of the fp32 sum, in x's dtype
    # torch's fused rms_norm (one pass) on float32 statistics; the product
    # with the weight rounds once, in the model dtype, like transformers.
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)
    out = (weight * normed).to(x.dtype)
    return out if residual is None else (out, x)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """`silu(x[..., :d]) * x[..., d:]` for x [..., 2d], in x's dtype as
    transformers computes it (two roundings in bf16; an fp32 copy of the
    input would cost 16x more on the CPU, measured)."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def rotary_embedding_ref(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """Neox-style RoPE in place on `query` [num_tokens, num_heads, head_size] and
    `key` [num_tokens, num_kv_heads, head_size].

    `cos_sin_cache` is [max_pos, rot_dim]: cos in the first rot_dim/2 columns,
    sin in the rest (vLLM's layout). The first rot_dim dims of each head are
    rotated as two halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); the
    rest pass through (partial rotary).
    """
    rot_dim = cos_sin_cache.shape[-1]
    half = rot_dim // 2
    # In the tensors' dtype, as transformers' apply_rotary_pos_emb computes
    # (and 15-20% faster on the CPU than an fp32 round trip, measured).
    cs = cos_sin_cache[positions.to(torch.int64)].to(query.dtype)
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    for t in (query, key):
        x1, x2 = t[..., :half], t[..., half:rot_dim]
        out1, out2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        x1.copy_(out1)
        x2.copy_(out2)


def add_lora_ref(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    token_slots: torch.Tensor,
    slot_width: int,
) -> torch.Tensor:
    """`y[t] += lora_b[:, slot(t)] @ (lora_a[slot(t)] @ x[t])` for every token
    whose slot is >= 0, in place; returns y.

    Layout as in `pagoda.kernels.lora`: slot s is rows `s*R:(s+1)*R` of
    `lora_a` [L*R, in] and the same columns of `lora_b` [out, L*R]. Two dense
    matmuls over every slot, with each token's other slots masked to zero
    between them: no loop over requests or adapters and no gathered copy of
    the weights. Every token pays for all L slots, which is L*R extra inner
    width (a few percent of a projection at L=4, R=16): on the CPU this beats
    per-token gathers (measured in docs/benchmarks.md).
    """
    num_slots = lora_a.shape[0] // slot_width
    onehot = token_slots[:, None] == torch.arange(num_slots, device=token_slots.device)
    shrunk = (x @ lora_a.T).view(x.shape[0], num_slots, slot_width)
    shrunk = shrunk * onehot.unsqueeze(-1).to(shrunk.dtype)
    y += (shrunk.view(x.shape[0], -1) @ lora_b.T).to(y.dtype)
    return y
