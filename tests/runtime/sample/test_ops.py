"""The sampler's pure tensor functions, each against a hand-computed expectation."""

import math

import torch
from pagoda.runtime.sample import ops

NEG_INF = float("-inf")


def test_pad_token_lists_pads_ragged_rows_with_the_pad_id():
    out = ops.pad_token_lists([[3, 1], [], [4, 1, 5]], pad_id=9)
    assert out.dtype == torch.int64
    assert out.tolist() == [[3, 1, 9], [9, 9, 9], [4, 1, 5]]


def test_pad_token_lists_of_empty_rows_has_zero_width():
    assert ops.pad_token_lists([[], []], pad_id=9).shape == (2, 0)


def test_token_counts_ignores_padding():
    ids = torch.tensor([[1, 1, 3, 5], [0, 5, 5, 5]])  # 5 = vocab_size = padding
    assert ops.token_counts(ids, 5).tolist() == [[0, 2, 0, 1, 0], [1, 0, 0, 0, 0]]


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    prompt = torch.tensor([[0, 5]])  # token 0 in the prompt
    output = torch.tensor([[1]])  # token 1 in the output
    out = ops.apply_penalties(
        logits,
        prompt,
        output,
        presence_penalties=torch.tensor([0.0]),
        frequency_penalties=torch.tensor([0.0]),
        repetition_penalties=torch.tensor([2.0]),
    )
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0, 1.0]]


def test_frequency_penalty_subtracts_penalty_times_output_count():
    logits = torch.zeros(1, 4)
    output = torch.tensor([[2, 2, 2, 1, 4]])  # 4 = padding
    out = ops.apply_penalties(
        logits,
        torch.tensor([[0, 0]]),  # prompt tokens do not count for frequency
        output,
        presence_penalties=torch.tensor([0.0]),
        frequency_penalties=torch.tensor([0.5]),
        repetition_penalties=torch.tensor([1.0]),
    )
    assert out.tolist() == [[0.0, -0.5, -1.5, 0.0]]


def test_presence_penalty_subtracts_once_per_token_present_in_output():
    logits = torch.ones(1, 4)
    out = ops.apply_penalties(
        logits,
        None,
        torch.tensor([[2, 2, 2, 1]]),
        presence_penalties=torch.tensor([0.25]),
        frequency_penalties=torch.tensor([0.0]),
        repetition_penalties=torch.tensor([1.0]),
    )
    assert out.tolist() == [[1.0, 0.75, 0.75, 1.0]]


def test_penalties_combine_repetition_first_then_frequency_and_presence():
    logits = torch.tensor([[3.0, -1.0, 3.0], [3.0, -1.0, 3.0]])
    out = ops.apply_penalties(
        logits,
        torch.tensor([[2, 3], [3, 3]]),
        torch.tensor([[0, 0], [3, 3]]),
        presence_penalties=torch.tensor([1.0, 1.0]),
        frequency_penalties=torch.tensor([0.5, 0.5]),
        repetition_penalties=torch.tensor([1.5, 1.5]),
    )
    # Row 0: token 0 (twice in output): 3/1.5 - 0.5*2 - 1 = 0; token 2 (prompt): 3/1.5.
    # Row 1 saw nothing: unchanged, the rows are independent.
    assert out.tolist() == [[0.0, -1.0, 2.0], [3.0, -1.0, 3.0]]


def test_penalties_do_not_mutate_their_input():
    logits = torch.tensor([[1.0, 2.0]])
    ops.apply_penalties(
        logits,
        torch.tensor([[0]]),
        torch.tensor([[1]]),
        torch.tensor([1.0]),
        torch.tensor([1.0]),
        torch.tensor([2.0]),
    )
    assert logits.tolist() == [[1.0, 2.0]]


def test_min_tokens_masks_listed_ids_of_listed_rows_only():
    logits = torch.zeros(3, 4)
    out = ops.apply_min_tokens(logits, {0: [1, 3], 2: [0]})
    assert out.tolist() == [
        [0.0, NEG_INF, 0.0, NEG_INF],
        [0.0, 0.0, 0.0, 0.0],
        [NEG_INF, 0.0, 0.0, 0.0],
    ]
    assert (logits == 0).all()


def test_top_k_keeps_exactly_k_highest_per_row():
    logits = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.2], [5.0, 4.0, 3.0, 2.0, 1.0]])
    out = ops.apply_top_k_top_p(logits, torch.tensor([2, 5]), None)
    assert torch.isfinite(out).tolist() == [
        [False, True, False, True, False],
        [True, True, True, True, True],
    ]
    assert out[0, 3] == 0.9 and out[1].tolist() == logits[1].tolist()


