"""N-gram prompt lookup: the longest, most recent earlier occurrence of the
context's suffix proposes what followed it; the whole batch in one pass."""

import numpy as np
from pagoda.runtime.spec_decode.acceptance import AcceptanceTracker
from pagoda.runtime.spec_decode.ngram_proposer import ngram_propose


def _propose(contexts, k=3, min_n=2, max_n=4, max_drafts=None):
    width = max(len(c) for c in contexts)
    tokens = np.zeros((len(contexts), width + 8), dtype=np.int32)
    for i, c in enumerate(contexts):
        tokens[i, : len(c)] = c
    lens = np.array([len(c) for c in contexts])
    md = np.full(len(contexts), k) if max_drafts is None else np.array(max_drafts)
    drafts, counts = ngram_propose(tokens, lens, md, min_n, max_n)
    return [d[:n].tolist() for d, n in zip(drafts, counts)]


def test_a_repeated_phrase_proposes_its_continuation():
    assert _propose([[1, 2, 3, 4, 5, 9, 1, 2, 3]]) == [[4, 5, 9]]


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # suffix (7, 2, 3): its 3-gram occurs at the start, only (2, 3) later.
    ctx = [7, 2, 3, 10, 11, 12, 2, 3, 20, 21, 7, 2, 3]
    assert _propose([ctx]) == [[10, 11, 12]]


def test_the_most_recent_occurrence_of_equal_length_wins():
    ctx = [1, 2, 5, 5, 5, 1, 2, 6, 6, 6, 1, 2]
    assert _propose([ctx]) == [[6, 6, 6]]


def test_no_match_no_drafts_and_short_contexts_are_fine():
    assert _propose([[1, 2, 3, 4, 5, 6], [1], [4, 4]]) == [[], [], []]


def test_drafts_stop_at_the_end_of_the_context_and_at_max_drafts():
    assert _propose([[1, 2, 3, 1, 2]], k=5) == [[3, 1, 2]]
    assert _propose([[1, 2, 3, 4, 5, 1, 2]], max_drafts=[1]) == [[3]]
    assert _propose([[1, 2, 3, 4, 5, 1, 2]], max_drafts=[0]) == [[]]


def test_a_batch_is_proposed_row_by_row_as_alone():
    rows = [[1, 2, 3, 4, 5, 9, 1, 2, 3], [5, 6, 7, 5, 6], [8, 8, 8, 8], [1, 2]]
    assert _propose(rows) == [_propose([r])[0] for r in rows]


def test_low_acceptance_pauses_drafting_and_it_comes_back():
    tracker = AcceptanceTracker(min_acceptance_rate=0.3, num_speculative_tokens=3)
    for _ in range(3):
        assert tracker.allow("a")
        tracker.observe("a", 3, 0)
    paused = 0
    while not tracker.allow("a"):
        paused += 1
    assert paused == 8
    tracker.observe("b", 3, 3)
    tracker.observe("b", 3, 3)
    tracker.observe("b", 3, 2)
    assert tracker.allow("b")
