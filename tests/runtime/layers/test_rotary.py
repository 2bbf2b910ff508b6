"""RoPE equals transformers' rotate-half RoPE for default, linear and Llama 3
frequency scaling, at positions in any order, beyond the original context."""

import pytest
import torch
from pagoda.runtime.layers.rotary import RotaryEmbedding, rope_inv_freq
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

HEAD_DIM = 64
MAX_POS = 4096
THETA = 500000.0
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
}


def transformers_rope(scaling):
    config = LlamaConfig(
        hidden_size=HEAD_DIM * 2,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_parameters={"rope_type": "default", **(scaling or {}), "rope_theta": THETA},
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_inverse_frequencies_equal_transformers(kind):
    ours = rope_inv_freq(HEAD_DIM, THETA, SCALINGS[kind])
    ref = transformers_rope(SCALINGS[kind])
    assert ref.attention_scaling == 1.0
    torch.testing.assert_close(ours, ref.inv_freq, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_rotated_q_and_k_equal_transformers(kind):
    gen = torch.Generator().manual_seed(0)
    # Unordered, repeated and past original_max_position_embeddings (512).
    positions = torch.tensor([0, 1, 700, 3, 511, 512, 513, 2047, 7, 700, 1500, 100])
    t = positions.numel()
    q = torch.randn(t, 6, HEAD_DIM, generator=gen)
    k = torch.randn(t, 2, HEAD_DIM, generator=gen)
    ours = RotaryEmbedding(HEAD_DIM, MAX_POS, THETA, SCALINGS[kind])
    q_rot, k_rot = ours(positions, q.clone(), k.clone())

    cos, sin = transformers_rope(SCALINGS[kind])(q, positions[None])
    # transformers' layout: [batch, heads, tokens, head_dim].
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    # In float32 the angle position * inv_freq carries a rounding error that
    # grows with the position (an ulp of inv_freq, 6e-8, times 2047 is 1e-4
    # rad), on both sides but not identically; a wrong frequency is off by O(1).
    bound = 1e-5 + 3e-7 * positions[:, None, None]
    assert ((q_rot - q_ref[0].transpose(0, 1)).abs() <= bound).all()
    assert ((k_rot - k_ref[0].transpose(0, 1)).abs() <= bound).all()


def test_rotation_keeps_norms_and_position_zero_is_identity():
    gen = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(HEAD_DIM, MAX_POS, THETA, SCALINGS["llama3"])
    q, k = torch.randn(3, 4, HEAD_DIM, generator=gen), torch.randn(3, 2, HEAD_DIM, generator=gen)
    q_rot, k_rot = rope(torch.tensor([0, 9, 4000]), q, k)
    torch.testing.assert_close(q_rot[0], q[0], rtol=0, atol=0)
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(k_rot.norm(dim=-1), k.norm(dim=-1))


def test_unknown_rope_type_is_rejected():
    with pytest.raises(ValueError, match="yarn"):
        rope_inv_freq(HEAD_DIM, THETA, {"rope_type": "yarn", "factor": 4.0})
