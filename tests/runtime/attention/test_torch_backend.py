"""The torch paged-attention backend equals plain float64 attention, computed
per request from its own keys and values with a causal mask offset by the
tokens cached before the step, on mixed steps of decodes and prefill chunks.
Every test runs all in torch, and again through the CPU's C++ kernels
(decodes; prefill chunks where the block size is the kernel's 16, the
torch path otherwise)."""

import pytest
import torch
from pagoda.runtime.attention.backend import kv_cache_shape
from pagoda.runtime.attention.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=["torch", "cpp-kernels"])
def backend(request) -> TorchAttentionBackend:
    if request.param == "torch":
        return TorchAttentionBackend()
    from pagoda.kernels.cpu import build

    ext = build()
    return TorchAttentionBackend(ext.decode_attention, ext.prefill_attention, ext.reshape_and_cache)


HEAD_SIZE = 64  # one the prefill kernel takes
NUM_KV_HEADS = 2
# Slots no request owns hold this: a read past a request's context, unmasked,
# moves the output far beyond the tolerance.
GARBAGE = 1e3


def reference(q, k, v, num_computed: int, scale: float) -> torch.Tensor:
    """q [Tq, Hq, D], k/v [S, Hkv, D] with Tq = S - num_computed -> [Tq, Hq, D]."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    q_pos = num_computed + torch.arange(q.shape[0])
    future = torch.arange(k.shape[0])[None, :] > q_pos[:, None]
    scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_step(
    specs,
    group: int,
    block_size: int,
    paged_step,
    backend,
    seed: int = 0,
    cache_dtype: torch.dtype = torch.float32,
):
    """specs: (num_computed, num_new) per request. Fills the cache (in
    `cache_dtype`; the queries, keys and values are float32) with each
    request's earlier context at scattered blocks, runs the backend on the
    step's new tokens and returns (output, float64 reference over the K/V
    as the cache holds them)."""
    gen = torch.Generator().manual_seed(seed)
    num_heads = NUM_KV_HEADS * group
    blocks_needed = [-(-(c + n) // block_size) for c, n in specs]
    num_blocks = sum(blocks_needed) + 2
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    shape = kv_cache_shape(num_blocks, block_size, NUM_KV_HEADS, HEAD_SIZE)
    cache = torch.full(shape, GARBAGE, dtype=cache_dtype)
    flat = cache.view(2, -1, NUM_KV_HEADS, HEAD_SIZE)

    requests, queries, keys, values, refs = [], [], [], [], []
    scale = HEAD_SIZE**-0.5
    for (computed, new), needed in zip(specs, blocks_needed):
        ids = [pool.pop() for _ in range(needed)]
        requests.append((computed, new, ids))
        seq = computed + new
        k = torch.randn(seq, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
        v = torch.randn(seq, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
        q = torch.randn(new, num_heads, HEAD_SIZE, generator=gen)
        pos = torch.arange(computed)
        slots = torch.tensor(ids)[pos // block_size] * block_size + pos % block_size
        flat[0, slots], flat[1, slots] = k[:computed].to(cache_dtype), v[:computed].to(cache_dtype)
        queries.append(q)
        keys.append(k[computed:])
        values.append(v[computed:])
        cached = (k.to(cache_dtype), v.to(cache_dtype))
        refs.append(reference(q, *cached, computed, scale))

    metadata, _ = paged_step(requests, block_size)
    out = backend.forward(
        torch.cat(queries), torch.cat(keys), torch.cat(values), cache, metadata, scale
    )
    # The step's keys and values landed in the cache at their slots.
    slots = metadata.slot_mapping
    torch.testing.assert_close(flat[0, slots], torch.cat(keys).to(cache_dtype), rtol=0, atol=0)
    torch.testing.assert_close(flat[1, slots], torch.cat(values).to(cache_dtype), rtol=0, atol=0)
    return out, torch.cat(refs)


def assert_matches(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("block_size", [8, 16])
def test_mixed_decodes_and_prefill_chunks_match_reference(group, block_size, paged_step, backend):
    specs = [
        (0, 13),  # a whole prompt, not a whole number of blocks
        (36, 1),  # decode, context not a multiple of the block size
        (21, 19),  # a chunk starting mid-block after cached context
        (0, 1),  # a one-token prompt: the shortest decode-shaped step
        (47, 1),  # a longer decode in the same step
        (5, 30),  # chunk crossing several block boundaries
    ]
    out, ref = run_step(specs, group, block_size, paged_step, backend)
    assert_matches(out, ref)


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [8, 16])
def test_a_16_bit_cache_under_a_float32_model(cache_dtype, block_size, paged_step, backend):
    """kv_cache_dtype: the step's K/V are rounded into the cache, and every
    read widens them back: the output is float32 attention over the rounded
    K/V (float32 math throughout, so the float32 tolerance holds)."""
    specs = [(0, 13), (36, 1), (21, 19), (47, 1), (5, 30)]
    out, ref = run_step(specs, 3, block_size, paged_step, backend, cache_dtype=cache_dtype)
    assert_matches(out, ref)


@pytest.mark.parametrize("group", [1, 3])
def test_decode_only_step_of_ragged_lengths(group, paged_step, backend):
    specs = [(c, 1) for c in (0, 7, 8, 9, 40, 3)]
    out, ref = run_step(specs, group, 8, paged_step, backend, seed=1)
    assert_matches(out, ref)


@pytest.mark.parametrize("group", [1, 3])
def test_prefill_chunks_only(group, paged_step, backend):
    specs = [(0, 29), (11, 2), (16, 16), (3, 5)]
    out, ref = run_step(specs, group, 8, paged_step, backend, seed=2)
    assert_matches(out, ref)


def test_chunked_prefill_equals_one_prefill(paged_step, backend):
    """A prompt fed in three chunks through the cache gives what one prefill gives."""
    gen = torch.Generator().manual_seed(3)
    n, block_size, group = 45, 8, 3
    q = torch.randn(n, NUM_KV_HEADS * group, HEAD_SIZE, generator=gen)
    k = torch.randn(n, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    v = torch.randn(n, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    blocks = [5, 0, 3, 6, 1, 4]

    def run(chunks):
        cache = torch.full(kv_cache_shape(7, block_size, NUM_KV_HEADS, HEAD_SIZE), GARBAGE)
        outs = []
        for start, end in chunks:
            metadata, _ = paged_step([(start, end - start, blocks)], block_size)
            outs.append(
                backend.forward(q[start:end], k[start:end], v[start:end], cache, metadata, 0.25)
            )
        return torch.cat(outs)

    torch.testing.assert_close(
        run([(0, 11), (11, 27), (27, 45)]), run([(0, n)]), rtol=1e-5, atol=1e-6
    )
