"""Per-row sampling tensors for one step's batch, built once per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.device_copy import host_to_device
from pagoda.runtime.sample.ops import pad_token_lists
from pagoda.runtime.sampling_params import SamplingParams


@dataclass
class SamplingMetadata:
    """What the sampler needs for R rows (one per request that samples this step).

    Neutral values mark rows that do not use a feature, so one vectorised
    pass serves the whole batch:

    - temperature [R] float32: 0.0 means greedy (argmax).
    - top_k [R] int64, or None when no row uses top-k; an "off" row holds
      vocab_size (keep every token).
    - top_p [R] float32, or None when no row uses it; "off" is 1.0.
    - min_p [R] float32, or None when no row uses it; "off" is 0.0.
    - generators: row -> that request's torch.Generator, seeded rows only
      (on the logits' device).
    - max_num_logprobs: the largest `logprobs` any row asked for, or None.
    - penalties [R] float32: presence and frequency "off" is 0.0,
      repetition "off" is 1.0; `no_penalties` is True when every row is off,
      and then prompt_token_ids is None.
    - prompt_token_ids [R, max_prompt_len] int64 padded with vocab_size.
    - output_token_ids: per row, the tokens generated so far.
    - min_tokens_stop_ids: row -> token ids to mask (EOS unless ignore_eos,
      and stop_token_ids) while the row has fewer than min_tokens outputs.
    - logit_bias: (rows, token ids, values) of every row's biases as three
      flat tensors, or None when no row has any.
    """

    temperature: torch.Tensor
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    generators: dict[int, torch.Generator]
    max_num_logprobs: int | None
    no_penalties: bool
    presence_penalties: torch.Tensor
    frequency_penalties: torch.Tensor
    repetition_penalties: torch.Tensor
    prompt_token_ids: torch.Tensor | None
    output_token_ids: list[list[int]]
    min_tokens_stop_ids: dict[int, list[int]]
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_requests(
        cls,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        generators: dict[int, torch.Generator],
        eos_token_ids: list[tuple[int, ...]],
        vocab_size: int,
        device: torch.device | str,
    ) -> SamplingMetadata:
        """Build the batch's metadata from per-row parameters and token lists.

        One attribute read per row and field, then numpy; no per-element work.
        `generators` is keyed by row and should hold exactly the seeded rows.
        """
        n = len(params)

        def column(name: str, dtype: type) -> np.ndarray:
            return np.fromiter((getattr(p, name) for p in params), dtype=dtype, count=n)

        greedy = np.fromiter((p.greedy for p in params), dtype=bool, count=n)
        temperature = np.where(greedy, 0.0, column("temperature", np.float32))
        top_k = column("top_k", np.int64)
        top_k = np.where((top_k <= 0) | (top_k > vocab_size), vocab_size, top_k)
        top_p = column("top_p", np.float32)
        min_p = column("min_p", np.float32)
        presence = column("presence_penalty", np.float32)
        frequency = column("frequency_penalty", np.float32)
        repetition = column("repetition_penalty", np.float32)
        no_penalties = bool(
            (presence == 0).all() and (frequency == 0).all() and (repetition == 1).all()
        )
        requested = [p.logprobs for p in params if p.logprobs is not None]

        def to_dev(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return host_to_device(a, device, dtype)

        random_rows = ~greedy
        return cls(
            temperature=to_dev(temperature, torch.float32),
            all_greedy=bool(greedy.all()),
            all_random=bool(random_rows.all()),
            # Greedy rows never reach top-k/top-p/min-p, so only random rows
            # decide whether those passes run at all.
            top_k=to_dev(top_k, torch.int64)
            if (random_rows & (top_k < vocab_size)).any()
            else None,
            top_p=to_dev(top_p, torch.float32) if (random_rows & (top_p < 1)).any() else None,
            min_p=to_dev(min_p, torch.float32) if (random_rows & (min_p > 0)).any() else None,
            generators=generators,
            max_num_logprobs=max(requested) if requested else None,
            no_penalties=no_penalties,
            presence_penalties=to_dev(presence, torch.float32),
            frequency_penalties=to_dev(frequency, torch.float32),
            repetition_penalties=to_dev(repetition, torch.float32),
            prompt_token_ids=None
            if no_penalties
            else pad_token_lists(prompt_token_ids, vocab_size, device),
            output_token_ids=output_token_ids,
            min_tokens_stop_ids=min_tokens_stop_ids(
                params, output_token_ids, eos_token_ids, vocab_size
            ),
            logit_bias=logit_bias_tensors(params, device),
        )


def min_tokens_stop_ids(
    params: list[SamplingParams],
    output_token_ids: list[list[int]],
    eos_token_ids: list[tuple[int, ...]],
    vocab_size: int,
) -> dict[int, list[int]]:
    """Rows still short of min_tokens -> the ids that would end them (every
    EOS id of the row's model, and its stop ids).

    EOS is left out under ignore_eos: it does not stop such a request, so
    masking it would only distort the distribution.
    """
    out: dict[int, list[int]] = {}
    for row, (p, tokens, eos) in enumerate(zip(params, output_token_ids, eos_token_ids)):
        if len(tokens) >= p.min_tokens:
            continue
        ids = list(p.stop_token_ids)
        if not p.ignore_eos:
            ids += eos
        ids = sorted({t for t in ids if 0 <= t < vocab_size})
        if ids:
            out[row] = ids
    return out


def logit_bias_tensors(
    params: list[SamplingParams], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Every row's logit_bias as flat (rows, token ids, values), for one
    scatter-add over the batch; None when no row has a bias (the usual case)."""
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for row, p in enumerate(params):
        if p.logit_bias:
            rows += [row] * len(p.logit_bias)
            cols += p.logit_bias.keys()
            values += p.logit_bias.values()
    if not rows:
        return None
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(cols, dtype=torch.int64, device=device),
        torch.tensor(values, dtype=torch.float32, device=device),
    )


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own generator: created once per request, kept across steps."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
