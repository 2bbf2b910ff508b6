"""Token embedding and LM head, split over the vocabulary for tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabParallelEmbedding(nn.Module):
    """Embedding whose rows (vocabulary entries) are split across ranks.

    At tp_size 1 this is a plain embedding; with more ranks each holds a
    contiguous vocabulary range, masks ids outside it and the partial
    embeddings are all-reduced.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.per_rank = -(-num_embeddings // tp_size)
        self.vocab_start = tp_rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        # A vocabulary of another size would otherwise load truncated or
        # zero-padded without a word.
        if tuple(loaded.shape) != (self.num_embeddings, param.shape[1]):
            raise ValueError(
                f"weight shape mismatch: expected {(self.num_embeddings, param.shape[1])}, "
                f"got {tuple(loaded.shape)}"
            )
        rows = loaded[self.vocab_start : self.vocab_start + self.per_rank]
        param.data.zero_()
        param.data[: rows.shape[0]].copy_(rows)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        raise NotImplementedError("tensor parallelism needs a process group (not built yet)")


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits; may share the embedding's weight."""

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden_states, self.weight)
        if self.tp_size == 1:
            return logits[:, : self.num_embeddings]
        raise NotImplementedError("tensor parallelism needs a process group (not built yet)")
