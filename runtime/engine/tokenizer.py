"""Load the model's tokenizer (from its folder, or from the GGUF file)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4)
def load_tokenizer(folder: str, gguf_file: str | None = None):
    from transformers import AutoTokenizer

    if gguf_file:
        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    return AutoTokenizer.from_pretrained(folder)
