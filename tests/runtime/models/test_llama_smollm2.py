"""Our Llama on the real SmolLM2-135M weights (GGUF, Q4_1 dequantized) gives
transformers' float32 logits, however the prompt reaches the paged cache:
whole, in chunks over scattered blocks, or batched with another request."""

import itertools

import pytest
import torch

pytestmark = pytest.mark.model

# Small blocks so that even the 14-token prompts span several of them.
BLOCK_SIZE = 8
# Three prompts of the shared set: chat template (14 tokens), prose (14) and
# the long one (178).
PROMPT_INDICES = [2, 3, 7]


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    scale = ref.abs().max().item()
    diff = (ours - ref).abs().max().item()
    assert diff <= 1e-4 * scale, f"max |diff| {diff:.3g} at logit scale {scale:.3g}"


POOL = 41  # physical blocks in the cache; prime, so the stride below permutes it


def scattered_blocks(num_blocks: int) -> list[int]:
    """`num_blocks` distinct physical blocks, neither contiguous nor ascending."""
    blocks = [(POOL - 1 - 7 * j) % POOL for j in range(num_blocks)]
    assert len(set(blocks)) == num_blocks <= POOL
    assert num_blocks < 2 or blocks != sorted(blocks)
    return blocks


@pytest.fixture(scope="module")
def references(prompts, smollm2_tokenizer, hf_smollm2):
    """(token ids, transformers' logits [len, vocab]) per prompt index."""
    refs = {}
    for i in PROMPT_INDICES:
        ids = smollm2_tokenizer(prompts[i]).input_ids
        with torch.no_grad():
            refs[i] = ids, hf_smollm2(torch.tensor([ids])).logits[0]
    return refs


@pytest.mark.parametrize("index", PROMPT_INDICES)
def test_whole_prompt_in_one_prefill_matches_transformers(
    index, references, pagoda_smollm2, kv_cache_binder, model_step
):
    ids, ref = references[index]
    blocks = list(range(-(-len(ids) // BLOCK_SIZE)))
    kv_cache_binder(pagoda_smollm2, len(blocks), BLOCK_SIZE)
    logits = model_step(pagoda_smollm2, ids, [(0, len(ids), blocks)], BLOCK_SIZE)
    assert_logits_close(logits, ref)


@pytest.mark.parametrize("index", PROMPT_INDICES)
def test_prompt_in_three_chunks_over_scattered_blocks_matches_transformers(
    index, references, pagoda_smollm2, kv_cache_binder, model_step
):
    ids, ref = references[index]
    n = len(ids)
    num_blocks = -(-n // BLOCK_SIZE)
    blocks = scattered_blocks(num_blocks)
    kv_cache_binder(pagoda_smollm2, POOL, BLOCK_SIZE)
    # Chunks start in the middle of a block (odd offsets, block size even).
    cuts = [0, n // 3 | 1, 2 * n // 3 | 1, n]
    for start, end in itertools.pairwise(cuts):
        assert start % BLOCK_SIZE or start == 0
        logits = model_step(
            pagoda_smollm2, ids[start:end], [(start, end - start, blocks)], BLOCK_SIZE
        )
        assert_logits_close(logits, ref[start:end])


def test_decodes_and_prefill_chunks_of_two_requests_share_one_forward(
    references, pagoda_smollm2, kv_cache_binder, model_step
):
    (a_ids, a_ref), (b_ids, b_ref) = references[3], references[7]
    a_n, b_n = len(a_ids), len(b_ids)
    shuffled = scattered_blocks(POOL)
    a_blocks = shuffled[: -(-a_n // BLOCK_SIZE)]
    b_blocks = shuffled[len(a_blocks) : len(a_blocks) + -(-b_n // BLOCK_SIZE)]
    kv_cache_binder(pagoda_smollm2, POOL, BLOCK_SIZE)

    # Step 1: A's prompt but its last two tokens, and B's first chunk.
    a_pre, b_cut, b_end = a_n - 2, 21, 93
    logits = model_step(
        pagoda_smollm2,
        a_ids[:a_pre] + b_ids[:b_cut],
        [(0, a_pre, a_blocks), (0, b_cut, b_blocks)],
        BLOCK_SIZE,
    )
    assert_logits_close(logits[:a_pre], a_ref[:a_pre])
    assert_logits_close(logits[a_pre:], b_ref[:b_cut])

    # Step 2: A decodes one token while B prefills its next chunk.
    logits = model_step(
        pagoda_smollm2,
        a_ids[a_pre : a_pre + 1] + b_ids[b_cut:b_end],
        [(a_pre, 1, a_blocks), (b_cut, b_end - b_cut, b_blocks)],
        BLOCK_SIZE,
    )
    assert_logits_close(logits[:1], a_ref[a_pre : a_pre + 1])
    assert_logits_close(logits[1:], b_ref[b_cut:b_end])

    # Step 3: the other order in the batch: B's last chunk, then A's decode.
    logits = model_step(
        pagoda_smollm2,
        b_ids[b_end:] + a_ids[a_pre + 1 :],
        [(b_end, b_n - b_end, b_blocks), (a_pre + 1, 1, a_blocks)],
        BLOCK_SIZE,
    )
    assert_logits_close(logits[:-1], b_ref[b_end:])
    assert_logits_close(logits[-1:], a_ref[a_pre + 1 :])
