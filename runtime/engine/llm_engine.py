"""The in-process engine: front end (tokenize, detokenize) + EngineCore,
with no processes or sockets in between. The offline `LLM` drives it."""

from __future__ import annotations

import dataclasses
import itertools

from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.engine_core import EngineCore
from pagoda.runtime.engine.output_processor import OutputKind, OutputProcessor
from pagoda.runtime.engine.processor import (
    InputProcessor,
    Prompt,
    log_generation_setup,
    resolve_eos_token_ids,
)
from pagoda.runtime.engine.tokenizer import load_tokenizer
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.outputs import RequestOutput
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams


class LLMEngine:
    def __init__(self, args: EngineArgs):
        self.engine_core = EngineCore(args.create_engine_config())
        mc = self.engine_core.model_config
        self.model_config = mc
        self.tokenizer = load_tokenizer(*mc.tokenizer) if mc.tokenizer else None
        eos = resolve_eos_token_ids(mc.eos_token_ids, self.tokenizer)
        self.processor = InputProcessor(self.tokenizer, mc.max_model_len, mc.vocab_size, eos)
        self.default_sampling_params = dict(mc.generation.sampling_defaults)
        log_generation_setup(eos, self.default_sampling_params)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()
        self._loras: dict[int, LoRARequest] = {}

    def next_request_id(self) -> str:
        return str(next(self._ids))

    def validate(
        self, prompt: Prompt, params: SamplingParams, add_special_tokens: bool = True
    ) -> list[int]:
        """Tokenize and check a request without submitting it."""
        token_ids = self.processor.tokenize(prompt, add_special_tokens)
        self.processor.validate_prompt(token_ids)
        self.processor.validate_params(params)
        return token_ids

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        kind: OutputKind = OutputKind.FINAL,
        prompt_token_ids: list[int] | None = None,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        if lora_request is not None:
            self.add_lora(lora_request)
        token_ids, core_req = self.processor.process(
            request_id,
            prompt,
            params,
            prompt_token_ids=prompt_token_ids,
            add_special_tokens=add_special_tokens,
            cache_salt=cache_salt,
            lora_request=lora_request,
        )
        text = prompt if isinstance(prompt, str) else None
        for child_id, child_params in self.output_processor.add_request(
            request_id, text, token_ids, params, kind, core_req.arrival_time
        ):
            self.engine_core.add_request(
                dataclasses.replace(core_req, request_id=child_id, sampling_params=child_params)
            )

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load an adapter on the workers once per `lora_int_id`; raises
        AdapterError (or InvalidRequestError with LoRA off) on a bad folder."""
        known = self._loras.get(lora_request.lora_int_id)
        if known == lora_request:
            return
        if known is not None:
            raise InvalidRequestError(
                f"lora_int_id {lora_request.lora_int_id} already names adapter "
                f"{known.lora_name!r} at {known.lora_path}; give other weights another id",
                param="lora_request",
            )
        self.engine_core.add_lora(lora_request)
        self._loras[lora_request.lora_int_id] = lora_request

    def remove_lora(self, lora_int_id: int) -> None:
        self._loras.pop(lora_int_id, None)
        self.engine_core.remove_lora(lora_int_id)

    def abort_request(self, request_id: str) -> None:
        self.engine_core.abort_requests(self.output_processor.abort_request(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def shutdown(self) -> None:
        """Stop the engine's worker processes (tensor parallelism); idempotent."""
        self.engine_core.shutdown()

    def step(self) -> list[RequestOutput]:
        processed = self.output_processor.process_outputs(self.engine_core.step())
        if processed.reqs_to_abort:
            self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs
