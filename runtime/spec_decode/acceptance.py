"""Turning drafting off where it does not pay.

A draft the target rejects costs its verification (and, for a draft model,
its proposal) for nothing. Per request, the recent acceptance rate (accepted
/ drafted tokens, exponentially decayed) is watched; below
`min_acceptance_rate` the request stops drafting for a while, with a back-off
that doubles each time it is paused again, so a request that became
predictable (a summary reaching a quoted passage) gets drafts back.
"""

from __future__ import annotations

from dataclasses import dataclass

_DECAY = 0.8  # weight of the past per verified draft: about the last 5 drafts
_FIRST_PAUSE = 8  # steps
_MAX_PAUSE = 128


@dataclass
class _Acceptance:
    drafted: float = 0.0
    accepted: float = 0.0
    paused_for: int = 0
    next_pause: int = _FIRST_PAUSE


class AcceptanceTracker:
    def __init__(self, min_acceptance_rate: float, num_speculative_tokens: int):
        self.min_rate = min_acceptance_rate
        # Judge a request only after about two full drafts' worth of tokens.
        self.min_evidence = 2.0 * num_speculative_tokens
        self._reqs: dict[str, _Acceptance] = {}

    def allow(self, req_id: str) -> bool:
        """Whether to draft for this request now; call once per step it samples."""
        state = self._reqs.get(req_id)
        if state is None or state.paused_for == 0:
            return True
        state.paused_for -= 1
        return False

    def observe(self, req_id: str, num_drafted: int, num_accepted: int) -> None:
        state = self._reqs.setdefault(req_id, _Acceptance())
        state.drafted = _DECAY * state.drafted + num_drafted
        state.accepted = _DECAY * state.accepted + num_accepted
        if self.min_rate <= 0 or state.drafted < self.min_evidence:
            return
        if state.accepted < self.min_rate * state.drafted:
            state.paused_for = state.next_pause
            state.next_pause = min(2 * state.next_pause, _MAX_PAUSE)
            state.drafted = state.accepted = 0.0
        elif state.accepted >= 2 * self.min_rate * state.drafted:
            state.next_pause = _FIRST_PAUSE  # clearly paying again

    def is_paused(self, req_id: str) -> bool:
        state = self._reqs.get(req_id)
        return state is not None and state.paused_for > 0

    def forget(self, req_ids) -> None:
        for req_id in req_ids:
            self._reqs.pop(req_id, None)
