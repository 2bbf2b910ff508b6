"""Builders for random paged batches shared by the kernel tests.

Exposed as fixtures because tests/ has no packages (importlib import mode).
Tensors live on CUDA when there is one (the kernels then run natively), else
on the CPU under the Triton interpreter (tests/conftest.py sets it).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from pagoda.runtime.attention.backend import AttentionMetadata, kv_cache_shape

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class PagedBatch:
    """A step's flattened batch over a paged cache whose context is filled in.

    `kv_cache` holds every request's earlier context (the first seq_len -
    query_len tokens) at scattered blocks; `key`/`value` are the step's new
    tokens, still to be written at `slot_mapping`. Every slot no request owns,
    and a spare block that unused block-table entries point at, hold NaN: a
    kernel that reads past a request's context produces NaN.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    kv_cache: torch.Tensor
    metadata: AttentionMetadata
    full_keys: list[torch.Tensor]  # per request [seq_len, num_kv_heads, head_size]
    full_values: list[torch.Tensor]
    query_lens: list[int]
    seq_lens: list[int]


def make_paged_batch(
    specs: list[tuple[int, int]],
    *,
    num_kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    spare_blocks: int = 3,
    cache_dtype: torch.dtype | None = None,
) -> PagedBatch:
    """specs: one (query_len, seq_len) per request, query_len <= seq_len.
    The cache is in `cache_dtype` (default: `dtype`); the K/V are drawn
    representable in both dtypes, so writing them needs no rounding (the
    cache-write tests check the rounding; the interpreter truncates to
    bf16 where CUDA rounds)."""
    cache_dtype = cache_dtype or dtype
    gen = torch.Generator().manual_seed(seed)
    num_heads = num_kv_heads * group
    blocks_per_req = [-(-seq_len // block_size) for _, seq_len in specs]
    num_blocks = sum(blocks_per_req) + spare_blocks
    # Scattered, non-contiguous block ids: a random permutation of the pool.
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    poison_block = perm.pop()
    max_blocks = max(blocks_per_req) + 1
    block_table = torch.full((len(specs), max_blocks), poison_block, dtype=torch.int32)
    kv_cache = torch.full(
        kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size),
        float("nan"),
        dtype=cache_dtype,
    )

    queries, keys, values, slots = [], [], [], []
    full_keys, full_values = [], []
    for i, (query_len, seq_len) in enumerate(specs):
        assert 0 < query_len <= seq_len
        ids = [perm.pop() for _ in range(blocks_per_req[i])]
        block_table[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        k = torch.randn(seq_len, num_kv_heads, head_size, generator=gen)
        v = torch.randn(seq_len, num_kv_heads, head_size, generator=gen)
        k, v = k.to(cache_dtype).to(dtype), v.to(cache_dtype).to(dtype)
        pos = torch.arange(seq_len)
        slot = (
            torch.tensor(ids, dtype=torch.int64)[pos // block_size] * block_size + pos % block_size
        )
        ctx = seq_len - query_len
        kv_cache[0].view(-1, num_kv_heads, head_size)[slot[:ctx]] = k[:ctx].to(cache_dtype)
        kv_cache[1].view(-1, num_kv_heads, head_size)[slot[:ctx]] = v[:ctx].to(cache_dtype)
        queries.append(torch.randn(query_len, num_heads, head_size, generator=gen).to(dtype))
        keys.append(k[ctx:])
        values.append(v[ctx:])
        slots.append(slot[ctx:])
        full_keys.append(k)
        full_values.append(v)

    query_lens = [q for q, _ in specs]
    seq_lens = [s for _, s in specs]
    qsl = torch.zeros(len(specs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    metadata = AttentionMetadata(
        num_actual_tokens=sum(query_lens),
        num_reqs=len(specs),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc=qsl.to(DEVICE),
        seq_lens=seq_lens_t.to(DEVICE),
        block_table=block_table.to(DEVICE),
        slot_mapping=torch.cat(slots).to(DEVICE),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens_t,
    )
    return PagedBatch(
        query=torch.cat(queries).to(DEVICE),
        key=torch.cat(keys).to(DEVICE),
        value=torch.cat(values).to(DEVICE),
        kv_cache=kv_cache.to(DEVICE),
        metadata=metadata,
        full_keys=full_keys,
        full_values=full_values,
        query_lens=query_lens,
        seq_lens=seq_lens,
    )


def reference_attention(batch: PagedBatch, scale: float) -> torch.Tensor:
    """Straightforward float64 attention from the true per-request K/V (not the
    cache): causal with the query offset seq_len - query_len."""
    outs = []
    start = 0
    for q_len, seq_len, k, v in zip(
        batch.query_lens, batch.seq_lens, batch.full_keys, batch.full_values
    ):
        q = batch.query[start : start + q_len].double().cpu()
        start += q_len
        group = q.shape[1] // k.shape[1]
        kd = k.double().repeat_interleave(group, dim=1)
        vd = v.double().repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, kd) * scale
        q_pos = seq_len - q_len + torch.arange(q_len)
        mask = torch.arange(seq_len)[None, :] > q_pos[:, None]
        s = s.masked_fill(mask[None], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vd))
    return torch.cat(outs)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN if out has any NaN)."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    return (torch.linalg.vector_norm(out64 - ref64) / torch.linalg.vector_norm(ref64)).item()


TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def run_paged_attention(batch: PagedBatch, scale: float, num_splits: int | None = None):
    """Write the step's K/V into the cache, then attend: the output starts as
    NaN, so an element the kernel leaves unwritten fails the comparison."""
    from pagoda.kernels.ops import paged_attention, reshape_and_cache

    md = batch.metadata
    reshape_and_cache(batch.key, batch.value, batch.kv_cache, md.slot_mapping)
    out = torch.full_like(batch.query, float("nan"))
    paged_attention(
        batch.query,
        batch.kv_cache,
        md.block_table,
        md.seq_lens,
        md.query_start_loc,
        scale,
        max_query_len=md.max_query_len,
        max_seq_len=md.max_seq_len,
        out=out,
        num_splits=num_splits,
    )
    return out


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def attend():
    return run_paged_attention


@pytest.fixture
def paged_batch():
    return make_paged_batch


@pytest.fixture
def attention_reference():
    return reference_attention


@pytest.fixture
def rel_err():
    return rel_error


@pytest.fixture
def tolerance():
    return TOLERANCE
