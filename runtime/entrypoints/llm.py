"""The offline Python API: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Sequence

from pagoda.runtime.config import EngineArgs
from pagoda.runtime.engine.llm_engine import LLMEngine
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.outputs import RequestOutput
from pagoda.runtime.sampling_params import SamplingParams

Message = dict[str, str | list]


class LLM:
    """Generate with a model in this process.

    `LLM(model, **options)` takes the same options as `pagoda` CLI flags, as
    keyword arguments (see `EngineArgs`), e.g. `max_num_seqs=64`,
    `enable_prefix_caching=False`, `attention_backend="torch"`, `dtype="float32"`.
    """

    def __init__(self, model: str = "smollm2-135m-instruct", **options):
        self.engine = LLMEngine(EngineArgs.from_kwargs(model=model, **options))

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The model's own defaults (its generation_config.json), used when
        `generate` or `chat` get no sampling params; vLLM's method."""
        return SamplingParams(**self.engine.default_sampling_params)

    def generate(
        self,
        prompts: str | list[int] | Sequence[str] | Sequence[list[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        add_special_tokens: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in the order given.

        `lora_request` runs every prompt (or, as a list, each prompt) with an
        adapter (`enable_lora=True`). Every request is validated, and every
        adapter loaded, before any is submitted, so one bad prompt, parameter
        or adapter raises (naming the field) and nothing runs.
        """
        prompts = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _as_params_list(sampling_params, len(prompts))
        loras = _as_lora_list(lora_request, len(prompts))
        token_ids = [
            self.engine.validate(prompt, p, add_special_tokens)
            for prompt, p in zip(prompts, params)
        ]
        for lora in dict.fromkeys(x for x in loras if x is not None):
            self.engine.add_lora(lora)
        ids = []
        for prompt, p, toks, lora in zip(prompts, params, token_ids, loras):
            rid = self.engine.next_request_id()
            self.engine.add_request(rid, prompt, p, prompt_token_ids=toks, lora_request=lora)
            ids.append(rid)
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        use_tqdm: bool = False,
        add_special_tokens: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them.

        The rendered text is encoded without the tokenizer's special tokens
        (`add_special_tokens=False`, as vLLM): templates write their own BOS.
        """
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        prompts = [
            tok.apply_chat_template(
                conv,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **(chat_template_kwargs or {}),
            )
            for conv in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm, add_special_tokens, lora_request)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        wanted = set(request_ids)
        done: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(request_ids), desc="Generating", unit="req")
        try:
            while len(done) < len(wanted):
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted:
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            # Leave the engine clean for the next call (KeyboardInterrupt too).
            for rid in wanted - set(done):
                self.engine.abort_request(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [done[rid] for rid in request_ids]


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int):
        return [list(prompts)]
    return list(prompts)


def _as_lora_list(lora, n: int) -> list[LoRARequest | None]:
    if lora is None or isinstance(lora, LoRARequest):
        return [lora] * n
    lora = list(lora)
    if len(lora) != n:
        raise ValueError(f"got {len(lora)} LoRA requests for {n} prompts")
    return lora


def _as_params_list(params, n: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} sampling params for {n} prompts")
    return params
