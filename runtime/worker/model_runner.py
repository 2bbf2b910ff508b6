"""Runs the model for one scheduler decision and samples the next tokens."""

from __future__ import annotations

import logging

import numpy as np
import torch
from pagoda.runtime.attention.backend import AttentionMetadata, kv_cache_shape
from pagoda.runtime.attention.selector import select_backend
from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagoda.runtime.layers.custom_op import set_triton_kernels
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.model_loader.loader import load_model
from pagoda.runtime.sample.metadata import SamplingMetadata
from pagoda.runtime.sample.sampler import Sampler, logprobs_to_lists
from pagoda.runtime.worker.cuda_graph import CudaGraphRunner, default_capture_sizes
from pagoda.runtime.worker.input_batch import CachedRequestState, InputBatch

logger = logging.getLogger(__name__)

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, step) pairs


class ModelRunner:
    """Owns the model, the KV cache tensors and the persistent batch."""

    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        attention_backend: str = "auto",
        seed: int = 0,
        enforce_eager: bool = False,
        cuda_graph_sizes: list[int] | None = None,
        fused_kernels: bool = True,
    ):
        self.model_config = model_config
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.device = model_config.device
        self.dtype = model_config.dtype
        self.seed = seed
        # Triton kernels need a GPU; under TRITON_INTERPRET on the CPU they
        # would run, but orders of magnitude slower than the torch twins.
        self.use_triton_kernels = fused_kernels and self.device.type == "cuda"
        self.backend = select_backend(attention_backend, self.device)
        self.batch = InputBatch(
            scheduler_config.max_num_seqs, model_config.max_model_len, cache_config.block_size
        )
        self.sampler = Sampler()
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.weight_bytes = 0
        # Graphs need kernels that never sync with the host: the Triton
        # backend's; the torch backend decides its work from host tensors.
        self.use_cuda_graphs = (
            self.device.type == "cuda" and self.backend.name == "triton" and not enforce_eager
        )
        self.cuda_graph_sizes = cuda_graph_sizes or default_capture_sizes(
            scheduler_config.max_num_seqs
        )
        self.graph_runner: CudaGraphRunner | None = None

    # ---- set-up -------------------------------------------------------
    def load_model(self) -> None:
        torch.manual_seed(self.seed)
        self.model = load_model(self.model_config, self.seed)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        for layer in self.model.attention_layers():
            layer.backend = self.backend
        set_triton_kernels(self.model, self.use_triton_kernels)

    def kv_bytes_per_block(self) -> int:
        a = self.model_config.arch
        per_token = 2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim
        return per_token * self.cache_config.block_size * self.dtype.itemsize

    def determine_num_blocks(self) -> int:
        """Blocks that fit the memory budget: on CUDA what is left of
        `gpu_memory_utilization` of the device after weights and a profiling
        forward at the full token budget; on the CPU `kv_cache_memory_gib`."""
        if self.cache_config.num_kv_blocks is not None:
            return self.cache_config.num_kv_blocks
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            peak = self._profile_peak_memory()
            used_by_others = total - free - torch.cuda.memory_reserved(self.device)
            budget = total * self.cache_config.gpu_memory_utilization - peak - used_by_others
        else:
            budget = self.cache_config.kv_cache_memory_gib * 2**30
        return max(0, int(budget // self.kv_bytes_per_block()))

    @torch.inference_mode()
    def _profile_peak_memory(self) -> int:
        torch.cuda.reset_peak_memory_stats(self.device)
        n = min(self.scheduler_config.max_num_batched_tokens, self.model_config.max_model_len)
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        positions = torch.arange(n, device=self.device)
        # A throwaway one-block-per-request cache is enough to run attention.
        saved = [layer.kv_cache for layer in self.model.attention_layers()]
        a = self.model_config.arch
        bs = self.cache_config.block_size
        blocks = -(-n // bs)
        scratch = torch.zeros(
            kv_cache_shape(blocks, bs, a.num_key_value_heads, a.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        for layer in self.model.attention_layers():
            layer.kv_cache = scratch
        meta = self._metadata_for_single(n, blocks)
        hidden = self.model(ids, positions, meta)
        self.model.compute_logits(hidden[-self.scheduler_config.max_num_seqs :])
        for layer, cache in zip(self.model.attention_layers(), saved):
            layer.kv_cache = cache
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        del scratch, hidden
        torch.cuda.empty_cache()
        return peak

    def _metadata_for_single(self, n: int, blocks: int) -> AttentionMetadata:
        qsl = torch.tensor([0, n], dtype=torch.int32)
        seq = torch.tensor([n], dtype=torch.int32)
        table = torch.arange(blocks, dtype=torch.int32)[None]
        return AttentionMetadata(
            num_actual_tokens=n,
            num_reqs=1,
            max_query_len=n,
            max_seq_len=n,
            query_start_loc=qsl.to(self.device),
            seq_lens=seq.to(self.device),
            block_table=table.to(self.device),
            slot_mapping=torch.arange(n, dtype=torch.long, device=self.device),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq,
        )

    def init_kv_cache(self, num_blocks: int) -> None:
        a = self.model_config.arch
        shape = kv_cache_shape(
            num_blocks, self.cache_config.block_size, a.num_key_value_heads, a.head_dim
        )
        self.kv_caches = []
        for layer in self.model.attention_layers():
            cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.kv_cache = cache
            self.kv_caches.append(cache)
        if self.use_cuda_graphs:
            a = self.model_config.arch
            self.graph_runner = CudaGraphRunner(
                self.model,
                self.backend,
                [s for s in self.cuda_graph_sizes if s <= self.scheduler_config.max_num_seqs],
                self.batch.block_table.shape[1],
                self.model_config.max_model_len,
                a.num_key_value_heads,
                self.device,
            )
            self.graph_runner.capture()

    # ---- one step -----------------------------------------------------
    def _update_batch(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.batch.remove(req_id)
        for new in so.scheduled_new_reqs:
            self.batch.remove(new.req_id)  # a resumed request replaces its old row
            sp = new.sampling_params
            gen = None
            if sp.seed is not None:
                gen = torch.Generator(device=self.device)
            state = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                sampling_params=sp,
                generator=gen,
                eos_token_ids=new.eos_token_ids,
                block_ids=list(new.block_ids),
            )
            self.batch.add(state, new.num_computed_tokens)
        cached = so.scheduled_cached_reqs
        for req_id, new_blocks, computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens
        ):
            row = self.batch.index[req_id]
            self.batch.append_blocks(row, new_blocks)
            self.batch.num_computed_tokens[row] = computed

    def _prepare_inputs(self, so: SchedulerOutput):
        b = self.batch
        req_ids = list(so.num_scheduled_tokens)
        rows = np.fromiter((b.index[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        num_sched = np.fromiter(so.num_scheduled_tokens.values(), dtype=np.int64, count=len(rows))
        total = int(num_sched.sum())
        cu = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(num_sched, out=cu[1:])
        # Position of every token of the step: its request's computed count
        # plus its offset within the request's run of scheduled tokens.
        req_of_token = np.repeat(np.arange(len(rows)), num_sched)
        computed = b.num_computed_tokens[rows].astype(np.int64)
        positions = computed[req_of_token] + (np.arange(total) - cu[:-1][req_of_token])
        token_rows = rows[req_of_token]
        input_ids = b.token_ids[token_rows, positions]
        bs = self.cache_config.block_size
        slots = b.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = computed + num_sched
        max_blocks = int(-(-seq_lens.max() // bs))
        block_table = b.block_table[rows, :max_blocks]
        # Requests that reach the end of their known tokens sample one.
        samples = seq_lens == b.num_tokens[rows]
        logits_indices = cu[1:][samples] - 1

        dev = self.device
        qsl_cpu = torch.from_numpy(cu.astype(np.int32))
        seq_cpu = torch.from_numpy(seq_lens.astype(np.int32))
        meta = AttentionMetadata(
            num_actual_tokens=total,
            num_reqs=len(rows),
            max_query_len=int(num_sched.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=qsl_cpu.to(dev, non_blocking=True),
            seq_lens=seq_cpu.to(dev, non_blocking=True),
            block_table=torch.from_numpy(block_table).to(dev, non_blocking=True),
            slot_mapping=torch.from_numpy(slots).to(dev, non_blocking=True),
            query_start_loc_cpu=qsl_cpu,
            seq_lens_cpu=seq_cpu,
        )
        ids = torch.from_numpy(input_ids.astype(np.int64)).to(dev, non_blocking=True)
        pos = torch.from_numpy(positions).to(dev, non_blocking=True)
        sample_rows = rows[samples]
        sample_req_ids = [r for r, s in zip(req_ids, samples.tolist()) if s]
        return ids, pos, meta, torch.from_numpy(logits_indices).to(dev), sample_rows, sample_req_ids

    def _sampling_metadata(self, sample_rows: np.ndarray) -> SamplingMetadata:
        states = [self.batch.states[r] for r in sample_rows.tolist()]
        generators = {}
        for i, st in enumerate(states):
            if st.generator is not None:
                # Reseeded from (seed, tokens generated so far) every step:
                # a seeded request draws the same numbers whatever else is in
                # the batch, and again after a preemption replays its tokens.
                step = len(st.output_token_ids)
                st.generator.manual_seed((st.sampling_params.seed * _SEED_MIX + step) % 2**63)
                generators[i] = st.generator
        return SamplingMetadata.from_requests(
            params=[st.sampling_params for st in states],
            prompt_token_ids=[st.prompt_token_ids for st in states],
            output_token_ids=[st.output_token_ids for st in states],
            generators=generators,
            eos_token_ids=[st.eos_token_ids for st in states],
            vocab_size=self.model_config.vocab_size,
            device=self.device,
        )

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_batch(so)
        if so.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput(sampled_token_ids={})
        ids, pos, meta, logits_idx, sample_rows, sample_req_ids = self._prepare_inputs(so)
        if self.graph_runner is not None and self.graph_runner.can_run(meta):
            hidden = self.graph_runner.run(ids, pos, meta)
        else:
            hidden = self.model(ids, pos, meta)
        if not sample_req_ids:
            return ModelRunnerOutput(sampled_token_ids={})
        logits = self.model.compute_logits(hidden[logits_idx]).float()
        sampling = self._sampling_metadata(sample_rows)
        out = self.sampler(logits, sampling)
        tokens = out.sampled_token_ids.tolist()
        self.batch.append_sampled(sample_rows, tokens)
        logprobs = {}
        if out.logprobs is not None:
            wanted = [self.batch.states[r].sampling_params.logprobs for r in sample_rows.tolist()]
            for req_id, lp in zip(sample_req_ids, logprobs_to_lists(out.logprobs, wanted)):
                if lp is not None:
                    logprobs[req_id] = [lp]
        return ModelRunnerOutput(
            sampled_token_ids={r: [t] for r, t in zip(sample_req_ids, tokens)},
            logprobs=logprobs,
        )
