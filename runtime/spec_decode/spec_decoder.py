"""The model runner's side of speculative decoding: verify the drafts a step
scheduled, then propose the next ones.

Verification needs the target's distribution at every draft position after
every sampling transform, and those transforms depend on the output so far
(penalties, min_tokens): position j of a request is processed as if drafts
1..j-1 were already its output. So the batch's sampling metadata is built
over (request, position) rows, and the result equals what the plain sampler
would have computed one step at a time.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.outputs import TokenLogprobs
from pagoda.runtime.sample import ops
from pagoda.runtime.sample.metadata import SamplingMetadata
from pagoda.runtime.sample.sampler import logprobs_to_lists
from pagoda.runtime.spec_decode.acceptance import AcceptanceTracker
from pagoda.runtime.spec_decode.proposer import NgramProposer, Proposals, Proposer, SpecStep
from pagoda.runtime.spec_decode.rejection_sampler import (
    draw_uniform_and_exponential,
    greedy_verify,
    rejection_sample,
)
from pagoda.runtime.worker.input_batch import InputBatch

logger = logging.getLogger(__name__)

_VERIFY_SEED_SALT = 0x2545F4914F6CDD1D  # the verifier's draws differ from the sampler's


class SpecDecoder:
    def __init__(self, config: EngineConfig, device: torch.device, backend, use_triton: bool):
        spec = config.speculative_config
        self.config = spec
        self.k = spec.num_speculative_tokens
        self.device = device
        self.vocab_size = config.model_config.vocab_size
        self.max_model_len = config.model_config.max_model_len
        self.tracker = AcceptanceTracker(spec.min_acceptance_rate, self.k)
        self.proposer: Proposer
        if spec.method == "ngram":
            self.proposer = NgramProposer(spec)
        else:
            from pagoda.runtime.spec_decode.draft_model_proposer import DraftModelProposer

            self.proposer = DraftModelProposer(
                spec, config.cache_config, device, backend, use_triton, config.runner_config.seed
            )
        # req_id -> q of its pending drafts (draft-model proposals of
        # sampling requests only).
        self.draft_probs: dict[str, torch.Tensor] = {}

    def forget(self, req_ids) -> None:
        self.proposer.forget(req_ids)
        self.tracker.forget(req_ids)
        for req_id in req_ids:
            self.draft_probs.pop(req_id, None)

    # ---- verification ---------------------------------------------------
    def verify(
        self,
        logits: torch.Tensor,
        batch: InputBatch,
        rows: np.ndarray,
        req_ids: list[str],
        drafts: list[list[int]],
    ) -> tuple[list[list[int]], dict[str, list[TokenLogprobs]]]:
        """Emit each sampling request's accepted drafts and one token of the
        target's. `logits` holds len(drafts[i]) + 1 rows per request, in order."""
        states = [batch.states[r] for r in rows.tolist()]
        num_draft = np.array([len(d) for d in drafts], dtype=np.int64)
        n_pos = num_draft + 1
        meta = _expanded_metadata(states, drafts, self.vocab_size, self.device)
        raw_logprobs = logits.log_softmax(dim=-1) if meta.max_num_logprobs is not None else None
        logits = ops.apply_logit_bias(logits, meta.logit_bias)
        logits = ops.apply_min_tokens(logits, meta.min_tokens_stop_ids)
        if not meta.no_penalties:
            logits = ops.apply_penalties(
                logits,
                meta.prompt_token_ids,
                ops.pad_token_lists(meta.output_token_ids, logits.shape[1], logits.device),
                meta.presence_penalties,
                meta.frequency_penalties,
                meta.repetition_penalties,
            )
        # Padded [R, K+1] index of each (request, position) row; positions
        # past a request's own drafts repeat its last row and are ignored.
        k = int(num_draft.max())
        starts = np.concatenate([[0], np.cumsum(n_pos)[:-1]])
        index = starts[:, None] + np.minimum(np.arange(k + 1)[None, :], num_draft[:, None])
        index_t = torch.from_numpy(index).to(self.device)
        padded = np.zeros((len(drafts), k), dtype=np.int64)
        for i, d in enumerate(drafts):
            padded[i, : len(d)] = d
        draft_t = torch.from_numpy(padded).to(self.device)
        num_draft_t = torch.from_numpy(num_draft).to(self.device)

        greedy_rows = np.array([st.sampling_params.greedy for st in states])
        out = torch.empty(len(states), k + 1, dtype=torch.long, device=self.device)
        if greedy_rows.any():
            g = torch.from_numpy(np.flatnonzero(greedy_rows)).to(self.device)
            argmax = logits.argmax(dim=-1)[index_t[g]]
            out[g] = greedy_verify(draft_t[g], num_draft_t[g], argmax)
        if not greedy_rows.all():
            sel = np.flatnonzero(~greedy_rows)
            out[torch.from_numpy(sel).to(self.device)] = self._sample_rows(
                logits, meta, states, req_ids, sel, index, draft_t, num_draft_t
            )

        out_lists = out.tolist()
        tokens = [row[: row.index(-1)] if -1 in row else row for row in out_lists]
        for req_id, n, t in zip(req_ids, num_draft.tolist(), tokens):
            self.tracker.observe(req_id, n, len(t) - 1)
            self.draft_probs.pop(req_id, None)
        logprobs = {}
        if raw_logprobs is not None:
            logprobs = self._logprobs(raw_logprobs, states, req_ids, starts, tokens)
        return tokens, logprobs

    def _sample_rows(self, logits, meta, states, req_ids, sel, index, draft_t, num_draft_t):
        """Rejection-sample the requests at `sel` (all sampling, not greedy)."""
        dev = self.device
        flat = index[sel].reshape(-1)
        flat_t = torch.from_numpy(flat).to(dev)
        sub = logits[flat_t]
        temperature = meta.temperature[flat_t]
        sub = sub / temperature.unsqueeze(1)
        top_k = meta.top_k[flat_t] if meta.top_k is not None else None
        top_p = meta.top_p[flat_t] if meta.top_p is not None else None
        sub = ops.apply_top_k_top_p(sub, top_k, top_p)
        if meta.min_p is not None:
            sub = ops.apply_min_p(sub, meta.min_p[flat_t])
        k1 = index.shape[1]
        target_probs = sub.softmax(dim=-1).reshape(len(sel), k1, -1)
        sel_t = torch.from_numpy(sel).to(dev)
        draft = draft_t[sel_t]
        k = k1 - 1
        draft_probs = None
        if self.config.method == "draft_model":
            draft_probs = torch.zeros(len(sel), k, self.vocab_size, device=dev)
            for n, i in enumerate(sel.tolist()):
                q = self.draft_probs.get(req_ids[i])
                if q is None:
                    # No draft this step (its first, a paused or trimmed
                    # one): only the bonus position is sampled, from p.
                    assert int(num_draft_t[i]) == 0, "a sampled draft needs its distribution"
                    continue
                m = min(k, q.shape[0])
                draft_probs[n, :m] = q[:m]
        generators = {}
        for n, i in enumerate(sel.tolist()):
            st = states[i]
            if st.generator is not None:
                step = len(st.output_token_ids)
                st.generator.manual_seed(
                    (st.sampling_params.seed * _VERIFY_SEED_SALT + step) % 2**63
                )
                generators[n] = st.generator
        # Always k uniforms per request, whatever the batch's longest draft:
        # a seeded request's draws must not depend on its neighbours.
        uniform, exponential = draw_uniform_and_exponential(
            len(sel), self.k, self.vocab_size, generators, dev
        )
        return rejection_sample(
            draft, num_draft_t[sel_t], target_probs, draft_probs, uniform[:, :k], exponential
        )

    def _logprobs(self, raw, states, req_ids, starts, tokens) -> dict[str, list[TokenLogprobs]]:
        """Log-probs of every emitted token, each from the raw logits at its
        own position (as the plain sampler would have reported it)."""
        pos_rows, pos_tokens, owner = [], [], []
        for i, toks in enumerate(tokens):
            if states[i].sampling_params.logprobs is None:
                continue
            for j, t in enumerate(toks):
                pos_rows.append(int(starts[i]) + j)
                pos_tokens.append(t)
                owner.append(i)
        if not pos_rows:
            return {}
        wanted = [states[i].sampling_params.logprobs for i in owner]
        rows_t = torch.tensor(pos_rows, device=self.device)
        from pagoda.runtime.sample.sampler import LogprobsTensors

        tensors = LogprobsTensors(
            *ops.top_logprobs(
                raw[rows_t], torch.tensor(pos_tokens, device=self.device), max(wanted)
            )
        )
        out: dict[str, list[TokenLogprobs]] = {}
        for i, lp in zip(owner, logprobs_to_lists(tensors, wanted)):
            out.setdefault(req_ids[i], []).append(lp)
        return out

    # ---- proposal -------------------------------------------------------
    def propose(self, step: SpecStep) -> dict[str, list[int]]:
        """Drafts for the next step, per request that sampled and may draft."""
        b = step.batch
        max_drafts = np.zeros(len(step.rows), dtype=np.int64)
        for i in np.flatnonzero(step.sampled).tolist():
            row = int(step.rows[i])
            st = b.states[row]
            if not self.tracker.allow(st.req_id):
                continue
            room = min(self.k, self.max_model_len - int(b.num_tokens[row]))
            mt = st.sampling_params.max_tokens
            if mt is not None:
                # Drafts past max_tokens could never be emitted.
                room = min(room, mt - len(st.output_token_ids) - 1)
            max_drafts[i] = max(0, room)
        step.max_drafts = max_drafts
        proposals: Proposals = self.proposer.propose(step)
        self.draft_probs.update(proposals.probs)
        return proposals.token_ids


def _expanded_metadata(states, drafts, vocab_size, device) -> SamplingMetadata:
    """Sampling metadata with one row per (request, position): position j
    sees drafts 1..j as already generated (penalties, min_tokens)."""
    params, prompts, outputs, eos = [], [], [], []
    for st, d in zip(states, drafts):
        for j in range(len(d) + 1):
            params.append(st.sampling_params)
            prompts.append(st.prompt_token_ids)
            outputs.append(st.output_token_ids + d[:j] if j else st.output_token_ids)
            eos.append(st.eos_token_ids)
    return SamplingMetadata.from_requests(
        params=params,
        prompt_token_ids=prompts,
        output_token_ids=outputs,
        generators={},
        eos_token_ids=eos,
        vocab_size=vocab_size,
        device=device,
    )
