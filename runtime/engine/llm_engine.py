"""The in-process engine: front end (tokenize, detokenize) + EngineCore,
with no processes or sockets in between. The offline `LLM` drives it."""

from __future__ import annotations

import dataclasses
import itertools

from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.engine_core import EngineCore
from pagoda.runtime.engine.output_processor import OutputKind, OutputProcessor
from pagoda.runtime.engine.processor import InputProcessor, Prompt
from pagoda.runtime.engine.tokenizer import load_tokenizer
from pagoda.runtime.outputs import RequestOutput
from pagoda.runtime.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, args: EngineArgs):
        self.engine_core = EngineCore(args)
        mc = self.engine_core.model_config
        self.model_config = mc
        self.tokenizer = load_tokenizer(*mc.tokenizer) if mc.tokenizer else None
        eos = mc.arch.eos_token_id
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos = self.tokenizer.eos_token_id
        self.processor = InputProcessor(self.tokenizer, mc.max_model_len, mc.vocab_size, eos)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def next_request_id(self) -> str:
        return str(next(self._ids))

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """Tokenize and check a request without submitting it."""
        token_ids = self.processor.tokenize(prompt)
        self.processor.validate_prompt(token_ids)
        params.validate()
        return token_ids

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        kind: OutputKind = OutputKind.FINAL,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        token_ids, core_req = self.processor.process(
            request_id, prompt, params, prompt_token_ids=prompt_token_ids
        )
        text = prompt if isinstance(prompt, str) else None
        for child_id, child_params in self.output_processor.add_request(
            request_id, text, token_ids, params, kind, core_req.arrival_time
        ):
            self.engine_core.add_request(
                dataclasses.replace(core_req, request_id=child_id, sampling_params=child_params)
            )

    def abort_request(self, request_id: str) -> None:
        self.engine_core.abort_requests(self.output_processor.abort_request(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        processed = self.output_processor.process_outputs(self.engine_core.step())
        if processed.reqs_to_abort:
            self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs
