"""Graphs for decode-only steps: CUDA graphs on the GPU, recorded kernel
graphs on the CPU.

A decode step of a small model is dominated by what issues its kernels, not
by the kernels: hundreds of launches on a GPU, and on the CPU the Python of
the model's modules around ~300 C++ calls (1.4 ms of a 9.7 ms batch-1 step of
SmolLM2). A graph issues them all with none of it:

- CUDA: `torch.cuda.CUDAGraph` captures the step's kernel launches.
- CPU: `pagoda.kernels.cpu`'s `CpuGraph` records every call into the C++
  kernels while one eager forward runs, and a replay runs the same calls again
  from C++, without Python, on the same tensors.

One graph is captured per batch size in `batch_sizes`; a decode step of `n`
requests replays the smallest captured size >= n, with the extra rows padded
so that they write nothing (slot -1) and attend to nothing (length 0, output
zero: see `_padding`).

Captured kernels read their inputs from static buffers, so every replay first
copies the step's inputs into them. What the kernels decide from shapes or
host values is frozen at capture: the Triton backend is asked to pin its
split-KV factor while capturing, which is correct for any context length
because the kernel bounds each split by the request's real length; the C++
kernels read lengths, positions, slots and block tables from the buffers at
every replay.

A CPU graph sees only the C++ kernels: a torch op issued from Python inside
the forward (an op of a model without a C++ kernel, a tensor-parallel
all-reduce, oneDNN's linear) would not be replayed. So each CPU graph is
checked once, before it is used: replayed on new random inputs and compared
with an eager forward on the same inputs, bit for bit. A model that fails the
check runs eagerly, with one warning.
"""

from __future__ import annotations

import logging
import time

import torch
from pagoda.runtime.attention.backend import AttentionMetadata

logger = logging.getLogger(__name__)

# On the CPU a graph saves a fixed ~50 us per layer of host work: past 16
# rows the step's kernels dwarf it, while every CPU graph keeps its own
# intermediate tensors (no shared memory pool, unlike CUDA graphs).
CPU_MAX_CAPTURE_SIZE = 16


def default_capture_sizes(max_num_seqs: int, device_type: str = "cuda") -> list[int]:
    """CUDA: 1, 2, 4, 8, then every multiple of 16 up to max_num_seqs (vLLM's
    shape). CPU: 1, 2, 4, 8 and 16, the sizes up to `CPU_MAX_CAPTURE_SIZE`."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    if device_type == "cpu":
        top = min(max_num_seqs, CPU_MAX_CAPTURE_SIZE)
        return sorted(set(s for s in sizes if s <= top) | {top})
    sizes += list(range(16, max_num_seqs + 1, 16))
    if max_num_seqs not in sizes:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


class GraphCheckFailed(RuntimeError):
    """A CPU graph's replay differed from the eager forward."""


class DecodeGraphRunner:
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
        # batch size -> (graph, its output hidden states); a graph is a
        # torch.cuda.CUDAGraph or a pagoda.kernels.cpu CpuGraph (both replay()).
        self.graphs: dict[int, tuple[object, torch.Tensor]] = {}

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

    def _forward(self, b: int) -> torch.Tensor:
        return self.model(self.input_ids[:b], self.positions[:b], self._metadata(b))

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        if self.device.type == "cuda":
            self._capture_cuda()
        else:
            try:
                for b in reversed(self.batch_sizes):
                    self.graphs[b] = self._capture_cpu(b)
            except RuntimeError as exc:  # GraphCheckFailed, or a kernel refusing the capture
                self.graphs.clear()
                logger.warning("Decode steps run eagerly: %s", exc)
                return
        logger.info(
            "Captured %s graphs for %d decode batch sizes (up to %d) in %.1f s",
            "CUDA" if self.device.type == "cuda" else "CPU",
            len(self.graphs),
            self.max_batch_size,
            time.perf_counter() - start,
        )

    def _capture_cuda(self) -> None:
        from pagoda.kernels.paged_attention import _num_sms, choose_num_splits

        pool = None
        saved_splits = getattr(self.backend, "num_splits", None)
        try:
            # Largest first, so smaller graphs reuse its memory pool.
            for b in reversed(self.batch_sizes):
                self.backend.num_splits = choose_num_splits(
                    b, self.num_kv_heads, self.max_model_len, _num_sms(self.device)
                )
                for _ in range(2):  # compile and warm the kernels outside capture
                    self._forward(b)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self._forward(b)
                pool = graph.pool()
                self.graphs[b] = (graph, hidden)
        finally:
            self.backend.num_splits = saved_splits
        torch.cuda.synchronize(self.device)

    def _capture_cpu(self, b: int) -> tuple[object, torch.Tensor]:
        """Record one eager forward of `b` rows, then check a replay on new
        inputs against an eager forward on them. Both runs write K/V at
        random slots: this runs before any request owns a block."""
        from pagoda.kernels.cpu import build

        gen = torch.Generator().manual_seed(b)
        self._random_inputs(b, gen)
        graph = build().CpuGraph()
        graph.begin_capture()
        try:
            hidden = self._forward(b)
        finally:
            graph.end_capture()
        self._random_inputs(b, gen)
        expected = self._forward(b).clone()
        graph.replay()
        if not torch.equal(hidden, expected):
            diff = (hidden.float() - expected.float()).abs().max().item()
            raise GraphCheckFailed(
                f"a replayed CPU graph of {b} rows differs from the eager forward (max abs "
                f"difference {diff:.3g}): the model issues torch ops the graph cannot record"
            )
        self._padding(0, b)
        return graph, hidden

    def _random_inputs(self, b: int, gen: torch.Generator) -> None:
        """Valid decode inputs: random tokens, context lengths, block tables,
        and each request's new position and its slot."""
        cache = self.model.attention_layers()[0].kv_cache
        num_blocks, block_size = cache.shape[1], cache.shape[2]
        vocab = self.model.config.vocab_size
        longest = min(self.block_table.shape[1] * block_size, self.max_model_len)
        lens = torch.randint(1, longest + 1, (b,), generator=gen)
        table = torch.randint(0, num_blocks, (b, self.block_table.shape[1]), generator=gen)
        pos = lens - 1
        blocks = table.gather(1, (pos // block_size)[:, None]).squeeze(1)
        self.input_ids[:b] = torch.randint(0, vocab, (b,), generator=gen)
        self.positions[:b] = pos
        self.seq_lens[:b] = lens.to(torch.int32)
        self.block_table[:b] = table.to(torch.int32)
        self.slot_mapping[:b] = blocks * block_size + pos % block_size

    def _padding(self, start: int, end: int) -> None:
        """Rows start..end write nothing and attend to nothing (their output
        is zero). Not even to one key: the CPU decode kernel balances the
        batch's positions over threads, and a padded row's position moved the
        cuts of real requests, so on 8 or more threads a replay's
        log-probabilities differed from the eager step's in the 7th digit."""
        self.slot_mapping[start:end].fill_(-1)
        self.seq_lens[start:end].fill_(0)

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
        self.seq_lens[:n].copy_(meta.seq_lens)
        if n < b:  # every decode step passes here: no empty fills
            self._padding(n, b)
        width = meta.block_table.shape[1]
        self.block_table[:n, :width].copy_(meta.block_table)
        graph, hidden = self.graphs[b]
        graph.replay()
        return hidden[:n]
