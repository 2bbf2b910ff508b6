"""Screening of raw request bodies before they are typed.

Two kinds of input are refused here, each with a 400 naming the field:

- Text that is not valid Unicode: JSON can carry a lone surrogate
  (`"\\ud800"`), which Python keeps in a `str` but no tokenizer, template or
  UTF-8 encoder accepts; left in, it surfaces as a 500 deep in the engine.
- Fields that change the output but are not implemented (structured output,
  tools, beam search, prompt logprobs, ...). The models ignore unknown
  fields, so without this a client migrating from vLLM or OpenAI would get
  unconstrained output and no error. Harmless unknown fields (`user`,
  `metadata`, `store`, `service_tier`, ...) stay accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_core import PydanticCustomError


def _off(*values: Any) -> Callable[[Any], bool]:
    """A field is harmless when absent or set to one of `values` (its "off")."""
    return lambda value: value is None or any(value == v and type(value) is type(v) for v in values)


_NULL = _off()
_FALSE = _off(False)
_EMPTY = _off([], {}, "")

# Fields of both routes: name -> the test that says its value is harmless.
_UNSUPPORTED_COMMON: dict[str, Callable[[Any], bool]] = {
    # Structured output (vLLM's guided decoding and its successor).
    "guided_json": _EMPTY,
    "guided_regex": _EMPTY,
    "guided_choice": _EMPTY,
    "guided_grammar": _EMPTY,
    "structured_outputs": _EMPTY,
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
    # Other vLLM sampling extensions this engine does not have.
    "prompt_logprobs": _NULL,
    "use_beam_search": _FALSE,
    "logits_processors": _EMPTY,
    "bad_words": _EMPTY,
    "allowed_token_ids": _NULL,
    "truncate_prompt_tokens": _NULL,
    "return_tokens_as_token_ids": _FALSE,
    "spaces_between_special_tokens": _off(True),
}

_UNSUPPORTED_CHAT: dict[str, Callable[[Any], bool]] = {
    **_UNSUPPORTED_COMMON,
    "tools": _EMPTY,
    "tool_choice": _off("none"),
    "functions": _EMPTY,
    "function_call": _off("none"),
    "chat_template": _EMPTY,
    "continue_final_message": _FALSE,
    "echo": _FALSE,
    "documents": _EMPTY,
    "reasoning_effort": _NULL,
    "audio": _NULL,
    "modalities": _off(["text"]),
    "web_search_options": _NULL,
}

_UNSUPPORTED: dict[str, dict[str, Callable[[Any], bool]]] = {
    "CompletionRequest": _UNSUPPORTED_COMMON,
    "ChatCompletionRequest": _UNSUPPORTED_CHAT,
}

# Message fields that would be dropped from the prompt.
_UNSUPPORTED_MESSAGE = {"tool_calls": _EMPTY, "function_call": _NULL}


def screen_request_body(data: Any, model_name: str) -> None:
    """Raise a pydantic error (with `param` in its context) for the first
    invalid text or unsupported field of a raw request body."""
    if not isinstance(data, dict):
        return  # the type check that follows reports it
    path = _find_invalid_unicode(data, "")
    if path is not None:
        raise PydanticCustomError(
            "invalid_unicode",
            "{param} is not valid Unicode text (it contains a lone surrogate)",
            {"param": path or "body"},
        )
    unsupported = _UNSUPPORTED.get(model_name, {})
    for name, harmless in unsupported.items():
        if name in data and not harmless(data[name]):
            _refuse(name)
    if model_name == "ChatCompletionRequest":
        messages = data.get("messages")
        for i, message in enumerate(messages if isinstance(messages, list) else []):
            if isinstance(message, dict):
                for name, harmless in _UNSUPPORTED_MESSAGE.items():
                    if name in message and not harmless(message[name]):
                        _refuse(f"messages.{i}.{name}")
    options = data.get("stream_options")
    if isinstance(options, dict) and not _FALSE(options.get("continuous_usage_stats")):
        _refuse("stream_options.continuous_usage_stats")


def _refuse(param: str) -> None:
    raise PydanticCustomError(
        "unsupported_field",
        "{param} is not supported by this server (it would change the output, and "
        "ignoring it would do so silently); remove it",
        {"param": param},
    )


def _find_invalid_unicode(value: Any, path: str) -> str | None:
    """The dotted path of the first string (or key) with a lone surrogate."""
    if isinstance(value, str):
        return None if _valid_text(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and not _valid_text(key):
                return path or "body"
            found = _find_invalid_unicode(item, sub)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _find_invalid_unicode(item, f"{path}.{i}")
            if found is not None:
                return found
    return None


def _valid_text(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
