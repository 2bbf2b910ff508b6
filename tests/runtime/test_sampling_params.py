"""SamplingParams: what crosses the process boundary stays within 64 bits."""

from __future__ import annotations

from pagoda.runtime.sampling_params import INT64_MAX, INT64_MIN, SamplingParams


def test_child_seeds_of_the_largest_seed_wrap_within_int64():
    params = SamplingParams(n=3, seed=INT64_MAX)
    seeds = [params.for_child(i).seed for i in range(3)]
    assert seeds == [INT64_MAX, INT64_MIN, INT64_MIN + 1]
    assert all(INT64_MIN <= s <= INT64_MAX for s in seeds)


def test_child_seeds_stay_distinct_and_unchanged_in_the_ordinary_range():
    params = SamplingParams(n=2, seed=7)
    assert [params.for_child(i).seed for i in range(2)] == [7, 8]
