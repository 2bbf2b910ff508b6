"""One vectorised sampler for the whole batch (vLLM V1's order of operations)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pagoda.runtime.core.outputs import TokenLogprobs
from pagoda.runtime.sample import ops
from pagoda.runtime.sample.metadata import SamplingMetadata


@dataclass
class LogprobsTensors:
    """Log-probs of one step, from the raw (unprocessed) logits.

    top_token_ids [R, N+1] int64: the sampled token, then the top-N tokens in
    descending order (the sampled token may appear twice). top_logprobs
    [R, N+1] float32, aligned with it. sampled_ranks [R] int64: the sampled
    token's 1-based rank in the full distribution.
    """

    top_token_ids: torch.Tensor
    top_logprobs: torch.Tensor
    sampled_ranks: torch.Tensor


@dataclass
class SamplerOutput:
    """sampled_token_ids [R] int64; logprobs is None when no row asked for them."""

    sampled_token_ids: torch.Tensor
    logprobs: LogprobsTensors | None


class Sampler(torch.nn.Module):
    """Turns logits [R, V] into one token per row.

    Order (as vLLM V1): log-probs of the raw logits; logit_bias; min_tokens masking;
    penalties; greedy rows take the argmax; random rows are divided by their
    temperature, then top-k, top-p, min-p, softmax and the exponential race.
    Work for a feature is skipped when no row of the batch uses it.
    """

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        raw_logprobs = None
        if metadata.max_num_logprobs is not None:
            raw_logprobs = logits.log_softmax(dim=-1)

        logits = ops.apply_logit_bias(logits, metadata.logit_bias)
        logits = ops.apply_min_tokens(logits, metadata.min_tokens_stop_ids)
        if not metadata.no_penalties:
            output_ids = ops.pad_token_lists(
                metadata.output_token_ids, logits.shape[1], logits.device
            )
            logits = ops.apply_penalties(
                logits,
                metadata.prompt_token_ids,
                output_ids,
                metadata.presence_penalties,
                metadata.frequency_penalties,
                metadata.repetition_penalties,
            )
        sampled = self.sample(logits, metadata)

        logprobs = None
        if raw_logprobs is not None:
            logprobs = LogprobsTensors(
                *ops.top_logprobs(raw_logprobs, sampled, metadata.max_num_logprobs)
            )
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    @staticmethod
    def sample(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """Greedy rows: argmax of `logits`; random rows: temperature, filters, draw."""
        greedy = None if metadata.all_random else logits.argmax(dim=-1)
        if metadata.all_greedy:
            return greedy
        temperature = metadata.temperature
        if not metadata.all_random:
            # Greedy rows' draws are discarded below; 1.0 keeps them finite.
            temperature = torch.where(temperature > 0, temperature, 1.0)
        logits = logits / temperature.unsqueeze(1)
        logits = ops.apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
        if metadata.min_p is not None:
            logits = ops.apply_min_p(logits, metadata.min_p)
        drawn = ops.random_sample(logits.softmax(dim=-1), metadata.generators)
        if greedy is None:
            return drawn
        return torch.where(metadata.temperature > 0, drawn, greedy)


def logprobs_to_lists(
    tensors: LogprobsTensors, num_logprobs: list[int | None] | None = None
) -> list[TokenLogprobs | None]:
    """Per-row TokenLogprobs from one step's tensors (one .tolist() per tensor).

    `num_logprobs[row]` trims a row to the N it asked for (the tensors hold
    the batch's largest N); None there gives None for that row. Without
    `num_logprobs`, every row keeps all N+1 entries.
    """
    ids = tensors.top_token_ids.tolist()
    lps = tensors.top_logprobs.tolist()
    ranks = tensors.sampled_ranks.tolist()
    if num_logprobs is None:
        num_logprobs = [len(row) - 1 for row in ids]
    return [
        None
        if n is None
        else TokenLogprobs(token_ids=i[: n + 1], logprobs=lp[: n + 1], sampled_rank=r)
        for i, lp, r, n in zip(ids, lps, ranks, num_logprobs)
    ]
