"""Incremental detokenization and stop strings, one instance per request.

Why a window and not `tokenizers.decoders.DecodeStream`: DecodeStream keeps
its pending bytes private, so when a request ends in the middle of a
multi-byte character (max_tokens hit after the first byte of an emoji) there
is no way to flush them, and the final text would lose what
`tokenizer.decode(output_token_ids)` shows as U+FFFD; it also raises
"Invalid prefix" on some tokenizers (vLLM carries a workaround). The window
below (vLLM's prefix_offset/read_offset) needs only `tokenizer.decode`, so it
honours exactly the tokenizer's own decode options, and costs two decodes of a
few tokens per step, never the whole sequence.
"""

from __future__ import annotations

from typing import Any

from pagoda.runtime.sampling_params import SamplingParams

# How many prompt tokens give the first output tokens their context (vLLM's
# INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET). Decoders such as SentencePiece's
# Metaspace drop the leading space of the first token of a decode call; with a
# few prompt tokens in front, the first output token keeps the space it has
# in the running text, as vLLM returns it.
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's output token ids into text, step by step.

    Invariant: `prefix_text` is the decode of `_window[:_read]`, the tokens
    already turned into text and kept only as left context; the tokens after
    `_read` are pending. Each step decodes the window and emits what the
    context does not already account for. While that text ends with U+FFFD,
    the last token(s) hold part of a multi-byte UTF-8 character split across
    byte-level BPE tokens, so nothing is emitted until it completes (or the
    request finishes: see `update(..., finished=True)`).

    For byte-level BPE tokenizers (GPT-2 style: Llama 3, Qwen2, SmolLM) the
    final `output_text` (with no stop string) equals
    `tokenizer.decode(output_token_ids, skip_special_tokens=...)`. For
    SentencePiece/Metaspace tokenizers the first output token keeps the
    leading space it has after the prompt, as in vLLM.

    Stop strings: the output is searched once it holds more than
    `min_tokens` tokens (as vLLM; min_tokens tokens come before a stop, the
    same rule the sampler applies to EOS and stop_token_ids). Only the new
    text plus the len(stop)-1 characters before it are searched. On a match,
    `output_text` is cut before the stop string (or after it with
    `include_stop_str_in_output`) and `update` returns the stop string; the
    caller must then finish the request (abort it in the engine core).
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        stop: list[str] | None = None,
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop or [])
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens
        self.output_token_ids: list[int] = []
        self.output_text = ""
        self.stop_reason: str | None = None
        self._window = self._prompt_context(prompt_token_ids)
        self._read = len(self._window)
        self._prefix_text = self._decode(self._window)
        self._last_output_offset = 0
        # Characters a streaming client must not see yet: they may be the
        # start of a stop string that the next step completes.
        self._stop_buffer = (
            max(map(len, self.stop)) - 1 if self.stop and not include_stop_str_in_output else 0
        )

    @classmethod
    def from_params(
        cls, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams
    ) -> IncrementalDetokenizer:
        """Build from a request's SamplingParams."""
        return cls(
            tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
            min_tokens=params.min_tokens,
        )

    def update(self, new_token_ids: list[int], finished: bool = False) -> str | None:
        """Append `new_token_ids`; return the stop string if one matched, else None.

        Pass `finished=True` with a request's last tokens (or with [] once
        it is known to be over): characters still waiting for their missing
        UTF-8 bytes are then emitted as U+FFFD, as a full decode shows them.
        After a stop string matched, further calls change nothing.
        """
        if self.stop_reason is not None:
            return None
        self.output_token_ids.extend(new_token_ids)
        self._window.extend(new_token_ids)
        new_text = self._decode_step(finished)
        if not new_text:
            return None
        self.output_text += new_text
        if self.stop and len(self.output_token_ids) > self.min_tokens:
            self.stop_reason = self._find_stop(len(new_text))
        return self.stop_reason

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """Text for the client: all of it (delta=False) or only the unseen part.

        Until the request finishes, the last max(len(stop))-1 characters are
        held back, so a stop string split across steps is never partly sent.
        """
        buffer = 0 if finished else self._stop_buffer
        end = len(self.output_text) - buffer
        if not delta:
            return self.output_text[:end] if buffer else self.output_text
        start = self._last_output_offset
        if start >= end:
            return ""
        self._last_output_offset = end
        return self.output_text[start:end]

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def _prompt_context(self, prompt_token_ids: list[int]) -> list[int]:
        """The last few prompt tokens, or none if the prompt ends mid-character.

        A context that ends inside a UTF-8 character would make the first
        output bytes complete it, and the emitted text would then start in
        the middle of that character's replacement; without context, the
        output decodes as it does alone.
        """
        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        if self._decode(context).endswith(_REPLACEMENT_CHAR):
            return []
        return context

    def _decode_step(self, finished: bool) -> str:
        """Text the pending tokens add; advance the window when there is some."""
        text = self._decode(self._window)
        if len(text) <= len(self._prefix_text):
            return ""
        if text.endswith(_REPLACEMENT_CHAR) and not finished:
            return ""
        new_text = text[len(self._prefix_text) :]
        # The emitted tokens become the next step's left context; older ones
        # are dropped, so the window stays a few tokens long.
        del self._window[: self._read]
        self._read = len(self._window)
        self._prefix_text = self._decode(self._window)
        return new_text

    def _find_stop(self, num_new_chars: int) -> str | None:
        """Cut `output_text` at the earliest stop string in the new text; return it."""
        text = self.output_text
        best: tuple[int, str] | None = None
        for s in self.stop:
            # A match must overlap the new text: the rest was searched before.
            start = max(0, len(text) - num_new_chars - len(s) + 1)
            index = text.find(s, start)
            if index != -1 and (best is None or index < best[0]):
                best = (index, s)
        if best is None:
            return None
        index, s = best
        self.output_text = (
            text[: index + len(s)] if self.include_stop_str_in_output else text[:index]
        )
        return s
