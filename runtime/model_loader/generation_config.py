"""The model's `generation_config.json`: its end-of-sequence ids and the
sampling defaults its authors chose.

vLLM reads the same file (`--generation-config auto`): Llama 3.1 Instruct
ships temperature 0.6 and top_p 0.9 there, Qwen2.5 Instruct adds top_k 20 and
repetition_penalty 1.05, and both list more end-of-sequence ids than their
tokenizer names (Qwen2.5 stops on `<|im_end|>` and `<|endoftext|>`). A request
that leaves a sampling field unset gets the model's default, not OpenAI's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pagoda.runtime.model_config import GenerationConfig
from pagoda.runtime.models.arch_config import token_id_tuple
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams

logger = logging.getLogger(__name__)

FILE_NAME = "generation_config.json"

# generation_config.json key -> SamplingParams field (vLLM's set).
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def parse_generation_config(raw: dict, source: str = FILE_NAME) -> GenerationConfig:
    """Keep the EOS ids and the sampling fields vLLM honours; a value that
    SamplingParams would refuse is dropped with a warning rather than turning
    every request into a 400."""
    defaults: dict[str, float | int] = {}
    for key, name in SAMPLING_KEYS.items():
        value = raw.get(key)
        if value is None:
            continue
        if name == "top_k" and value == 0:
            value = -1  # transformers' "off"
        try:
            SamplingParams(**{name: value})
        except (InvalidRequestError, TypeError) as exc:
            logger.warning("ignoring %s=%r from %s: %s", key, value, source, exc)
            continue
        defaults[name] = value
    try:
        eos = token_id_tuple(raw.get("eos_token_id"))
    except (TypeError, ValueError):
        logger.warning("ignoring eos_token_id=%r from %s", raw.get("eos_token_id"), source)
        eos = ()
    return GenerationConfig(eos_token_ids=eos, sampling_defaults=defaults)


def read_generation_config(folder: Path | None) -> GenerationConfig:
    """The folder's generation_config.json, or an empty config if it has none."""
    if folder is None or not (folder / FILE_NAME).is_file():
        return GenerationConfig()
    path = folder / FILE_NAME
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(
            f"{path} is not valid JSON: {exc}", param="generation_config"
        ) from exc
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{path} must hold a JSON object", param="generation_config")
    return parse_generation_config(raw, str(path))
