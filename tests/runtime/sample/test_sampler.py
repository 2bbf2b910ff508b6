"""The batch sampler: greedy, seeds, filters, penalties, min_tokens, logprobs."""

import pytest
import torch
from pagoda.runtime.sample.metadata import SamplingMetadata, make_generator
from pagoda.runtime.sample.sampler import Sampler, logprobs_to_lists
from pagoda.runtime.sampling_params import SamplingParams

VOCAB = 64


def metadata(
    params: list[SamplingParams],
    outputs: list[list[int]] | None = None,
    prompts: list[list[int]] | None = None,
    eos: int | tuple[int, ...] | None = None,
    vocab: int = VOCAB,
) -> SamplingMetadata:
    n = len(params)
    generators = {row: make_generator(p.seed) for row, p in enumerate(params) if p.seed is not None}
    return SamplingMetadata.from_requests(
        params,
        prompts if prompts is not None else [[1, 2, 3]] * n,
        outputs if outputs is not None else [[] for _ in range(n)],
        generators,
        [(eos,) if isinstance(eos, int) else (eos or ())] * n,
        vocab,
        "cpu",
    )


def repeat(params: SamplingParams, n: int) -> list[SamplingParams]:
    return [params] * n


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(0))


def test_greedy_is_argmax(logits):
    out = Sampler()(logits, metadata(repeat(SamplingParams(temperature=0), 8)))
    assert out.sampled_token_ids.tolist() == logits.argmax(-1).tolist()
    assert out.sampled_token_ids.dtype == torch.int64
    assert out.logprobs is None


def test_greedy_rows_are_argmax_in_a_mixed_batch(logits):
    params = [SamplingParams(temperature=0 if r % 2 else 1.5) for r in range(8)]
    out = Sampler()(logits, metadata(params)).sampled_token_ids
    assert out[1::2].tolist() == logits[1::2].argmax(-1).tolist()


def test_low_precision_logits_are_accepted(logits):
    out = Sampler()(logits.bfloat16(), metadata(repeat(SamplingParams(temperature=0), 8)))
    assert out.sampled_token_ids.tolist() == logits.bfloat16().float().argmax(-1).tolist()


def test_seeded_runs_reproduce(logits):
    params = [SamplingParams(seed=123 + r, temperature=1.0) for r in range(8)]

    def run() -> list[list[int]]:
        md = metadata(params)  # fresh generators, as a rerun of the requests has
        return [Sampler()(logits, md).sampled_token_ids.tolist() for _ in range(5)]

    first = run()
    assert first == run()
    assert len({tuple(step) for step in first}) > 1  # the generators do advance


def test_seeded_row_is_independent_of_the_rest_of_the_batch():
    gen = torch.Generator().manual_seed(1)
    target_logits = torch.randn(VOCAB, generator=gen)
    seeded = SamplingParams(seed=42, temperature=0.9, top_p=0.95)

    def tokens(batch_size: int, position: int, other_seed: int) -> list[int]:
        others = torch.Generator().manual_seed(other_seed)
        params = [
            SamplingParams(temperature=1.0, seed=None if r % 2 else 1000 + r, top_k=5)
            for r in range(batch_size)
        ]
        params[position] = seeded
        md = metadata(params)
        out = []
        for _ in range(6):
            logits = torch.randn(batch_size, VOCAB, generator=others)
            logits[position] = target_logits
            out.append(Sampler()(logits, md).sampled_token_ids[position].item())
        return out

    alone = tokens(1, 0, 0)
    assert tokens(4, 2, 1) == alone
    assert tokens(9, 8, 2) == alone
    assert tokens(3, 0, 3) == alone


def draw_many(logits_row: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    """n independent draws from one distribution, as one batch of n rows."""
    torch.manual_seed(0)
    return Sampler()(logits_row.expand(n, -1), metadata(repeat(params, n))).sampled_token_ids


def test_top_k_never_emits_an_excluded_token(logits):
    row = logits[0]
    allowed = set(row.topk(5).indices.tolist())
    drawn = draw_many(row, SamplingParams(temperature=2.0, top_k=5), 5000)
    assert set(drawn.tolist()) == allowed


def test_top_p_never_emits_an_excluded_token():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    drawn = draw_many(probs.log(), SamplingParams(top_p=0.7), 5000)
    assert set(drawn.tolist()) == {0, 1, 2}  # 0.4 + 0.25 < 0.7, so the third stays


def test_min_p_never_emits_an_excluded_token():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    drawn = draw_many(probs.log(), SamplingParams(min_p=0.3), 5000)  # keep p >= 0.12
    assert set(drawn.tolist()) == {0, 1, 2}


def test_filters_combined_never_emit_an_excluded_token(logits):
    row = logits[1]
    params = SamplingParams(temperature=3.0, top_k=10, top_p=0.8, min_p=0.2)
    filtered = row / 3.0
    top10 = filtered.topk(10)
    probs = top10.values.softmax(-1)
    n_nucleus = int(((probs.cumsum(-1) - probs) < 0.8).sum())
    kept_probs = probs[:n_nucleus] / probs[:n_nucleus].sum()
    allowed = {
        t
        for t, p in zip(top10.indices[:n_nucleus].tolist(), kept_probs.tolist())
        if p >= 0.2 * kept_probs[0].item()
    }
    drawn = set(draw_many(row, params, 5000).tolist())
    assert drawn <= allowed
    assert len(drawn) == len(allowed)


def test_sampling_frequencies_match_the_softmax():
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 2.0])
    n = 20000
    counts = torch.bincount(draw_many(logits, SamplingParams(temperature=1.0), n), minlength=6)
    expected = logits.softmax(-1) * n
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    # 5 degrees of freedom: P(chi2 > 30) is about 1.5e-5, and the seed is fixed.
    assert chi2 < 30


