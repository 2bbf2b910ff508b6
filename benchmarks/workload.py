"""Seeded synthetic workloads shared by the benchmarks."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def random_workload(
    num_requests: int,
    prompt_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
    reserved_ids: int = 256,
) -> list[BenchRequest]:
    """Prompts of random ordinary token ids (special tokens sit at the low ids
    in most vocabularies, so they are skipped) and uniform lengths."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(num_requests):
        n = rng.randint(*prompt_len)
        ids = [rng.randrange(reserved_ids, vocab_size) for _ in range(n)]
        reqs.append(BenchRequest(ids, rng.randint(*output_len)))
    return reqs
