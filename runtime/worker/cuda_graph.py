"""CUDA graphs for decode-only steps.

A decode step of a small model is dominated by kernel launches (hundreds per
forward); replaying a captured graph issues them all at once. One graph is
captured per batch size in `batch_sizes`; a decode step of `n` requests
replays the smallest captured size >= n, with the extra rows padded so that
they write nothing (slot -1) and attend to one key.

Captured kernels read their inputs from static buffers, so every replay first
copies the step's inputs into them. Launch parameters the kernels take as
host integers are frozen at capture: the attention backend is asked to pin
its split-KV factor while capturing, which is correct for any context length
because the kernel bounds each split by the request's real length.
"""

from __future__ import annotations

import logging
import time

import torch
from pagoda.runtime.attention.backend import AttentionMetadata

logger = logging.getLogger(__name__)


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_num_seqs (vLLM's shape)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if max_num_seqs not in sizes:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


class CudaGraphRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend,
        batch_sizes: list[int],
        max_blocks_per_req: int,
        max_model_len: int,
        num_kv_heads: int,
        device: torch.device,
    ):
        self.model = model
        self.backend = backend
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_model_len = max_model_len
        self.num_kv_heads = num_kv_heads
        self.device = device
        n = self.batch_sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(n, max_blocks_per_req, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def _metadata(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=b,
            num_reqs=b,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b],
            block_table=self.block_table[:b],
            slot_mapping=self.slot_mapping[:b],
            query_start_loc_cpu=torch.arange(b + 1, dtype=torch.int32),
            seq_lens_cpu=torch.full((b,), self.max_model_len, dtype=torch.int32),
        )

    @torch.inference_mode()
    def capture(self) -> None:
        from pagoda.kernels.paged_attention import _num_sms, choose_num_splits

        start = time.perf_counter()
        pool = None
        saved_splits = getattr(self.backend, "num_splits", None)
        try:
            # Largest first, so smaller graphs reuse its memory pool.
            for b in reversed(self.batch_sizes):
                self.backend.num_splits = choose_num_splits(
                    b, self.num_kv_heads, self.max_model_len, _num_sms(self.device)
                )
                meta = self._metadata(b)
                for _ in range(2):  # compile and warm the kernels outside capture
                    self.model(self.input_ids[:b], self.positions[:b], meta)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self.model(self.input_ids[:b], self.positions[:b], meta)
                pool = graph.pool()
                self.graphs[b] = (graph, hidden)
        finally:
            self.backend.num_splits = saved_splits
        torch.cuda.synchronize(self.device)
        logger.info(
            "Captured CUDA graphs for %d decode batch sizes (up to %d) in %.1f s",
            len(self.graphs),
            self.max_batch_size,
            time.perf_counter() - start,
        )

    def can_run(self, meta: AttentionMetadata) -> bool:
        return (
            bool(self.graphs)
            and meta.max_query_len == 1
            and meta.num_actual_tokens == meta.num_reqs
            and meta.num_reqs <= self.max_batch_size
        )

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Replay the graph for this decode step; returns hidden states [n, H]."""
        n = meta.num_reqs
        b = next(s for s in self.batch_sizes if s >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:b].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:b].fill_(1)
        width = meta.block_table.shape[1]
        self.block_table[:n, :width].copy_(meta.block_table)
        graph, hidden = self.graphs[b]
        graph.replay()
        return hidden[:n]
