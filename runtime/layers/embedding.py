"""Token embedding and LM head, split over the vocabulary for tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.kernels import ops
from pagoda.runtime.distributed.parallel_state import TensorParallelGroup
from pagoda.runtime.layers import packed_linear
from pagoda.runtime.layers.custom_op import CustomOp
from pagoda.runtime.model_loader.weights import Weight, materialize
from torch import nn


class VocabParallelEmbedding(CustomOp):
    """Embedding whose rows (vocabulary entries) are split across ranks.

    Each rank holds a contiguous range of `ceil(V / tp)` rows (the last one
    zero-padded), looks up the ids in its range, zeroes the others, and the
    partial embeddings are all-reduced: every id is found on exactly one rank.
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, tp: TensorParallelGroup | None = None
    ):
        super().__init__()
        self.tp = tp or TensorParallelGroup.single()
        self.num_embeddings = num_embeddings
        self.tp_rank = self.tp.rank
        self.tp_size = self.tp.world_size
        self.per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
        # A vocabulary of another size would otherwise load truncated or
        # zero-padded without a word.
        if tuple(loaded.shape) != (self.num_embeddings, param.shape[1]):
            raise ValueError(
                f"weight shape mismatch: expected {(self.num_embeddings, param.shape[1])}, "
                f"got {tuple(loaded.shape)}"
            )
        rows = min(self.per_rank, self.num_embeddings - self.vocab_start)
        param.data.zero_()
        if rows > 0:
            param.data[:rows].copy_(materialize(loaded.narrow(0, self.vocab_start, rows)))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return ops.embedding(input_ids, self.weight, cpu=self.use_cpu_kernels)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits; may share the embedding's weight."""

    # The weight packed for a CPU linear kernel (`packed_linear.pack_model`); the
    # plain `weight` stays only where the embedding shares it.
    packed_weight: packed_linear.PackedWeight | None = None

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Logits [T, V] on the first rank, None on the others: each rank
        computes its vocabulary slice and rank 0 gathers them (only it samples)."""
        if self.packed_weight is not None:
            local = packed_linear.linear(hidden_states, self.packed_weight, None)
        else:
            local = F.linear(hidden_states, self.weight)
        logits = self.tp.gather(local, dim=-1)
        if logits is None:
            return None
        return logits[:, : self.num_embeddings]
