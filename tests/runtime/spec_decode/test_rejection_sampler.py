"""The rejection sampler emits tokens distributed exactly as the target's p,
whatever the proposal q (chi-square over many draws); a sampler with the
classic bug (resampling from p instead of the residual) fails the same test."""

import pytest
import torch
from pagoda.runtime.spec_decode.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    draw_uniform_and_exponential,
    greedy_verify,
    rejection_sample,
)

V = 6
N = 40_000


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of observed `counts` under `probs` (zero-probability cells
    must be empty: one draw there is a certain failure)."""
    n = counts.sum()
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = n * probs[support]
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    # chi2 survival function = regularised upper incomplete gamma Q(dof/2, x/2).
    return float(torch.special.gammaincc(torch.tensor(dof / 2), stat / 2))


def broken_rejection_sample(draft, num_draft, p, q, uniform, exponential):
    """The bug: on rejection, sample from p instead of (p - q)+."""
    r = draft.shape[0]
    rows = torch.arange(r)
    p_d = p[:, :1].gather(2, draft[:, :1, None]).squeeze(2)[:, 0]
    q_d = q[:, :1].gather(2, draft[:, :1, None]).squeeze(2)[:, 0]
    accept = uniform[:, 0] * q_d < p_d
    fresh = p[rows, 0].div(exponential).argmax(dim=1)
    return torch.where(accept, draft[:, 0], fresh)


def _synthetic(seed: int = 0):
    """p and q for two positions; q puts mass where p has none (token 5),
    p has mass where q has none (token 0)."""
    p = torch.tensor(
        [
            [0.35, 0.25, 0.2, 0.15, 0.05, 0.0],
            [0.1, 0.1, 0.5, 0.0, 0.3, 0.0],
            [0.2, 0.2, 0.2, 0.2, 0.2, 0.0],
        ]
    )
    q = torch.tensor(
        [
            [0.0, 0.1, 0.4, 0.1, 0.1, 0.3],
            [0.3, 0.0, 0.2, 0.2, 0.1, 0.2],
        ]
    )
    return p, q


def _draws(sampler, p, q, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = q.shape[0]
    drafts = torch.stack(
        [torch.multinomial(q[j], N, replacement=True, generator=gen) for j in range(k)], 1
    )
    target = p.unsqueeze(0).expand(N, -1, -1)
    draft_probs = q.unsqueeze(0).expand(N, -1, -1)
    uniform = torch.rand(N, k, generator=gen)
    exponential = -torch.rand(N, V, generator=gen).log()
    num_draft = torch.full((N,), k)
    return sampler(drafts, num_draft, target, draft_probs, uniform, exponential)


def test_first_token_follows_p_whatever_q():
    p, q = _synthetic()
    out = _draws(rejection_sample, p, q)
    counts = torch.bincount(out[:, 0], minlength=V).double()
    assert chi_square_p_value(counts, p[0].double()) > 1e-3


def test_token_after_an_accepted_draft_follows_its_own_p():
    p, q = _synthetic()
    out = _draws(rejection_sample, p, q)
    second = out[:, 1]
    second = second[second != PLACEHOLDER_TOKEN_ID]
    assert len(second) > 5000
    counts = torch.bincount(second, minlength=V).double()
    assert chi_square_p_value(counts, p[1].double()) > 1e-3


def test_bonus_token_follows_the_last_p():
    p, q = _synthetic()
    out = _draws(rejection_sample, p, q)
    bonus = out[:, 2]
    bonus = bonus[bonus != PLACEHOLDER_TOKEN_ID]
    assert len(bonus) > 1000
    counts = torch.bincount(bonus, minlength=V).double()
    assert chi_square_p_value(counts, p[2].double()) > 1e-3


def test_the_same_test_catches_a_sampler_that_resamples_from_p():
    p, q = _synthetic()
    out = _draws(broken_rejection_sample, p, q)
    counts = torch.bincount(out, minlength=V).double()
    assert chi_square_p_value(counts, p[0].double()) < 1e-6


def test_one_hot_proposals_follow_p():
    # n-gram drafts are deterministic: q is one-hot on the draft.
    p, _ = _synthetic()
    gen = torch.Generator().manual_seed(1)
    drafts = torch.full((N, 1), 4)  # p gives token 4 only 5 percent
    out = rejection_sample(
        drafts,
        torch.ones(N, dtype=torch.long),
        p[:2].unsqueeze(0).expand(N, -1, -1),
        None,
        torch.rand(N, 1, generator=gen),
        -torch.rand(N, V, generator=gen).log(),
    )
    counts = torch.bincount(out[:, 0], minlength=V).double()
    assert chi_square_p_value(counts, p[0].double()) > 1e-3


def test_a_draft_where_p_is_zero_is_never_accepted():
    p, q = _synthetic()
    out = _draws(rejection_sample, p, q)
    assert not (out[:, 0] == 5).any()


def test_greedy_accepts_while_the_argmax_matches_then_corrects():
    drafts = torch.tensor([[7, 8, 9], [7, 1, 9], [2, 2, 2]])
    argmax = torch.tensor([[7, 8, 9, 4], [7, 8, 9, 4], [3, 3, 3, 3]])
    out = greedy_verify(drafts, torch.tensor([3, 3, 2]), argmax)
    assert out.tolist() == [[7, 8, 9, 4], [7, 8, -1, -1], [3, -1, -1, -1]]


def test_rows_with_fewer_drafts_never_accept_their_padding():
    drafts = torch.tensor([[7, 8], [7, 8]])
    argmax = torch.tensor([[7, 8, 1], [7, 8, 1]])
    out = greedy_verify(drafts, torch.tensor([2, 1]), argmax)
    assert out.tolist() == [[7, 8, 1], [7, 8, -1]]


@pytest.mark.parametrize("k", [1, 3])
def test_seeded_rows_draw_the_same_numbers_whatever_the_batch(k):
    def gen():
        return torch.Generator().manual_seed(42)

    alone_u, alone_e = draw_uniform_and_exponential(1, k, V, {0: gen()}, "cpu")
    batch_u, batch_e = draw_uniform_and_exponential(3, k, V, {1: gen()}, "cpu")
    assert torch.equal(alone_u[0], batch_u[1])
    assert torch.equal(alone_e[0], batch_e[1])