def test_temperature_flattens_the_distribution():
    logits = torch.tensor([2.0, 0.0])
    n = 20000
    hot = draw_many(logits, SamplingParams(temperature=4.0), n).float().mean().item()
    cold = draw_many(logits, SamplingParams(temperature=0.5), n).float().mean().item()
    assert abs(hot - torch.tensor([0.5, 0.0]).softmax(-1)[1].item()) < 0.02
    assert abs(cold - torch.tensor([4.0, 0.0]).softmax(-1)[1].item()) < 0.01


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = torch.zeros(3, VOCAB)
    logits[:, 7] = 100.0  # eos
    logits[:, 9] = 50.0  # a stop token id
    params = [
        SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9]),
        SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9]),
        SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9], ignore_eos=True),
    ]
    md = metadata(params, outputs=[[1, 2], [1, 2, 3], [4]], eos=7)
    assert md.min_tokens_stop_ids == {0: [7, 9], 2: [9]}
    out = Sampler()(logits, md).sampled_token_ids.tolist()
    assert out[0] not in (7, 9)
    assert out[1] == 7  # min_tokens reached: eos allowed again
    assert out[2] == 7  # ignore_eos: eos is not a stop, so it is not masked


def test_min_tokens_masks_every_eos_id_of_the_model():
    logits = torch.zeros(2, VOCAB)
    logits[:, [5, 7, 8]] = torch.tensor([30.0, 20.0, 10.0])
    params = [SamplingParams(temperature=0, min_tokens=2)] * 2
    md = metadata(params, outputs=[[1], [1, 2]], eos=(5, 7, 8))
    assert md.min_tokens_stop_ids == {0: [5, 7, 8]}
    out = Sampler()(logits, md).sampled_token_ids.tolist()
    assert out[0] not in (5, 7, 8)
    assert out[1] == 5


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_shifts_only_its_rows_and_tokens(logits, temperature):
    params = [
        SamplingParams(temperature=temperature, seed=1, logit_bias={3: 100.0}),
        SamplingParams(temperature=temperature, seed=1),
        SamplingParams(temperature=temperature, seed=1, logit_bias={3: -100.0, 4: 100.0}),
    ]
    out = Sampler()(logits[:3], metadata(params)).sampled_token_ids.tolist()
    alone = Sampler()(logits[1:2], metadata(params[1:2])).sampled_token_ids.tolist()
    assert out[0] == 3 and out[2] == 4
    assert out[1] == alone[0]


def test_logit_bias_does_not_change_the_reported_logprobs(logits):
    params = [SamplingParams(temperature=0, logprobs=1, logit_bias={3: 100.0})]
    out = Sampler()(logits[:1], metadata(params))
    assert out.sampled_token_ids.item() == 3
    expected = logits[0].log_softmax(-1)[3]
    assert out.logprobs.top_logprobs[0, 0].item() == pytest.approx(expected.item())


@pytest.mark.parametrize("top_p", [1e-50, 1e-30, 1e-7])
def test_a_tiny_top_p_keeps_the_most_likely_token(logits, top_p):
    row = logits[0]
    drawn = draw_many(row, SamplingParams(temperature=1.0, top_p=top_p), 64)
    assert set(drawn.tolist()) == {int(row.argmax())}


def test_a_tiny_top_p_with_top_k_keeps_the_most_likely_token(logits):
    row = logits[0]
    drawn = draw_many(row, SamplingParams(temperature=1.0, top_p=1e-50, top_k=3), 64)
    assert set(drawn.tolist()) == {int(row.argmax())}


