"""Multi-LoRA shrink/expand: the Triton kernels and the torch twin both equal
a per-token reference (each token through its own slot's A and B), for
tokens of several adapters and of the base model mixed in one batch."""

import pytest
import torch
from pagoda.kernels import reference
from pagoda.kernels.ops import add_lora

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def per_token(y, x, lora_a, lora_b, slots, width):
    """The definition, one token at a time in float64."""
    out = y.double().clone()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        a = lora_a[slot * width : (slot + 1) * width].double()
        b = lora_b[:, slot * width : (slot + 1) * width].double()
        out[t] += b @ (a @ x[t].double())
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tokens", "in_f", "out_f", "slots", "width"),
    [
        (7, 64, 96, 4, 8),  # decode-like, several adapters and base tokens
        (33, 48, 40, 3, 24),  # a fused QKV (3 x rank 8), widths not powers of 2
        (5, 200, 300, 1, 16),  # a single slot
    ],
)
@pytest.mark.parametrize("impl", ["triton", "twin"])
def test_add_lora_equals_the_per_token_definition(dtype, tokens, in_f, out_f, slots, width, impl):
    gen = torch.Generator().manual_seed(tokens + in_f)
    x = torch.randn(tokens, in_f, generator=gen).to(DEVICE, dtype)
    y = torch.randn(tokens, out_f, generator=gen).to(DEVICE, dtype)
    lora_a = (0.1 * torch.randn(slots * width, in_f, generator=gen)).to(DEVICE, dtype)
    lora_b = (0.1 * torch.randn(out_f, slots * width, generator=gen)).to(DEVICE, dtype)
    token_slots = torch.randint(-1, slots, (tokens,), generator=gen).to(DEVICE)
    token_slots[0] = -1  # at least one base-model token
    expected = per_token(y, x, lora_a, lora_b, token_slots, width)
    out = y.clone()
    if impl == "triton" and not (DEVICE.type == "cuda" or _interpreter()):
        pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
    add_lora(out, x, lora_a, lora_b, token_slots, width, triton=impl == "triton")
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)
    base = token_slots < 0
    assert torch.equal(out[base], y[base])  # base-model rows untouched


def test_the_twin_has_no_loop_and_takes_every_slot_at_once():
    # All tokens of one slot, then none: the twin's dense form masks per token.
    x, y = torch.ones(4, 8), torch.zeros(4, 6)
    lora_a = torch.cat([torch.full((2, 8), float(s + 1)) for s in range(3)])
    lora_b = torch.ones(6, 6)
    slots = torch.tensor([2, 2, -1, 0])
    reference.add_lora_ref(y, x, lora_a, lora_b, slots, 2)
    # slot 2: A rows = 3 -> A x = 24 per rank row, two rows -> B sums 48.
    assert y[:, 0].tolist() == [48.0, 48.0, 0.0, 16.0]


def _interpreter() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"
