"""The `pagoda bench serve` workloads: seeded, exact lengths, ranges honoured."""

from __future__ import annotations

from pagoda.runtime.entrypoints.bench_serve import random_dataset, shared_prefix_dataset

VOCAB = (100, 32000)


def test_random_dataset_fixed_length_is_exact():
    reqs = random_dataset(8, 17, 5, 0, VOCAB)
    assert [len(r.prompt_token_ids) for r in reqs] == [17] * 8
    assert all(r.output_len == 5 for r in reqs)


def test_random_dataset_lengths_stay_in_range_and_vary():
    reqs = random_dataset(64, 32, 4, 0, VOCAB, input_len_max=512)
    lengths = [len(r.prompt_token_ids) for r in reqs]
    assert min(lengths) >= 32 and max(lengths) <= 512
    assert len(set(lengths)) > 10


def test_random_dataset_is_seeded():
    a = random_dataset(4, 8, 4, 3, VOCAB, input_len_max=64)
    b = random_dataset(4, 8, 4, 3, VOCAB, input_len_max=64)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    assert all(VOCAB[0] <= t < VOCAB[1] for r in a for t in r.prompt_token_ids)


def test_shared_prefix_dataset_shares_the_prefix_and_varies_the_suffix():
    reqs = shared_prefix_dataset(8, 384, 32, 16, 2, 1, VOCAB, suffix_len_max=128)
    prefixes = {tuple(r.prompt_token_ids[:384]) for r in reqs}
    assert len(prefixes) == 2
    assert reqs[0].prompt_token_ids[:384] == reqs[2].prompt_token_ids[:384]
    assert all(32 <= len(r.prompt_token_ids) - 384 <= 128 for r in reqs)
