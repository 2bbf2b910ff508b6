"""A smaller model of the same tokenizer drafts k tokens autoregressively.

It lives in the target's worker, on its device, with its own KV cache of the
same number of blocks and the same block tables: a block id means the same
positions of the same request in both caches, so the scheduler allocates for
both at once (plus `num_speculative_tokens` lookahead slots, where the draft
writes the KV of its own proposals before the target has seen them).

Each request keeps `synced`: how many of its leading positions have the
draft's KV. A proposal first feeds the draft every verified token from there
(the step's accepted drafts and the target's token; a whole prompt on the
first step; everything missed while drafting was paused), which yields the
first draft, then feeds each draft to get the next: k forwards a step. A
step in which no request drafts runs no draft forward at all. Prefix-cache
hits are trusted to hold the draft's KV too (it is computed for every block
a request drafts over); where one does not, only acceptance suffers, never
correctness: the target verifies every token.
"""

from __future__ import annotations

import numpy as np
import torch
from pagoda.runtime.attention.backend import AttentionMetadata, kv_cache_shape
from pagoda.runtime.config import CacheConfig
from pagoda.runtime.layers.custom_op import set_triton_kernels
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.model_loader.loader import load_model
from pagoda.runtime.spec_decode.config import SpeculativeConfig
from pagoda.runtime.spec_decode.proposer import Proposals, Proposer, SpecStep
from pagoda.runtime.worker.input_batch import InputBatch

_DRAFT_SEED_SALT = 0x5DEECE66D  # a draft's draws differ from the verifier's


