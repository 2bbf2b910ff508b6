"""LoRA adapters over HTTP: `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (vLLM's routes, always on with --enable-lora: no
development-mode switch), and the adapter cards of `/v1/models`.

Both routes take Pagoda's optional `generation` field: the LLMService
generation the caller (the operator) acts for. It orders the call against
the adapters file (lora_file.py): a file for an older generation is not
applied after it."""

from __future__ import annotations

from fastapi import FastAPI
from pagoda.runtime.engine.async_llm import AsyncLLM
from pagoda.runtime.engine.lora_registry import (
    LoRAConflictError,
    LoRANotFoundError,
    LoRARegistry,
)
from pagoda.runtime.entrypoints.openai.errors import APIError
from pagoda.runtime.entrypoints.openai.openapi import COMMON_ERRORS, _error
from pagoda.runtime.entrypoints.openai.protocol import (
    LoadLoRAAdapterRequest,
    LoRAAdapterResponse,
    ModelCard,
    UnloadLoRAAdapterRequest,
)

_LORA_ERRORS = {
    400: _error("LoRA is off, or the adapter cannot be served (`message` says why)"),
    404: _error("no adapter of that name (unload)"),
    409: _error("the name is taken by another folder, and replace is false"),
    **COMMON_ERRORS,
}


def adapter_cards(registry: LoRARegistry, max_model_len: int) -> list[ModelCard]:
    return [
        ModelCard(
            id=name,
            created=loaded.loaded_at,
            root=loaded.source,
            parent=registry.base_model_name,
            max_model_len=max_model_len,
        )
        for name, loaded in sorted(registry.adapters.items())
    ]


def install_lora_routes(app: FastAPI, engine: AsyncLLM) -> None:
    def registry() -> LoRARegistry:
        if engine.lora_registry is None:
            raise APIError(
                "this server serves no LoRA adapters (start it with --enable-lora)",
                400,
                param="lora_name",
            )
        return engine.lora_registry

    @app.post("/v1/load_lora_adapter", response_model=LoRAAdapterResponse, responses=_LORA_ERRORS)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> dict:
        try:
            lora = await registry().load(
                body.lora_name, body.lora_path, body.replace, generation=body.generation
            )
        except LoRAConflictError as exc:
            raise APIError(str(exc), 409, param=exc.param) from None
        return LoRAAdapterResponse(
            lora_name=lora.lora_name, lora_path=body.lora_path, status="loaded"
        ).model_dump()

    @app.post("/v1/unload_lora_adapter", response_model=LoRAAdapterResponse, responses=_LORA_ERRORS)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> dict:
        try:
            await registry().unload(body.lora_name, generation=body.generation)
        except LoRANotFoundError as exc:
            raise APIError(str(exc), 404, param=exc.param) from None
        return LoRAAdapterResponse(lora_name=body.lora_name, status="unloaded").model_dump()
