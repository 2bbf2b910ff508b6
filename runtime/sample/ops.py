"""Pure tensor functions the sampler composes; each works on a whole batch.

Every function takes logits of shape [R, V] (float32) and per-row parameters,
and returns new logits: none mutates its input, so each is testable alone and
the caller's tensor (e.g. the model's output buffer) is never clobbered.
Masked tokens get -inf, so they have probability exactly 0 after softmax.
"""

from __future__ import annotations

import numpy as np
import torch

_NEG_INF = float("-inf")


def pad_token_lists(
    token_lists: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Pack ragged token-id lists into an int64 [R, max_len] tensor padded with `pad_id`.

    Built with one boolean-mask assignment in numpy (row-major order matches
    the concatenation), not a Python loop over elements.
    """
    lens = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
    width = int(lens.max()) if len(lens) else 0
    out = np.full((len(token_lists), width), pad_id, dtype=np.int64)
    if width:
        out[np.arange(width) < lens[:, None]] = np.fromiter(
            (t for row in token_lists for t in row), dtype=np.int64, count=int(lens.sum())
        )
    return torch.from_numpy(out).to(device)


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Per-row occurrence counts [R, V] of padded token ids [R, L].

    Padding is `vocab_size`: it lands in an extra column that is dropped.
    """
    rows = token_ids.shape[0]
    counts = torch.zeros(rows, vocab_size + 1, dtype=torch.int64, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def apply_logit_bias(
    logits: torch.Tensor, bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
) -> torch.Tensor:
    """Add each row's logit_bias (flat rows, token ids, values) to its logits."""
    if bias is None:
        return logits
    rows, cols, values = bias
    return logits.index_put((rows, cols), values, accumulate=True)


def apply_min_tokens(logits: torch.Tensor, stop_ids: dict[int, list[int]]) -> torch.Tensor:
    """Mask `stop_ids[row]` (EOS and stop tokens) for rows below their min_tokens."""
    if not stop_ids:
        return logits
    rows = [r for r, ids in stop_ids.items() for _ in ids]
    cols = [t for ids in stop_ids.values() for t in ids]
    out = logits.clone()
    out[torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)] = (
        _NEG_INF
    )
    return out


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor | None,
    output_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Apply repetition, then frequency and presence penalties, as vLLM and HF do.

    Repetition (CTRL paper, arXiv:1909.05858): a token seen in the prompt or
    the output has its logit divided by the penalty when positive and
    multiplied when negative, so a penalty > 1 always makes it less likely.
    Frequency and presence (OpenAI): subtract `frequency * count` and
    `presence * [count > 0]`, counting the output only.

    `prompt_token_ids` [R, P] and `output_token_ids` [R, L] are int64 padded
    with V (= logits.shape[1]); penalties are [R] float32, neutral values
    (1, 0, 0) leave a row unchanged.
    """
    vocab_size = logits.shape[1]
    output_counts = token_counts(output_token_ids, vocab_size)
    seen = output_counts > 0
    if prompt_token_ids is not None:
        seen = seen | (token_counts(prompt_token_ids, vocab_size) > 0)
    rep = repetition_penalties.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    logits = logits - frequency_penalties.unsqueeze(1) * output_counts.to(logits.dtype)
    logits = logits - presence_penalties.unsqueeze(1) * (output_counts > 0).to(logits.dtype)
    return logits


def apply_top_k_top_p(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    max_candidates: int = 1024,
) -> torch.Tensor:
    """Keep each row's `top_k` highest logits, then its smallest nucleus of mass `top_p`.

    Top-k keeps exactly k tokens (by sorted position, so ties at the k-th
    value do not let more through). Top-p is computed on the distribution
    renormalised after top-k (HF and vLLM order) and keeps a token while the
    mass strictly before it is < p, so the most likely token always
    survives. Off rows hold k >= V and p = 1.0; p = 1.0 is special-cased
    because a float32 cumsum can reach 1.0 before the tail and would drop
    tokens of tiny probability.

    A full sort of [R, V] costs ~4 ms a row on a CPU at V=49k, so only rows
    that filter are touched, and they work on their `torch.topk` candidates:
    the k best when k is at most the batch's largest k, else the
    `max_candidates` best, enough whenever those hold mass >= p (a row
    whose candidates fall short is redone with a full sort). Results equal
    the full-sort reference `top_k_top_p_sorted`.
    """
    if top_k is None and top_p is None:
        return logits
    rows_, vocab = logits.shape
    k = top_k if top_k is not None else torch.full((rows_,), vocab, device=logits.device)
    p = top_p if top_p is not None else torch.ones(rows_, device=logits.device)
    k = k.clamp(max=vocab)
    rows = ((k < vocab) | (p < 1.0)).nonzero().squeeze(1)
    if rows.numel() == 0:
        return logits
    sub, k, p = logits[rows], k[rows], p[rows]
    num = int(torch.where(k < vocab, k, min(max_candidates, vocab)).max())
    values, indices = sub.topk(num, dim=-1)  # sorted, descending
    positions = torch.arange(num, device=logits.device)
    values = values.masked_fill(positions >= k.unsqueeze(1), _NEG_INF)
    # Rows without top-k see only part of their distribution: normalise by
    # the whole row, and fall back to a full sort if the nucleus may be cut.
    partial = k > num
    norm = torch.where(
        partial.unsqueeze(1),
        sub.logsumexp(dim=-1, keepdim=True),
        values.logsumexp(dim=-1, keepdim=True),
    )
    probs = (values - norm).exp()
    mass_before = probs.cumsum(dim=-1) - probs
    values = values.masked_fill(_nucleus_mask(mass_before, p), _NEG_INF)
    filtered = torch.full_like(sub, _NEG_INF).scatter_(1, indices, values)
    short = partial & (probs.sum(dim=-1) < p)
    if short.any():
        filtered[short] = top_k_top_p_sorted(sub[short], k[short], p[short])
    out = logits.clone()
    out[rows] = filtered
    return out


def top_k_top_p_sorted(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Reference top-k then top-p over one full descending sort (same rules as above)."""
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    positions = torch.arange(logits.shape[1], device=logits.device)
    sorted_logits = sorted_logits.masked_fill(positions >= top_k.unsqueeze(1), _NEG_INF)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(_nucleus_mask(mass_before, top_p), _NEG_INF)
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def _nucleus_mask(mass_before: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sorted positions outside the nucleus: those with mass >= p before them.

    The first position is always kept. A tiny p (1e-50 underflows to 0.0 in
    float32) would otherwise mask every token, and the argmax of an all -inf
    row is token 0, not the most likely token.
    """
    mask = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    mask[:, 0] = False
    return mask


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below `min_p` times the row's top probability.

    The most likely token always survives (its ratio is 1 >= min_p).
    """
    probs = logits.softmax(dim=-1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, _NEG_INF)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Draw one token per row with the exponential race: argmax(probs / q), q ~ Exp(1).

    This equals sampling from `probs` (the race's winner is distributed as the
    normalised weights) without a CPU sync or torch.multinomial. Unseeded rows
    draw q in one batched call; each seeded row redraws its q row with its own
    generator, so its tokens do not depend on the batch around it.
    q = -log(u) with u ~ U[0, 1) is Exp(1); on a CPU it is ~9x faster than
    `exponential_`. q is clamped away from 0: a zero would turn 0/0 into
    NaN, which argmax picks, and so could emit a masked token (u = 0 gives
    q = inf, whose token simply loses).
    """
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.uniform_()
    for row, gen in generators.items():
        q[row].uniform_(generator=gen)
    q.log_().neg_().clamp_(min=torch.finfo(q.dtype).tiny)
    return probs.div(q).argmax(dim=-1)


def top_logprobs(
    logprobs: torch.Tensor, sampled: torch.Tensor, num_logprobs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled token then the top-`num_logprobs` tokens, their log-probs, and ranks.

    Returns (token_ids [R, N+1] int64, logprobs [R, N+1] float32,
    sampled_ranks [R] int64). The rank is 1 + the number of tokens strictly
    more likely than the sampled one, so greedy's argmax has rank 1.
    """
    top_vals, top_ids = logprobs.topk(num_logprobs, dim=-1)
    sampled = sampled.unsqueeze(1)
    sampled_lp = logprobs.gather(1, sampled)
    ranks = (logprobs > sampled_lp).sum(dim=-1) + 1
    return (
        torch.cat([sampled, top_ids], dim=1),
        torch.cat([sampled_lp, top_vals], dim=1),
        ranks,
    )