class DraftModelProposer(Proposer):
    def __init__(
        self,
        config: SpeculativeConfig,
        cache_config: CacheConfig,
        device: torch.device,
        backend,
        use_triton_kernels: bool,
        seed: int,
    ):
        self.k = config.num_speculative_tokens
        self.model_config: ModelConfig = config.draft_model_config
        self.block_size = cache_config.block_size
        self.kv_cache_dtype = cache_config.kv_cache_dtype(self.model_config.dtype)
        self.device = device
        self.backend = backend
        self.use_triton_kernels = use_triton_kernels
        self.seed = seed
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        # req_id -> leading positions whose draft KV is written.
        self.synced: dict[str, int] = {}

    # ---- set-up -------------------------------------------------------
    def load_model(self) -> None:
        self.model = load_model(self.model_config, self.seed, None, self.device)
        for layer in self.model.attention_layers():
            layer.backend = self.backend
        set_triton_kernels(self.model, self.use_triton_kernels)

    def kv_bytes_per_block(self) -> int:
        a = self.model_config.arch
        per_token = 2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim
        return per_token * self.block_size * self.kv_cache_dtype.itemsize

    def initialize_kv_cache(self, num_blocks: int) -> None:
        a = self.model_config.arch
        shape = kv_cache_shape(num_blocks, self.block_size, a.num_key_value_heads, a.head_dim)
        self.kv_caches = []
        for layer in self.model.attention_layers():
            cache = torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
            layer.kv_cache = cache
            self.kv_caches.append(cache)

    def forget(self, req_ids) -> None:
        for req_id in req_ids:
            self.synced.pop(req_id, None)

    # ---- one step -----------------------------------------------------
    @torch.inference_mode()
    def propose(self, step: SpecStep) -> Proposals:
        b = step.batch
        bs = self.block_size
        # Positions a request may write: its blocks (lookahead included).
        capacity = b.num_blocks[step.rows].astype(np.int64) * bs
        synced = np.fromiter(
            (self.synced.setdefault(r, c) for r, c in zip(step.req_ids, step.computed.tolist())),
            dtype=np.int64,
            count=len(step.req_ids),
        )
        want = step.sampled & (step.max_drafts > 0)
        # The first draft comes from the last verified token, at position
        # num_tokens - 1: it needs a slot (the first lookahead one when all
        # drafts were accepted; the scheduler may have had none to give).
        num_tokens = b.num_tokens[step.rows].astype(np.int64)
        want &= num_tokens <= capacity
        if not want.any():
            return Proposals({}, {})
        # Feed from the first position without draft KV (never past the
        # step's start, which the target just rewrote) to the last verified.
        start = np.minimum(synced, step.computed.astype(np.int64))[want]
        rows = step.rows[want]
        end = num_tokens[want]
        req_ids = [r for r, w in zip(step.req_ids, want.tolist()) if w]
        for req_id, e in zip(req_ids, end.tolist()):
            self.synced[req_id] = e
        states = [b.states[r] for r in rows.tolist()]
        temperature, generators = self._sampling(states, b)

        logits = self._forward(b, rows, start, end - start)
        max_drafts = np.minimum(step.max_drafts[want], capacity[want] - end + 1)
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        active = np.arange(len(rows))
        pos = end.copy()  # where the next draft token goes
        for j in range(int(max_drafts.max())):
            tokens, q = self._sample(logits, temperature[active], [generators[i] for i in active])
            for n, i in enumerate(active.tolist()):
                drafts[i].append(tokens[n])
                if q is not None and temperature[i] > 0:
                    probs[i].append(q[n])
            active = active[max_drafts[active] > j + 1]
            if len(active) == 0:
                break
            ids = np.array([drafts[i][-1] for i in active.tolist()], dtype=np.int64)
            logits = self._forward(
                b, rows[active], pos[active], np.ones(len(active), dtype=np.int64), ids
            )
            pos[active] += 1
        return Proposals(
            dict(zip(req_ids, drafts)),
            {r: torch.stack(p) for r, p in zip(req_ids, probs) if p},
        )

    def _sampling(self, states, batch: InputBatch):
        """Per row: temperature (0 = greedy) and a generator for seeded rows,
        reseeded from (seed, tokens so far) like the target's sampler."""
        temperature = np.array(
            [0.0 if st.sampling_params.greedy else st.sampling_params.temperature for st in states]
        )
        generators: list[torch.Generator | None] = []
        for st in states:
            seed = st.sampling_params.seed
            if seed is None:
                generators.append(None)
                continue
            gen = torch.Generator(device=self.device)
            gen.manual_seed((seed * _DRAFT_SEED_SALT + len(st.output_token_ids)) % 2**63)
            generators.append(gen)
        return temperature, generators

    def _sample(self, logits: torch.Tensor, temperature: np.ndarray, generators):
        """One draft per row: argmax for greedy rows, else a draw from
        softmax(logits / T), whose probabilities the verifier needs."""
        greedy = logits.argmax(dim=-1)
        if not (temperature > 0).any():
            return greedy.tolist(), None
        t = torch.from_numpy(np.where(temperature > 0, temperature, 1.0)).to(logits)
        q = (logits / t.unsqueeze(1)).softmax(dim=-1)
        u = torch.empty_like(q)
        u.uniform_()
        for i, gen in enumerate(generators):
            if gen is not None:
                u[i].uniform_(generator=gen)
        e = u.log_().neg_().clamp_(min=torch.finfo(u.dtype).tiny)
        drawn = q.div(e).argmax(dim=-1)
        random_rows = torch.from_numpy(temperature > 0).to(logits.device)
        return torch.where(random_rows, drawn, greedy).tolist(), q

    def _forward(
        self,
        b: InputBatch,
        rows: np.ndarray,
        start: np.ndarray,
        lens: np.ndarray,
        ids: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Run the draft over positions [start, start+lens) of each row (ids
        from the batch, or `ids` for one-token steps); logits of each row's
        last position, float32."""
        bs = self.block_size
        total = int(lens.sum())
        cu = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=cu[1:])
        req_of_token = np.repeat(np.arange(len(rows)), lens)
        positions = start[req_of_token] + (np.arange(total) - cu[:-1][req_of_token])
        token_rows = rows[req_of_token]
        if ids is None:
            ids = b.token_ids[token_rows, positions].astype(np.int64)
        slots = b.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = start + lens
        max_blocks = int(-(-seq_lens.max() // bs))
        qsl = torch.from_numpy(cu.astype(np.int32))
        seq = torch.from_numpy(seq_lens.astype(np.int32))
        dev = self.device
        meta = AttentionMetadata(
            num_actual_tokens=total,
            num_reqs=len(rows),
            max_query_len=int(lens.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=qsl.to(dev),
            seq_lens=seq.to(dev),
            block_table=torch.from_numpy(b.block_table[rows, :max_blocks]).to(dev),
            slot_mapping=torch.from_numpy(slots).to(dev),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq,
        )
        hidden = self.model(
            torch.from_numpy(ids).to(dev), torch.from_numpy(positions).to(dev), meta
        )
        return self.model.compute_logits(hidden[torch.from_numpy(cu[1:] - 1).to(dev)]).float()
