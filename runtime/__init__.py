"""Pagoda's inference runtime: `from pagoda.runtime import LLM, SamplingParams`.

Imports are lazy so that `import pagoda.runtime` stays cheap (no torch) for
code that only needs configs or the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["LLM", "EngineArgs", "LoRARequest", "RequestOutput", "SamplingParams"]

if TYPE_CHECKING:
    from pagoda.runtime.config import EngineArgs
    from pagoda.runtime.entrypoints.llm import LLM
    from pagoda.runtime.lora.request import LoRARequest
    from pagoda.runtime.outputs import RequestOutput
    from pagoda.runtime.sampling_params import SamplingParams

_LOCATIONS = {
    "LLM": "pagoda.runtime.entrypoints.llm",
    "LoRARequest": "pagoda.runtime.lora.request",
    "EngineArgs": "pagoda.runtime.config",
    "RequestOutput": "pagoda.runtime.outputs",
    "SamplingParams": "pagoda.runtime.sampling_params",
}


def __getattr__(name: str):
    if name in _LOCATIONS:
        import importlib

        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module 'pagoda.runtime' has no attribute {name!r}")
