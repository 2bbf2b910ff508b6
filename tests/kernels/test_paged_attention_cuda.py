"""Paged attention compiled natively on a CUDA GPU: the tensor-core `tl.dot`
branch in bf16 and fp16, which the CPU interpreter never takes (it computes
16-bit dots in float32), over the shapes production models use.

Every case is compared with a float64 attention from the true K/V, with bf16
tolerances; the output starts as NaN so an unwritten element fails. Skipped
without a CUDA device (the interpreter would take minutes over this matrix).
"""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels.paged_attention import _num_sms, choose_num_splits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# A prefill chunk after cached context, a whole prompt and decodes: many query
# blocks, so the heuristic does not split.
MIXED = [(1, 45), (37, 80), (1, 16), (64, 64), (1, 1), (9, 200)]
# Two long decodes: few programs, so the heuristic splits.
LONG_DECODES = [(1, 3000), (1, 1777)]

TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3}


@pytest.mark.parametrize("split", ["not-chosen", "chosen"])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_native_matches_float64_reference(
    dtype, head_size, block_size, group, split, paged_batch, attention_reference, rel_err, attend
):
    specs = MIXED if split == "not-chosen" else LONG_DECODES
    num_kv_heads = 2
    batch = paged_batch(
        specs,
        num_kv_heads=num_kv_heads,
        group=group,
        head_size=head_size,
        block_size=block_size,
        dtype=dtype,
        seed=head_size * 7 + block_size * 3 + group,
    )
    # The launcher chooses (num_splits=None). A decode-only batch has one query
    # block per request; a mixed one has more, which can only lower the
    # factor, so one block per request bounds it and says which path runs.
    chosen = choose_num_splits(
        len(specs), num_kv_heads, batch.metadata.max_seq_len, _num_sms(batch.query.device)
    )
    assert (chosen > 1) == (split == "chosen")
    scale = head_size**-0.5
    out = attend(batch, scale)
    assert not out.isnan().any()
    assert rel_err(out, attention_reference(batch, scale)) < TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 2, 8, 64])
def test_every_split_factor_agrees(num_splits, paged_batch, attention_reference, rel_err, attend):
    # Llama-3-8B's attention shape: head 128, 32 query heads on 8 KV heads.
    batch = paged_batch(
        [(1, 4100), (1, 33), (1, 1024)],
        num_kv_heads=8,
        group=4,
        head_size=128,
        block_size=16,
        dtype=torch.bfloat16,
        seed=num_splits,
    )
    out = attend(batch, 128**-0.5, num_splits)
    assert not out.isnan().any()
    assert rel_err(out, attention_reference(batch, 128**-0.5)) < TOL[torch.bfloat16]


def test_a_float16_cache_under_bf16_queries(paged_batch, attention_reference, rel_err, attend):
    # A float16 cache under bf16 queries: K/V are converted in registers.
    batch = paged_batch(
        MIXED,
        num_kv_heads=2,
        group=4,
        head_size=128,
        block_size=16,
        dtype=torch.bfloat16,
        seed=11,
        cache_dtype=torch.float16,
    )
    out = attend(batch, 128**-0.5)
    assert rel_err(out, attention_reference(batch, 128**-0.5)) < TOL[torch.bfloat16]
