"""N-gram prompt lookup (vLLM's "ngram" method, after Saxena's prompt lookup
decoding): find the request's last n tokens earlier in its own context and
propose the tokens that followed them there. Free to run, and right often
where the output copies the input (summaries, edits, code, RAG answers).
"""

from __future__ import annotations

import numpy as np


def ngram_propose(
    token_ids: np.ndarray,
    num_tokens: np.ndarray,
    max_drafts: np.ndarray,
    min_n: int,
    max_n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Drafts for every row at once, without a per-token Python loop.

    token_ids [R, W]: each row's context in its first num_tokens[row]
    columns. For n from max_n down to min_n, a row whose last n tokens occur
    earlier in its context (ending before its last token, so something
    follows) takes the most recent such occurrence: the longest match is the
    most specific, the most recent the likeliest to continue the same way.
    Returns (drafts [R, max(max_drafts)] padded with -1, counts [R]), at most
    max_drafts[row] tokens each, fewer when the context ends sooner.
    """
    r, width = token_ids.shape
    num_tokens = num_tokens.astype(np.int64)
    k = int(max_drafts.max()) if r else 0
    drafts = np.full((r, k), -1, dtype=np.int64)
    counts = np.zeros(r, dtype=np.int64)
    if r == 0 or k == 0:
        return drafts, counts
    # Index just past the chosen earlier occurrence, -1 for none yet.
    follow = np.full(r, -1, dtype=np.int64)
    rows = np.arange(r)
    for n in range(max_n, min_n - 1, -1):
        todo = (follow < 0) & (max_drafts > 0) & (num_tokens > n)
        if not todo.any():
            continue
        suffix_idx = num_tokens[:, None] - n + np.arange(n)
        suffix = token_ids[rows[:, None], np.clip(suffix_idx, 0, width - 1)]
        windows = np.lib.stride_tricks.sliding_window_view(token_ids, n, axis=1)
        match = (windows == suffix[:, None, :]).all(axis=2)
        starts = np.arange(windows.shape[1])
        # The occurrence must end before the suffix's last token.
        match &= starts[None, :] + n < num_tokens[:, None]
        found = todo & match.any(axis=1)
        latest = windows.shape[1] - 1 - np.argmax(match[:, ::-1], axis=1)
        follow = np.where(found, latest + n, follow)
    has = follow >= 0
    counts = np.where(has, np.minimum(max_drafts, num_tokens - follow), 0)
    take = np.arange(k)[None, :] < counts[:, None]
    idx = np.clip(follow[:, None] + np.arange(k), 0, width - 1)
    drafts = np.where(take, token_ids[rows[:, None], idx], -1)
    return drafts, counts
