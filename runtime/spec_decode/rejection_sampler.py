"""Verification of draft tokens: the rejection sampler of Leviathan et al.
(arXiv:2211.17192) and Chen et al. (arXiv:2302.01318), vectorised over the batch.

A request drafted d_1..d_s from a proposal distribution q; the target model
gave distributions p_1..p_{s+1} at those positions in one forward. Draft j is
accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first
rejection the token is drawn from the normalised residual (p_j - q_j)+ and
the rest is discarded; when all s are accepted a bonus token is drawn from
p_{s+1}. Every emitted token is then distributed exactly as the target alone
would have sampled it (the papers' theorem; tests/runtime/spec_decode checks
it with a chi-square test). A proposer that drafts deterministically (n-gram)
has q = one-hot(d_j): accept with probability p_j(d_j), resample from p_j
with d_j removed. Greedy requests accept while the target's argmax equals
the draft, so their output is the target's greedy output token for token.

Shapes: R requests, K = the longest draft of the batch, V the vocabulary;
rows with fewer drafts are padded and the padding is never accepted.
"""

from __future__ import annotations

import torch

PLACEHOLDER_TOKEN_ID = -1


def accepted_counts(accept: torch.Tensor, num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """[R] how many leading drafts are accepted: the run of True before the
    first False, within each row's own draft length."""
    k = accept.shape[1]
    valid = torch.arange(k, device=accept.device) < num_draft_tokens.unsqueeze(1)
    return (accept & valid).long().cumprod(dim=1).sum(dim=1)


def _emit(
    draft_token_ids: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor
) -> torch.Tensor:
    """[R, K+1]: the accepted drafts, then `next_token`, then placeholders."""
    r, k = draft_token_ids.shape
    out = torch.full((r, k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=next_token.device)
    keep = torch.arange(k, device=out.device) < num_accepted.unsqueeze(1)
    out[:, :k] = torch.where(keep, draft_token_ids, PLACEHOLDER_TOKEN_ID)
    out[torch.arange(r, device=out.device), num_accepted] = next_token
    return out


def greedy_verify(
    draft_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor, target_argmax: torch.Tensor
) -> torch.Tensor:
    """Greedy rows: accept while the draft equals the target's argmax; the
    target's argmax after the accepted run is the next token (a correction
    or the bonus). target_argmax is [R, K+1]."""
    accept = draft_token_ids == target_argmax[:, :-1]
    num_accepted = accepted_counts(accept, num_draft_tokens)
    rows = torch.arange(len(num_accepted), device=num_accepted.device)
    return _emit(draft_token_ids, num_accepted, target_argmax[rows, num_accepted])


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniform: torch.Tensor,
    exponential: torch.Tensor,
) -> torch.Tensor:
    """Sampling rows: returns [R, K+1] token ids, PLACEHOLDER_TOKEN_ID after
    the last emitted one.

    draft_token_ids [R, K] int64; num_draft_tokens [R]; target_probs
    [R, K+1, V] (p after every sampling transform: penalties, temperature,
    top-k/p, min-p); draft_probs [R, K, V], or None for one-hot proposals;
    uniform [R, K] ~ U[0, 1) decides acceptance; exponential [R, V] ~ Exp(1)
    draws the one token each row samples itself (the exponential race:
    argmax(w / E) is distributed as the normalised weights w).
    """
    r, k = draft_token_ids.shape
    rows = torch.arange(r, device=target_probs.device)
    p_draft = target_probs[:, :k].gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)
    # u < p/q without the division (q is never 0 for a token q drew).
    accept = uniform * q_draft < p_draft
    num_accepted = accepted_counts(accept, num_draft_tokens)

    # One distribution per row: p after the accepted run when every draft
    # was accepted (the bonus token), else the residual at the rejection.
    p_next = target_probs[rows, num_accepted]
    rejected = num_accepted < num_draft_tokens
    dist = p_next
    if bool(rejected.any()):
        at = num_accepted.clamp(max=k - 1)
        if draft_probs is None:
            residual = p_next.scatter(1, draft_token_ids[rows, at].unsqueeze(1), 0.0)
        else:
            residual = (p_next - draft_probs[rows, at]).clamp_(min=0.0)
        # p == q leaves no residual mass, but then a rejection has
        # probability 0; fall back to p so a float tie stays well defined.
        empty = residual.sum(dim=1, keepdim=True) <= 0
        residual = torch.where(empty, p_next, residual)
        dist = torch.where(rejected.unsqueeze(1), residual, p_next)
    next_token = dist.div(exponential).argmax(dim=1)
    return _emit(draft_token_ids, num_accepted, next_token)


def draw_uniform_and_exponential(
    num_rows: int,
    k: int,
    vocab_size: int,
    generators: dict[int, torch.Generator],
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The random numbers of `rejection_sample`: unseeded rows in one batched
    draw, each seeded row from its own generator, in a fixed order (its
    uniforms, then its exponentials), so a seeded request's draws do not
    depend on the rest of the batch."""
    uniform = torch.empty(num_rows, k, device=device)
    u_vocab = torch.empty(num_rows, vocab_size, device=device)
    if len(generators) < num_rows:
        uniform.uniform_()
        u_vocab.uniform_()
    for row, gen in generators.items():
        uniform[row].uniform_(generator=gen)
        u_vocab[row].uniform_(generator=gen)
    # Exp(1) = -log(U); clamped away from 0 (see sample.ops.random_sample).
    exponential = u_vocab.log_().neg_().clamp_(min=torch.finfo(u_vocab.dtype).tiny)
    return uniform, exponential
