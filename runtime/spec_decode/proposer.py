"""The proposer interface: after a step's tokens are sampled, draft up to k
tokens for each request that sampled, for the next step to verify."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.spec_decode.config import SpeculativeConfig
from pagoda.runtime.spec_decode.ngram_proposer import ngram_propose
from pagoda.runtime.worker.input_batch import InputBatch


@dataclass
class SpecStep:
    """What a proposer sees of the step just run, per scheduled request (in
    the step's order): the batch row, the computed count at the step's
    start, the tokens scheduled, whether it sampled (its new tokens are in
    the batch already), and how many drafts to propose (0: none)."""

    batch: InputBatch
    req_ids: list[str]
    rows: np.ndarray
    computed: np.ndarray
    num_scheduled: np.ndarray
    sampled: np.ndarray
    max_drafts: np.ndarray


@dataclass
class Proposals:
    """Drafts per request id, and for a proposer that samples its drafts the
    distribution each was drawn from ([n, V] per request, greedy requests
    excepted): the rejection sampler needs q where it drew."""

    token_ids: dict[str, list[int]]
    probs: dict[str, torch.Tensor]


class Proposer(abc.ABC):
    """Drafts tokens. Implementations keep whatever per-request state they
    need and drop it in `forget`."""

    def load_model(self) -> None:
        """Load weights, if the proposer has any."""
        return None

    def kv_bytes_per_block(self) -> int:
        """KV bytes the proposer adds to each block of the shared block table."""
        return 0

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the proposer's KV cache, if it has one."""
        return None

    def forget(self, req_ids) -> None:
        """These requests left the batch (finished, aborted or preempted)."""
        return None

    @abc.abstractmethod
    def propose(self, step: SpecStep) -> Proposals: ...


class NgramProposer(Proposer):
    """Prompt lookup over each request's own tokens (`ngram_propose`). Its
    drafts are deterministic: the rejection sampler treats q as one-hot."""

    def __init__(self, config: SpeculativeConfig):
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, step: SpecStep) -> Proposals:
        want = step.sampled & (step.max_drafts > 0)
        if not want.any():
            return Proposals({}, {})
        rows = step.rows[want]
        b = step.batch
        num_tokens = b.num_tokens[rows]
        width = int(num_tokens.max())
        drafts, counts = ngram_propose(
            b.token_ids[rows, :width], num_tokens, step.max_drafts[want], self.min_n, self.max_n
        )
        req_ids = [r for r, w in zip(step.req_ids, want.tolist()) if w]
        out = {
            req_id: row[:n]
            for req_id, row, n in zip(req_ids, drafts.tolist(), counts.tolist())
            if n
        }
        return Proposals(out, {})