def test_top_k_with_ties_keeps_exactly_k():
    out = ops.apply_top_k_top_p(torch.zeros(1, 6), torch.tensor([2]), None)
    assert torch.isfinite(out).sum() == 2


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    keep = lambda p: torch.isfinite(ops.apply_top_k_top_p(logits, None, torch.tensor([p])))  # noqa: E731
    assert keep(0.49).tolist() == [[True, False, False, False]]
    assert keep(0.51).tolist() == [[True, True, False, False]]
    assert keep(0.79).tolist() == [[True, True, False, False]]
    assert keep(0.81).tolist() == [[True, True, True, False]]
    assert keep(1.0).all()
    # The top token survives even a tiny p.
    assert keep(1e-6).tolist() == [[True, False, False, False]]


def test_top_p_applies_to_the_distribution_left_by_top_k():
    # After top-2 the mass is 0.5/0.8 and 0.3/0.8 = 0.625, 0.375: p=0.6 keeps one.
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    out = ops.apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.6]))
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]


def test_top_p_one_keeps_tokens_of_tiny_probability():
    logits = torch.tensor([[0.0] + [-80.0] * 1000])
    out = ops.apply_top_k_top_p(logits, None, torch.tensor([1.0]))
    assert torch.isfinite(out).all()


def test_top_k_top_p_candidates_match_the_full_sort_reference():
    gen = torch.Generator().manual_seed(3)
    rows, vocab = 64, 500
    # Rows from peaked to flat, so some nuclei exceed the candidate set.
    logits = torch.randn(rows, vocab, generator=gen) * torch.linspace(0.1, 8, rows)[:, None]
    top_k = torch.randint(1, 80, (rows,), generator=gen)
    top_k[::3] = vocab  # off
    top_p = torch.rand(rows, generator=gen) * 0.9 + 0.05
    top_p[1::4] = 1.0  # off
    for k, p in [(top_k, top_p), (top_k, None), (None, top_p)]:
        fast = ops.apply_top_k_top_p(logits, k, p, max_candidates=32)
        ref = ops.top_k_top_p_sorted(
            logits,
            k if k is not None else torch.full((rows,), vocab),
            p if p is not None else torch.ones(rows),
        )
        assert torch.equal(fast.isfinite(), ref.isfinite())
        assert torch.equal(fast[fast.isfinite()], logits[fast.isfinite()])


def test_top_k_top_p_leaves_unfiltered_rows_untouched():
    logits = torch.randn(3, 10)
    out = ops.apply_top_k_top_p(logits, torch.tensor([10, 2, 10]), torch.tensor([1.0, 1.0, 1.0]))
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    assert out[1].isfinite().sum() == 2


def test_min_p_drops_tokens_below_fraction_of_top_probability():
    logits = torch.tensor([[0.4, 0.2, 0.1, 0.3]]).log()
    out = ops.apply_min_p(logits, torch.tensor([0.45]))  # threshold 0.18
    assert torch.isfinite(out).tolist() == [[True, True, False, True]]
    assert ops.apply_min_p(logits, torch.tensor([0.0])).isfinite().all()


def test_random_sample_never_picks_zero_probability_tokens():
    probs = torch.zeros(4000, 8)
    probs[:, 3] = 0.5
    probs[:, 6] = 0.5
    torch.manual_seed(0)
    drawn = ops.random_sample(probs, {})
    assert set(drawn.tolist()) == {3, 6}


def test_random_sample_seeded_row_depends_only_on_its_generator():
    probs = torch.full((5, 50), 1 / 50)

    def draw(row: int) -> int:
        gen = torch.Generator().manual_seed(7)
        return ops.random_sample(probs, {row: gen})[row].item()

    assert len({draw(r) for r in range(5)}) == 1


def test_top_logprobs_puts_sampled_first_then_sorted_top_n_with_rank():
    logprobs = torch.tensor([[0.1, 0.4, 0.2, 0.3]]).log()
    ids, lps, ranks = ops.top_logprobs(logprobs, torch.tensor([2]), 2)
    assert ids.tolist() == [[2, 1, 3]]
    assert torch.allclose(lps.exp(), torch.tensor([[0.2, 0.4, 0.3]]))
    assert ranks.tolist() == [3]
    assert math.isclose(lps[0, 0].item(), math.log(0.2), rel_tol=1e-6)
