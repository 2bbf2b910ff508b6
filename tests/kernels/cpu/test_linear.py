"""The C++ packed linear against a float64 reference: every row-tile and
K-block path, output and K tails, bias, strided rows, and bad input refused.

Its sums are float32 in another order than F.linear's, rounded once to the
output dtype: within half a unit in the last place of the output plus the
float32 sum's error. bf16 runs both ways where the CPU has AVX512-BF16: as
pair dot products, and widened to float32 (`widen_from_rows`); elsewhere
the argument is accepted and changes nothing."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels.cpu import build


@pytest.fixture(scope="module")
def ext():
    return build()


def skip_unless_supported(ext, dtype):
    if not ext.linear_supported(dtype):
        pytest.skip(f"this CPU has no packed linear kernel for {dtype}")


def reference(x, w, bias=None):
    out = x.double() @ w.double().T
    return out if bias is None else out + bias.double()


def assert_close(actual, expected, k):
    assert actual.dtype in (torch.float32, torch.bfloat16)
    half_ulp = 2.0**-8 if actual.dtype == torch.bfloat16 else 2.0**-24  # relative, at most
    scale = expected.abs().max().item()
    # The float32 sum's own error grows with sqrt(K) for random signs; one
    # rounding of the output adds half a unit in its last place.
    err = (actual.double() - expected).abs()
    bound = half_ulp * expected.abs() + 1e-6 * k**0.5 * scale
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


# (rows, out, in): one row; each tile height 1-6; a chunk of 96 and one past
# it; outputs not a multiple of the 64-wide panel; an odd K; a K over one
# 256 KiB block (2048 bf16 or 1024 float32 per panel).
SHAPES = [
    (1, 64, 64),
    (1, 960, 576),
    (5, 100, 33),
    (6, 128, 96),
    (7, 130, 577),
    (97, 192, 64),
    (200, 70, 130),
    (3, 64, 2500),
    (13, 200, 4099),
]


# widen_from_rows: 0 never widens bf16; 1 widens every call.
WIDEN = pytest.mark.parametrize("widen", [0, 1], ids=["pairs", "widened"])


@WIDEN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "out_features", "in_features"), SHAPES)
def test_matches_a_float64_reference(ext, dtype, rows, out_features, in_features, widen):
    skip_unless_supported(ext, dtype)
    gen = torch.Generator().manual_seed(rows * 7919 + in_features)
    w = torch.randn(out_features, in_features, generator=gen).to(dtype)
    x = torch.randn(rows, in_features, generator=gen).to(dtype)
    packed = ext.pack_linear_weight(w)
    got = ext.packed_linear(x, packed, out_features, None, widen)
    assert got.shape == (rows, out_features) and got.dtype == dtype
    assert_close(got, reference(x, w), in_features)


@pytest.fixture
def threads():
    """Set torch's thread count for one test, restoring it afterwards."""
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


# One row chunk whose panels do not divide among the threads: whole panels
# each, then the remaining panels sliced by rows (9 panels of 576 outputs on
# 2 threads; uneven slices; an output tail in a sliced panel; too few rows
# to slice).
@WIDEN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_threads", [2, 3, 4])
@pytest.mark.parametrize(
    ("rows", "out_features"), [(16, 576), (80, 960), (17, 130), (9, 70), (3, 576)]
)
def test_panels_left_over_are_shared_by_rows(
    ext, threads, dtype, num_threads, rows, out_features, widen
):
    skip_unless_supported(ext, dtype)
    threads(num_threads)
    gen = torch.Generator().manual_seed(rows * 31 + out_features)
    w = torch.randn(out_features, 96, generator=gen).to(dtype)
    x = torch.randn(rows, 96, generator=gen).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype)
    got = ext.packed_linear(x, ext.pack_linear_weight(w), out_features, bias, widen)
    assert_close(got, reference(x, w, bias), 96)


@WIDEN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_is_added_before_the_one_rounding(ext, dtype, widen):
    skip_unless_supported(ext, dtype)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(100, 48, generator=gen).to(dtype)
    b = (10 * torch.randn(100, generator=gen)).to(dtype)
    x = torch.randn(9, 48, generator=gen).to(dtype)
    got = ext.packed_linear(x, ext.pack_linear_weight(w), 100, b, widen)
    assert_close(got, reference(x, w, b), 48)


@WIDEN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_with_a_stride_and_no_rows(ext, dtype, widen):
    skip_unless_supported(ext, dtype)
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(64, 40, generator=gen).to(dtype)
    wide = torch.randn(11, 100, generator=gen).to(dtype)
    x = wide[:, 30:70]  # rows 100 apart, e.g. q of a fused qkv
    packed = ext.pack_linear_weight(w)
    assert_close(ext.packed_linear(x, packed, 64, None, widen), reference(x, w), 40)
    assert ext.packed_linear(x[:0], packed, 64, None, widen).shape == (0, 64)


@WIDEN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_never_reaches_the_output(ext, dtype, widen):
    skip_unless_supported(ext, dtype)
    # An odd K: bf16 reads x in pairs, and the element past each row is NaN
    # here; the kernel must not read it (NaN times the zero padding is NaN).
    w = torch.ones(65, 3, dtype=dtype)
    storage = torch.full((2, 4), float("nan"), dtype=dtype)
    x = storage[:, :3].fill_(1.0)
    out = ext.packed_linear(x, ext.pack_linear_weight(w), 65, None, widen)
    assert torch.equal(out, torch.full((2, 65), 3.0, dtype=dtype))


def test_bf16_widens_only_from_its_row_count(ext):
    skip_unless_supported(ext, torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(200, 301, generator=gen).to(torch.bfloat16)
    x = torch.randn(40, 301, generator=gen).to(torch.bfloat16)
    packed = ext.pack_linear_weight(w)
    pairs = ext.packed_linear(x, packed, 200, None, 0)
    widened = ext.packed_linear(x, packed, 200, None, 1)
    # Below its threshold a call runs as it would never widen: the same bits.
    assert torch.equal(ext.packed_linear(x, packed, 200, None, 41), pairs)
    assert torch.equal(ext.packed_linear(x, packed, 200, None, 40), widened)
    # The two ways sum in other orders: equal up to the output's rounding.
    torch.testing.assert_close(widened, pairs, rtol=2**-7, atol=1e-2)
    if not ext.linear_bf16_pairs():  # bf16 is widened either way here
        assert torch.equal(widened, pairs)


def test_bad_input_is_refused(ext):
    skip_unless_supported(ext, torch.float32)
    w = torch.randn(64, 32)
    packed = ext.pack_linear_weight(w)
    x = torch.randn(2, 32)
    with pytest.raises(RuntimeError, match="features"):
        ext.packed_linear(torch.randn(2, 31), packed, 64, None)
    with pytest.raises(RuntimeError, match="out_features"):
        ext.packed_linear(x, packed, 129, None)
    with pytest.raises(RuntimeError, match="dtype"):
        ext.packed_linear(x.double(), packed, 64, None)
    with pytest.raises(RuntimeError, match="bias"):
        ext.packed_linear(x, packed, 64, torch.randn(63))
    with pytest.raises(RuntimeError, match="contiguous rows"):
        ext.packed_linear(torch.randn(32, 2).T, packed, 64, None)
    with pytest.raises(RuntimeError, match="no packed linear"):
        ext.pack_linear_weight(w.double())