def test_repetition_penalty_in_the_sampler_matches_the_definition():
    logits = torch.tensor([[3.0, 2.9, -1.0, 0.0]])
    params = [SamplingParams(temperature=0, repetition_penalty=2.0, logprobs=3)]
    out = Sampler()(logits, metadata(params, prompts=[[0]], outputs=[[]], vocab=4))
    # 3.0 -> 1.5, below 2.9: the penalised token loses the argmax.
    assert out.sampled_token_ids.tolist() == [1]
    # ...but logprobs describe the raw logits.
    assert out.logprobs.top_token_ids[0, 1].item() == 0


def test_presence_and_frequency_penalties_in_the_sampler():
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=0, presence_penalty=0.6, frequency_penalty=0.3)]
    # token 0 appears twice: 3 - 0.6 - 0.6 = 1.8 < 2.0
    out = Sampler()(logits, metadata(params, prompts=[[0]], outputs=[[0, 0]], vocab=4))
    assert out.sampled_token_ids.tolist() == [1]
    # Prompt occurrences do not count for presence/frequency.
    out = Sampler()(logits, metadata(params, prompts=[[0, 0, 0]], outputs=[[]], vocab=4))
    assert out.sampled_token_ids.tolist() == [0]


def test_no_penalties_flag_and_neutral_rows():
    md = metadata([SamplingParams(), SamplingParams(temperature=0)])
    assert md.no_penalties and md.prompt_token_ids is None
    md = metadata([SamplingParams(), SamplingParams(presence_penalty=0.5)])
    assert not md.no_penalties
    assert md.prompt_token_ids.tolist() == [[1, 2, 3], [1, 2, 3]]


def test_metadata_uses_neutral_values_for_unused_filters():
    params = [
        SamplingParams(top_k=-1),
        SamplingParams(top_k=8, top_p=0.9, min_p=0.1),
        SamplingParams(temperature=0, top_k=3),
    ]
    md = metadata(params, vocab=VOCAB)
    assert md.top_k.tolist() == [VOCAB, 8, 3]
    assert md.top_p[0].item() == 1.0 and md.min_p[0].item() == 0.0
    assert md.temperature.tolist() == [1.0, 1.0, 0.0]
    assert not md.all_greedy and not md.all_random
    only_greedy_filters = metadata([SamplingParams(), SamplingParams(temperature=0, top_k=3)])
    assert only_greedy_filters.top_k is None
    assert only_greedy_filters.top_p is None and only_greedy_filters.min_p is None


def test_logprobs_match_log_softmax_of_raw_logits(logits):
    params = [SamplingParams(temperature=1.0, logprobs=5, seed=r, top_k=3) for r in range(8)]
    out = Sampler()(logits * 1.0, metadata(params))
    lp = out.logprobs
    raw = logits.log_softmax(-1)
    sampled = out.sampled_token_ids
    assert lp.top_token_ids.shape == (8, 6) and lp.top_logprobs.shape == (8, 6)
    assert lp.top_token_ids[:, 0].tolist() == sampled.tolist()
    assert torch.allclose(lp.top_logprobs, raw.gather(1, lp.top_token_ids))
    assert (lp.top_logprobs[:, 1:].diff(dim=1) <= 0).all()  # top-N descending
    assert lp.top_token_ids[:, 1:].tolist() == raw.topk(5).indices.tolist()
    expected_rank = (raw > raw.gather(1, sampled[:, None])).sum(-1) + 1
    assert lp.sampled_ranks.tolist() == expected_rank.tolist()
    assert (lp.sampled_ranks <= 3).all()  # top-k 3 on raw logits: rank at most 3


def test_logprobs_zero_returns_only_the_sampled_token(logits):
    out = Sampler()(logits, metadata(repeat(SamplingParams(temperature=0, logprobs=0), 8)))
    assert out.logprobs.top_token_ids.shape == (8, 1)
    assert out.logprobs.sampled_ranks.tolist() == [1] * 8


def test_logprobs_to_lists_trims_each_row_to_its_request(logits):
    params = [SamplingParams(temperature=0, logprobs=n) for n in (None, 0, 2, 4)]
    out = Sampler()(logits[:4], metadata(params))
    rows = logprobs_to_lists(out.logprobs, [p.logprobs for p in params])
    assert rows[0] is None
    assert [len(r.token_ids) for r in rows[1:]] == [1, 3, 5]
    assert rows[3].token_ids[0] == out.sampled_token_ids[3].item()
    assert rows[3].sampled_rank == 1
    assert all(len(r.token_ids) == len(r.logprobs) for r in rows[1:])
    assert isinstance(rows[2].logprobs[0], float)


def test_sampler_does_not_mutate_the_logits(logits):
    before = logits.clone()
    params = [SamplingParams(temperature=0.7, top_p=0.5, repetition_penalty=1.5, min_tokens=2)]
    Sampler()(logits[:1], metadata(params, eos=3))
    assert torch.equal(logits, before)
