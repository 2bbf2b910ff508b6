"""Request and response bodies of the OpenAI-compatible API (pydantic).

Requests accept OpenAI's fields plus vLLM's sampling extensions (`top_k`,
`min_p`, `repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`).
Unknown fields are ignored, as OpenAI and vLLM do, except the ones that would
change the output and are not implemented (`guided_json`, `tools`, ...,
listed in `request_screen.py`): those are refused with a 400 naming them, so
a client never gets unconstrained output silently. Value ranges are declared
on the fields (they reach /openapi.json) with the limits of
`pagoda.runtime.sampling_params`, which checks them again for the offline API.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pagoda.runtime.entrypoints.openai.request_screen import screen_request_body
from pagoda.runtime.sampling_params import (
    INT64_MAX,
    INT64_MIN,
    MAX_COUNT,
    MAX_LIST_LEN,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_N,
    MAX_TOKEN_ID,
    InvalidRequestError,
    SamplingParams,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class OpenAIRequest(OpenAIModel):
    """A request body: screened as raw JSON first (invalid Unicode anywhere,
    unsupported fields), so those errors name the field before any typing."""

    @model_validator(mode="before")
    @classmethod
    def _screen(cls, data: Any) -> Any:
        screen_request_body(data, cls.__name__)
        return data


# Ranges, from the engine's own limits so the two never disagree.
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Real = Annotated[float, Field(allow_inf_nan=False)]


class StreamOptions(OpenAIModel):
    include_usage: bool = False


StopString = Annotated[str, Field(min_length=1)]


class _SamplingFields(OpenAIRequest):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: Count | None = None
    # Unset sampling fields take the model's generation_config.json default,
    # then OpenAI's (vLLM's --generation-config auto).
    temperature: Annotated[Real, Field(ge=0)] | None = None
    top_p: Annotated[Real, Field(gt=0, le=1)] | None = None
    # -1 or 0: no top-k.
    top_k: Annotated[int, Field(ge=-1, le=MAX_COUNT)] | None = None
    min_p: Annotated[Real, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_LIST_LEN)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_LIST_LEN)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0
    presence_penalty: Annotated[Real, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[Real, Field(ge=-2, le=2)] = 0.0
    repetition_penalty: Annotated[Real, Field(gt=0)] | None = None
    # OpenAI's shape: token id (as a string) -> bias in [-100, 100].
    logit_bias: (
        Annotated[
            dict[
                Annotated[str, Field(pattern=r"^[0-9]{1,10}$")],
                Annotated[Real, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)],
            ],
            Field(max_length=MAX_LIST_LEN),
        ]
        | None
    ) = None
    # vLLM's name: requests with different salts never share prefix-cache blocks.
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling_params(
        self, max_tokens: int | None, logprobs: int | None, defaults: dict | None = None
    ) -> SamplingParams:
        """The engine's parameters; raises InvalidRequestError naming the field.

        `defaults` (the model's generation config) fill the sampling fields
        the request left unset; OpenAI's defaults fill the rest.
        """
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError(
                "stream_options may only be set when stream is true", param="stream_options"
            )
        defaults = defaults or {}

        def pick(name: str, openai_default: float | int) -> float | int:
            value = getattr(self, name)
            return defaults.get(name, openai_default) if value is None else value

        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        top_k = pick("top_k", -1)
        return SamplingParams(
            n=self.n,
            temperature=pick("temperature", 1.0),
            top_p=pick("top_p", 1.0),
            # 0 means "off" for many clients (vLLM accepts it too).
            top_k=-1 if top_k == 0 else top_k,
            min_p=pick("min_p", 0.0),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=pick("repetition_penalty", 1.0),
            logit_bias=_logit_bias(self.logit_bias),
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI sends token ids as JSON object keys, i.e. strings."""
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError:
        raise InvalidRequestError(
            "logit_bias keys must be token ids (integers as strings)", param="logit_bias"
        ) from None


TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(_SamplingFields):
    # Text, texts, token ids, or lists of token ids (one choice set per prompt).
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_LIST_LEN)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_LIST_LEN)]
    )
    # A text prompt gets the tokenizer's special tokens (a BOS for Llama).
    add_special_tokens: bool = True
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    suffix: str | None = None


class TextContentPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(OpenAIModel):
    type: str
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    # The template writes the special tokens it wants (Llama's and Mistral's
    # emit bos_token); encoding with them would double the BOS. vLLM's default.
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeRequest(OpenAIRequest):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # Unset: as the matching route encodes (True for a prompt, False for
    # messages), so /tokenize counts what usage reports.
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(OpenAIRequest):
    model: str | None = None
    tokens: list[TokenId]


# -- responses ------------------------------------------------------------------------


class TokenizeResponse(OpenAIModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(OpenAIModel):
    prompt: str


class PromptTokensDetails(OpenAIModel):
    # Prompt tokens served from the prefix cache (OpenAI's name).
    cached_tokens: int = 0


class UsageInfo(OpenAIModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class CompletionLogprobs(OpenAIModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(OpenAIModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(OpenAIModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(OpenAIModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(OpenAIModel):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(OpenAIModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(OpenAIModel):
    role: str | None = None
    content: str | None = None


class ChatStreamChoice(OpenAIModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(OpenAIModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class CompletionChunk(OpenAIModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(OpenAIModel):
    id: str
    object: str = "model"
    created: int  # fixed per model: server start, or the adapter's load
    owned_by: str = "pagoda"
    root: str
    # For a LoRA adapter: the base model it runs on (vLLM's field).
    parent: str | None = None
    max_model_len: int


# Pagoda's extension to vLLM's adapter routes: the LLMService generation
# (`metadata.generation`, an int64) the caller acts for. The operator sends it
# so that the pod's adapters file, which lags, cannot undo a newer call
# (lora_registry.py); a user's own calls leave it out. Strict: "3", 3.0 and
# true are refused, not coerced.
Generation = Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]


class LoadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1, max_length=128)
    # A folder the server can read, or hf://org/repo[/subfolder] from its cache.
    lora_path: str = Field(min_length=1, max_length=4096)
    # Load another folder under a name already taken: requests in flight
    # finish on the old weights, new ones get the new.
    replace: bool = False
    generation: Generation | None = None


class UnloadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1, max_length=128)
    generation: Generation | None = None


class LoRAAdapterResponse(OpenAIModel):
    lora_name: str
    lora_path: str | None = None
    status: str


class ModelList(OpenAIModel):
    object: str = "list"
    data: list[ModelCard]


class ErrorInfo(OpenAIModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIModel):
    error: ErrorInfo
