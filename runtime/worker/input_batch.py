"""The model runner's persistent batch.

Requests stay in fixed rows of preallocated numpy arrays from the step they
arrive until they finish (or are preempted), so a step only writes what
changed: new rows, appended block ids and the tokens just sampled. A removed
row is filled by moving the last row into it, keeping rows dense.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from pagoda.runtime.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    generator: torch.Generator | None
    eos_token_ids: tuple[int, ...] = ()
    block_ids: list[int] = field(default_factory=list)
    lora_int_id: int = 0  # 0: the base model


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int):
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        max_blocks = -(-max_model_len // block_size)
        # One spare column: the token sampled at max_model_len is written
        # before the scheduler finishes the request for length.
        self.token_ids = np.zeros((max_num_reqs, max_model_len + 1), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.block_table = np.zeros((max_num_reqs, max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        self.lora_ids = np.zeros(max_num_reqs, dtype=np.int64)
        self.states: list[CachedRequestState] = []
        self.index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.states)

    def add(self, state: CachedRequestState, num_computed_tokens: int) -> None:
        row = len(self.states)
        assert row < self.max_num_reqs, "more requests than max_num_seqs"
        tokens = state.prompt_token_ids + state.output_token_ids
        self.token_ids[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_computed_tokens[row] = num_computed_tokens
        self.num_blocks[row] = 0
        self.lora_ids[row] = state.lora_int_id
        self.states.append(state)
        self.index[state.req_id] = row
        self.append_blocks(row, state.block_ids)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        if not block_ids:
            return
        start = self.num_blocks[row]
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def remove(self, req_id: str) -> None:
        row = self.index.pop(req_id, None)
        if row is None:
            return
        last = len(self.states) - 1
        if row != last:
            moved = self.states[last]
            self.states[row] = moved
            self.index[moved.req_id] = row
            n, nb = self.num_tokens[last], self.num_blocks[last]
            self.token_ids[row, :n] = self.token_ids[last, :n]
            self.block_table[row, :nb] = self.block_table[last, :nb]
            self.num_tokens[row] = n
            self.num_blocks[row] = nb
            self.num_computed_tokens[row] = self.num_computed_tokens[last]
            self.lora_ids[row] = self.lora_ids[last]
        self.states.pop()

    def append_token_lists(self, rows: np.ndarray, token_lists: list[list[int]]) -> None:
        """Record a run of tokens for each of `rows` (speculative decoding:
        the accepted drafts and the target's token)."""
        for row, toks in zip(rows.tolist(), token_lists):
            n = int(self.num_tokens[row])
            self.token_ids[row, n : n + len(toks)] = toks
            self.num_tokens[row] = n + len(toks)
            self.states[row].output_token_ids.extend(toks)

    def append_sampled(self, rows: np.ndarray, token_ids: list[int]) -> None:
        """Record one sampled token for each of `rows`."""
        self.token_ids[rows, self.num_tokens[rows]] = token_ids
        self.num_tokens[rows] += 1
        for row, tok in zip(rows.tolist(), token_ids):
            self.states[row].output_token_ids.append(tok)
