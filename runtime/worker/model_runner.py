"""Runs the model for one scheduler decision and samples the next tokens."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from pagoda.kernels import cpu as cpu_kernels
from pagoda.runtime.attention.backend import AttentionMetadata, kv_cache_shape
from pagoda.runtime.attention.selector import select_backend
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.sched_output import (
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from pagoda.runtime.device_copy import host_to_device
from pagoda.runtime.distributed.parallel_state import TensorParallelGroup
from pagoda.runtime.layers import packed_linear
from pagoda.runtime.layers.custom_op import set_cpu_kernels, set_triton_kernels
from pagoda.runtime.lora.manager import LoRAManager
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.model_loader.loader import load_model
from pagoda.runtime.sample.metadata import SamplingMetadata
from pagoda.runtime.sample.sampler import LogprobsTensors, Sampler, logprobs_to_lists
from pagoda.runtime.sampling_params import InvalidRequestError
from pagoda.runtime.spec_decode.proposer import SpecStep
from pagoda.runtime.spec_decode.spec_decoder import SpecDecoder
from pagoda.runtime.worker.decode_graph import DecodeGraphRunner, default_capture_sizes
from pagoda.runtime.worker.input_batch import CachedRequestState, InputBatch

logger = logging.getLogger(__name__)

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, step) pairs


class InFlightStep(AsyncModelRunnerOutput):
    """A step's sampled tokens on their way to the host (async scheduling).

    `sampled` stays on the device, where the next step takes its input ids
    from it; `host` is its copy, complete once `copied` (a CUDA event) is.
    The runner resolves it (records the tokens in its batch and builds the
    output) before the next step samples, or when the engine core asks first.
    """

    def __init__(
        self,
        runner: ModelRunner,
        req_ids: list[str],
        sampled: torch.Tensor,
        host: torch.Tensor,
        copied: torch.cuda.Event | None,
        logprobs: LogprobsTensors | None,
        num_logprobs: list[int | None] | None,
    ):
        self.runner = runner
        self.req_ids = req_ids
        self.position = {req_id: i for i, req_id in enumerate(req_ids)}
        self.sampled = sampled
        self.host = host
        self.copied = copied
        self.logprobs = logprobs
        self.num_logprobs = num_logprobs
        self.output: ModelRunnerOutput | None = None

    def get_output(self) -> ModelRunnerOutput:
        if self.output is None:
            self.runner.resolve_in_flight()
        assert self.output is not None, "only the runner's latest step can be in flight"
        return self.output


class ModelRunner:
    """One rank's model, KV cache tensors, persistent batch and sampler.

    The worker decides the device, the process group and how many KV blocks
    fit; this class turns each step's `SchedulerOutput` into inputs, runs the
    forward and (on the first tensor-parallel rank only) samples.
    """

    def __init__(self, config: EngineConfig, device: torch.device, tp: TensorParallelGroup):
        self.config = config
        self.model_config = config.model_config
        self.cache_config = config.cache_config
        self.scheduler_config = config.scheduler_config
        runner = config.runner_config
        self.device = device
        self.tp = tp
        self.dtype = self.model_config.dtype
        self.kv_cache_dtype = self.cache_config.kv_cache_dtype(self.dtype)
        self.seed = runner.seed
        # Triton kernels need a GPU; under TRITON_INTERPRET on the CPU they
        # would run, but orders of magnitude slower than the torch twins.
        self.use_triton_kernels = runner.fused_kernels and device.type == "cuda"
        # On the CPU the fast path is linears on weights packed at load and
        # the C++ kernels (attention, RMSNorm, RoPE) where they build.
        self.use_packed_weights = runner.fused_kernels and packed_linear.available(
            self.dtype, device
        )
        self.use_cpu_kernels = (
            runner.fused_kernels and device.type == "cpu" and cpu_kernels.extension() is not None
        )
        self.backend = select_backend(
            runner.attention_backend, device, cpu_kernels=self.use_cpu_kernels
        )
        self.batch = InputBatch(
            self.scheduler_config.max_num_seqs,
            self.model_config.max_model_len,
            self.cache_config.block_size,
        )
        self.sampler = Sampler()
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.weight_bytes = 0
        # Graphs of decode steps (worker/decode_graph.py). CUDA: they need
        # kernels that never sync with the host, the Triton backend's; the
        # torch backend decides its work from host tensors. CPU: every op of
        # the forward must be a C++ kernel: the torch backend on them (the
        # Triton backend's interpreter is Python), pagoda's packed linears (not
        # oneDNN's), and one process (a tensor-parallel all-reduce is not one).
        self.use_graphs = not runner.enforce_eager and (
            (device.type == "cuda" and self.backend.name == "triton")
            or (
                device.type == "cpu"
                and self.use_cpu_kernels
                and self.backend.name == "torch"
                and self.use_packed_weights
                and cpu_kernels.linear_ops(self.dtype) is not None
                and tp.world_size == 1
            )
        )
        self.graph_sizes = runner.cuda_graph_sizes or default_capture_sizes(
            self.scheduler_config.max_num_seqs, device.type
        )
        self.graph_runner: DecodeGraphRunner | None = None
        self.lora_manager: LoRAManager | None = None
        # lora_int_id -> the request that named it (where to reload it from).
        self.lora_requests: dict[int, LoRARequest] = {}
        self.spec: SpecDecoder | None = None
        if config.speculative_config is not None:
            self.spec = SpecDecoder(config, device, self.backend, self.use_triton_kernels)
        # Async scheduling: the step whose tokens have not reached the host.
        self.async_scheduling = self.scheduler_config.async_scheduling
        self._in_flight: InFlightStep | None = None
        # Where sampled tokens land on the host (pinned: the copy is queued,
        # not waited for). One buffer: a step's tokens are read before the
        # next step samples.
        self._sampled_host: torch.Tensor | None = None
        if self.async_scheduling and device.type == "cuda":
            self._sampled_host = torch.empty(
                self.scheduler_config.max_num_seqs, dtype=torch.int64, pin_memory=True
            )

    @property
    def num_kv_heads(self) -> int:
        """KV heads this rank stores (a replica of one when they are fewer than the ranks)."""
        return max(1, self.model_config.arch.num_key_value_heads // self.tp.world_size)

    # ---- set-up -------------------------------------------------------
    def load_model(self) -> None:
        torch.manual_seed(self.seed)
        self.model = load_model(self.model_config, self.seed, self.tp, self.device)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        for layer in self.model.attention_layers():
            layer.backend = self.backend
        set_triton_kernels(self.model, self.use_triton_kernels)
        set_cpu_kernels(self.model, self.use_cpu_kernels)
        if self.config.lora_config is not None:
            self.lora_manager = LoRAManager(
                self.model,
                self.config.lora_config,
                self.model_config.arch,
                use_triton=self.use_triton_kernels,
            )
        if self.use_packed_weights:
            # After the LoRA wrappers, which size their buffers from the
            # plain weights; the hint is the decode batch.
            packed_linear.pack_model(self.model, self.scheduler_config.max_num_seqs)
        if self.spec is not None:
            self.spec.proposer.load_model()

    def add_lora(self, lora_request: LoRARequest) -> None:
        # Adapter slots may be rewritten: nothing may still be computing with them.
        self.resolve_in_flight()
        if self.lora_manager is None:
            raise InvalidRequestError(
                "this engine serves no LoRA adapters (start it with --enable-lora)",
                param="lora_path",
            )
        self.lora_manager.add_adapter(lora_request)
        self.lora_requests[lora_request.lora_int_id] = lora_request

    def remove_lora(self, lora_int_id: int) -> bool:
        self.resolve_in_flight()
        self.lora_requests.pop(lora_int_id, None)
        return self.lora_manager is not None and self.lora_manager.remove_adapter(lora_int_id)

    def kv_bytes_per_block(self) -> int:
        a = self.model_config.arch
        per_token = 2 * a.num_hidden_layers * self.num_kv_heads * a.head_dim
        draft = self.spec.proposer.kv_bytes_per_block() if self.spec is not None else 0
        return per_token * self.cache_config.block_size * self.kv_cache_dtype.itemsize + draft

    @torch.inference_mode()
    def profile_run(self) -> None:
        """One forward at the full token budget (and the LM head for a full
        batch), so the worker can measure the activations' peak memory."""
        n = min(self.scheduler_config.max_num_batched_tokens, self.model_config.max_model_len)
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        positions = torch.arange(n, device=self.device)
        # A throwaway one-block-per-request cache is enough to run attention.
        saved = [layer.kv_cache for layer in self.model.attention_layers()]
        a = self.model_config.arch
        bs = self.cache_config.block_size
        blocks = -(-n // bs)
        scratch = torch.zeros(
            kv_cache_shape(blocks, bs, self.num_kv_heads, a.head_dim),
            dtype=self.kv_cache_dtype,
            device=self.device,
        )
        for layer in self.model.attention_layers():
            layer.kv_cache = scratch
        meta = self._metadata_for_single(n, blocks)
        try:
            hidden = self.model(ids, positions, meta)
            self.model.compute_logits(hidden[-self.scheduler_config.max_num_seqs :])
        finally:
            for layer, cache in zip(self.model.attention_layers(), saved):
                layer.kv_cache = cache

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

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate every layer's cache, bind it, and capture the decode graphs
        (they read the caches, so they come after)."""
        a = self.model_config.arch
        shape = kv_cache_shape(
            num_blocks, self.cache_config.block_size, self.num_kv_heads, a.head_dim
        )
        self.kv_caches = []
        for layer in self.model.attention_layers():
            cache = torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
            layer.kv_cache = cache
            self.kv_caches.append(cache)
        if self.spec is not None:
            # A draft model's cache: as many blocks, so one block table serves both.
            self.spec.proposer.initialize_kv_cache(num_blocks)
        if self.use_graphs:
            self.graph_runner = DecodeGraphRunner(
                self.model,
                self.backend,
                [s for s in self.graph_sizes if s <= self.scheduler_config.max_num_seqs],
                self.batch.block_table.shape[1],
                self.model_config.max_model_len,
                self.num_kv_heads,
                self.device,
            )
            self.graph_runner.capture()
            if not self.graph_runner.graphs:
                self.graph_runner = None
        if self.device.type == "cuda" and self.backend.name == "triton":
            self._warm_up_attention()

    def _warm_up_attention(self) -> None:
        """Compile the attention kernel's variants now rather than in a
        serving step (kernels/paged_attention.py: warm_up_paged_attention)."""
        from pagoda.kernels.paged_attention import warm_up_paged_attention

        a = self.model_config.arch
        start = time.perf_counter()
        launches = warm_up_paged_attention(
            self.kv_caches[0],
            max(1, a.num_attention_heads // self.tp.world_size),
            self.model_config.dtype,
            a.head_dim**-0.5,
        )
        torch.cuda.synchronize(self.device)
        logger.info(
            "Compiled the attention kernel's %d variants in %.1f s",
            launches,
            time.perf_counter() - start,
        )

    # ---- one step -----------------------------------------------------
    def _update_batch(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.batch.remove(req_id)
        if self.spec is not None and so.finished_req_ids:
            self.spec.forget(so.finished_req_ids)
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
                lora_int_id=new.lora_request.lora_int_id if new.lora_request else 0,
            )
            if new.lora_request is not None:
                self.lora_requests[new.lora_request.lora_int_id] = new.lora_request
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
        if so.scheduled_spec_decode_tokens:
            num_spec = self._write_drafts(so, req_ids, rows)
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
        known = b.num_tokens[rows]
        in_flight = self._in_flight
        if in_flight is not None:
            # Async scheduling: a request the step in flight samples for is
            # scheduled one token past what this batch knows; that token's
            # input id is taken from the device below.
            src = np.fromiter(
                (in_flight.position.get(r, -1) for r in req_ids), dtype=np.int64, count=len(rows)
            )
            known = known + (src >= 0)
        # Requests that reach the end of their known tokens sample one.
        spec = so.scheduled_spec_decode_tokens
        if not spec:
            samples = seq_lens == known
            logits_indices = cu[1:][samples] - 1
        else:
            # ... or, with drafts, one per draft and one after them.
            samples, logits_indices = self._spec_logits_indices(num_spec, rows, seq_lens, cu)

        dev = self.device
        qsl = cu.astype(np.int32)
        lens = seq_lens.astype(np.int32)
        meta = AttentionMetadata(
            num_actual_tokens=total,
            num_reqs=len(rows),
            max_query_len=int(num_sched.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=host_to_device(qsl, dev),
            seq_lens=host_to_device(lens, dev),
            block_table=host_to_device(block_table, dev),
            slot_mapping=host_to_device(slots, dev),
            query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens_cpu=torch.from_numpy(lens),
        )
        ids = host_to_device(input_ids, dev, torch.int64)
        pos = host_to_device(positions, dev)
        if in_flight is not None:
            unseen = np.flatnonzero(positions >= b.num_tokens[token_rows])
            if unseen.size:
                take = src[req_of_token[unseen]]
                assert (take >= 0).all(), "a scheduled token past the known ones, not in flight"
                where = host_to_device(np.stack([unseen, take]), dev)
                ids.index_copy_(0, where[0], in_flight.sampled.index_select(0, where[1]))
        if self.lora_manager is not None:
            self._set_lora_mapping(rows, num_sched)
        sample_rows = rows[samples]
        sample_req_ids = [r for r, s in zip(req_ids, samples.tolist()) if s]
        if self.spec is not None:
            # What the proposer needs of this step once tokens are sampled.
            self._spec_step = SpecStep(b, req_ids, rows, computed, num_sched, samples, None)
        return ids, pos, meta, host_to_device(logits_indices, dev), sample_rows, sample_req_ids

    def _write_drafts(self, so: SchedulerOutput, req_ids: list[str], rows: np.ndarray):
        """Put each request's drafts after its known tokens, where they are
        the step's last input ids (never counted in num_tokens: only
        verified tokens are). Returns the drafts per step row."""
        b = self.batch
        spec = so.scheduled_spec_decode_tokens
        num_spec = np.zeros(len(rows), dtype=np.int64)
        for i, req_id in enumerate(req_ids):
            drafts = spec.get(req_id)
            if drafts:
                row, n = rows[i], b.num_tokens[rows[i]]
                b.token_ids[row, n : n + len(drafts)] = drafts
                num_spec[i] = len(drafts)
        return num_spec

    def _spec_logits_indices(self, num_spec, rows, seq_lens, cu):
        """The rows to take logits from: every draft position and the one
        after it, for requests that sample."""
        b = self.batch
        samples = seq_lens == b.num_tokens[rows] + num_spec
        n_logits = (1 + num_spec)[samples]
        first = cu[1:][samples] - n_logits
        offsets = np.arange(int(n_logits.sum())) - np.repeat(
            np.cumsum(n_logits) - n_logits, n_logits
        )
        return samples, np.repeat(first, n_logits) + offsets

    def _set_lora_mapping(self, rows: np.ndarray, num_scheduled: np.ndarray) -> None:
        """Give each adapter of the step a slot and every token its slot (-1:
        base model); no mapping at all when no request of the step has one."""
        lora_ids = self.batch.lora_ids[rows]
        if not lora_ids.any():
            self.lora_manager.set_token_slots(None)
            return
        unique, inverse = np.unique(lora_ids, return_inverse=True)
        slot_of = self.lora_manager.prepare([self.lora_requests[int(i)] for i in unique if i != 0])
        unique_slots = np.array([slot_of.get(int(i), -1) for i in unique], dtype=np.int64)
        token_slots = np.repeat(unique_slots[inverse], num_scheduled)
        self.lora_manager.set_token_slots(host_to_device(token_slots, self.device))

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

    def record_sampled_tokens(self, sampled_token_ids: dict[str, list[int]]) -> None:
        """Append one token per request, looked up by id: tokens another rank
        sampled (rank 0 samples for the group; the other ranks learn them with
        the next step, before its changes, which is where rank 0 appended
        them), and a step's tokens that arrive late (async scheduling).
        Requests no longer in the batch are skipped."""
        rows, tokens = [], []
        index = self.batch.index
        for req_id, token_ids in sampled_token_ids.items():
            row = index.get(req_id)
            if row is not None:
                assert len(token_ids) == 1, "one token per request and step"
                rows.append(row)
                tokens.append(token_ids[0])
        if rows:
            self.batch.append_sampled(np.asarray(rows, dtype=np.int64), tokens)

    def resolve_in_flight(self) -> None:
        """Wait for the step in flight's tokens, record them in the batch and
        build its output (no-op when none is in flight). Tokens of requests
        that left the batch since (finished, aborted, preempted) are dropped
        here; the scheduler drops them too."""
        step, self._in_flight = self._in_flight, None
        if step is None:
            return
        if step.copied is not None:
            step.copied.synchronize()
        tokens = step.host.tolist()
        sampled = {r: [t] for r, t in zip(step.req_ids, tokens)}
        self.record_sampled_tokens(sampled)
        step.output = ModelRunnerOutput(
            sampled_token_ids=sampled,
            logprobs=self._logprob_lists(step.req_ids, step.logprobs, step.num_logprobs),
        )

    @staticmethod
    def _logprob_lists(
        req_ids: list[str], tensors: LogprobsTensors | None, wanted: list[int | None] | None
    ) -> dict:
        if tensors is None:
            return {}
        return {
            req_id: [lp]
            for req_id, lp in zip(req_ids, logprobs_to_lists(tensors, wanted))
            if lp is not None
        }

    def _launch_async_output(
        self, sampled: torch.Tensor, logprobs, wanted, sample_req_ids: list[str]
    ) -> InFlightStep:
        host, copied = sampled, None
        if self._sampled_host is not None:
            host = self._sampled_host[: sampled.shape[0]]
            host.copy_(sampled, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        self._in_flight = InFlightStep(
            self, sample_req_ids, sampled, host, copied, logprobs, wanted
        )
        return self._in_flight

    @torch.inference_mode()
    def execute_model(
        self, so: SchedulerOutput
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        """Run one step; the sampled tokens, or None on a rank that does not
        sample (every rank takes part in the forward and the logits gather).
        With async scheduling the tokens come as an `InFlightStep`: the step is
        launched, not waited for."""
        self._update_batch(so)
        if so.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput(sampled_token_ids={})
        ids, pos, meta, logits_idx, sample_rows, sample_req_ids = self._prepare_inputs(so)
        # Graphs are captured without adapters: a step with one runs eagerly.
        no_lora = self.lora_manager is None or self.lora_manager.batch.token_slots is None
        if self.graph_runner is not None and no_lora and self.graph_runner.can_run(meta):
            hidden = self.graph_runner.run(ids, pos, meta)
        else:
            hidden = self.model(ids, pos, meta)
        if not sample_req_ids:
            return ModelRunnerOutput(sampled_token_ids={})
        logits = self.model.compute_logits(hidden[logits_idx])
        if logits is None:
            return None
        logits = logits.float()
        if self.spec is not None:
            return self._verify_and_propose(so, logits, sample_rows, sample_req_ids)
        # Sampling reads each request's output so far (penalties, min_tokens,
        # seeds): the step in flight's tokens land first, while the forward
        # just launched runs.
        self.resolve_in_flight()
        sampling = self._sampling_metadata(sample_rows)
        out = self.sampler(logits, sampling)
        wanted = None
        if out.logprobs is not None:
            wanted = [self.batch.states[r].sampling_params.logprobs for r in sample_rows.tolist()]
        if self.async_scheduling:
            return self._launch_async_output(
                out.sampled_token_ids, out.logprobs, wanted, sample_req_ids
            )
        tokens = out.sampled_token_ids.tolist()
        self.batch.append_sampled(sample_rows, tokens)
        return ModelRunnerOutput(
            sampled_token_ids={r: [t] for r, t in zip(sample_req_ids, tokens)},
            logprobs=self._logprob_lists(sample_req_ids, out.logprobs, wanted),
        )

    def _verify_and_propose(
        self,
        so: SchedulerOutput,
        logits: torch.Tensor,
        sample_rows: np.ndarray,
        sample_req_ids: list[str],
    ) -> ModelRunnerOutput:
        """Speculative decoding: every sampling request goes through the
        verifier (with no drafts it samples one token, from the same seeded
        draws whatever its neighbours drafted), then drafts its next step."""
        spec = so.scheduled_spec_decode_tokens
        drafts = [spec.get(r, []) for r in sample_req_ids]
        tokens, logprobs = self.spec.verify(logits, self.batch, sample_rows, sample_req_ids, drafts)
        self.batch.append_token_lists(sample_rows, tokens)
        step, self._spec_step = self._spec_step, None
        return ModelRunnerOutput(
            sampled_token_ids=dict(zip(sample_req_ids, tokens)),
            logprobs=logprobs,
            spec_token_ids=self.spec.propose(step),
        )
