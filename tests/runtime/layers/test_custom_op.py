"""RMSNorm, SiLU-and-mul and RoPE run through `pagoda.kernels.ops`: their
Triton kernel when the model runner enables it (CUDA, unless
`fused_kernels=False`), else the single torch twin. Here Triton runs in its
interpreter (tests/conftest.py sets TRITON_INTERPRET on machines without CUDA)."""

import os

import pytest
import torch
from pagoda.kernels import reference
from pagoda.runtime.layers.activation import SiluAndMul
from pagoda.runtime.layers.custom_op import CustomOp, set_triton_kernels
from pagoda.runtime.layers.layernorm import RMSNorm
from pagoda.runtime.layers.rotary import RotaryEmbedding

needs_triton = pytest.mark.skipif(
    not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="Triton needs CUDA or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts calls of each Triton launcher."""
    import importlib

    rms_norm, activation, rotary = (
        importlib.import_module(f"pagoda.kernels.{name}")
        for name in ("rms_norm", "activation", "rotary")
    )

    calls = {"rms_norm": 0, "silu_and_mul": 0, "rotary": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(rms_norm, "rms_norm_triton", counting("rms_norm", rms_norm.rms_norm_triton))
    monkeypatch.setattr(
        activation,
        "silu_and_mul_triton",
        counting("silu_and_mul", activation.silu_and_mul_triton),
    )
    monkeypatch.setattr(
        rotary, "rotary_embedding_triton", counting("rotary", rotary.rotary_embedding_triton)
    )
    return calls


def run_layers(use_triton: bool):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen).to(DEVICE)
    res = torch.randn(5, 64, generator=gen).to(DEVICE)
    gate_up = torch.randn(5, 96, generator=gen).to(DEVICE)
    q = torch.randn(5, 4, 32, generator=gen).to(DEVICE)
    k = torch.randn(5, 2, 32, generator=gen).to(DEVICE)
    positions = torch.tensor([0, 3, 7, 100, 2], device=DEVICE)
    norm, act, rope = RMSNorm(64, 1e-5), SiluAndMul(), RotaryEmbedding(32, 256, 10000.0, None)
    for layer in (norm, act, rope):
        layer.to(DEVICE).use_triton = use_triton
    normed, summed = norm(x, res)
    q, k = rope(positions, q, k)
    return normed, summed, act(gate_up), q, k


def test_layers_run_the_torch_twins_unless_enabled(kernel_calls):
    run_layers(use_triton=False)
    assert kernel_calls == {"rms_norm": 0, "silu_and_mul": 0, "rotary": 0}
    x = torch.randn(5, 96)
    torch.testing.assert_close(SiluAndMul()(x), reference.silu_and_mul_ref(x))


@needs_triton
def test_enabled_layers_run_the_kernels_and_agree_with_the_twins(kernel_calls):
    fused = run_layers(use_triton=True)
    assert kernel_calls == {"rms_norm": 1, "silu_and_mul": 1, "rotary": 1}
    twins = run_layers(use_triton=False)
    for a, b in zip(fused, twins):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_set_triton_kernels_reaches_every_custom_op_of_a_model():
    from pagoda.runtime.model_loader.random_loader import PRESETS
    from pagoda.runtime.models.arch_config import ModelArchConfig
    from pagoda.runtime.models.llama import LlamaForCausalLM

    cfg = ModelArchConfig.from_hf_dict(
        PRESETS["smollm2-135m"], {"num_hidden_layers": 2, "vocab_size": 64}
    )
    model = LlamaForCausalLM(cfg)
    ops = [m for m in model.modules() if isinstance(m, CustomOp)]
    # 2 norms + 1 activation per layer, the final norm, one shared RoPE, the
    # token embedding and the LM head (a VocabParallelEmbedding too).
    assert set_triton_kernels(model, True) == len(ops) == 2 * 3 + 1 + 1 + 2
    assert all(m.use_triton for m in ops)
    set_triton_kernels(model, False)
    assert not any(m.use_triton for m in ops)


@pytest.mark.model
def test_the_cpu_engine_never_enables_the_kernels(smollm2_gguf):
    from pagoda.runtime.entrypoints.llm import LLM

    llm = LLM(dtype="float32", max_model_len=128, hf_overrides={"num_hidden_layers": 1})
    runner = llm.engine.engine_core.executor.worker.runner
    assert runner.use_triton_kernels is False
    assert not any(m.use_triton for m in runner.model.modules() if isinstance(m, CustomOp))


@pytest.mark.model
@needs_triton
def test_a_model_through_the_kernels_gives_the_twins_greedy_tokens(smollm2_gguf):
    from pagoda.runtime.entrypoints.llm import LLM
    from pagoda.runtime.sampling_params import SamplingParams

    # Eager: a decode graph would replay the kernels it recorded at load.
    llm = LLM(
        dtype="float32",
        max_model_len=128,
        hf_overrides={"num_hidden_layers": 2},
        enforce_eager=True,
    )
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    twins = llm.generate("The capital of France is", params)[0].outputs[0].token_ids
    set_triton_kernels(llm.engine.engine_core.executor.worker.runner.model, True)
    fused = llm.generate("The capital of France is", params)[0].outputs[0].token_ids
    assert fused == twins


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fused", [True, False])
def test_cuda_engine_follows_the_fused_kernels_flag(smollm2_gguf, fused):
    from pagoda.runtime.entrypoints.llm import LLM

    llm = LLM(max_model_len=128, fused_kernels=fused, hf_overrides={"num_hidden_layers": 1})
    assert llm.engine.engine_core.executor.worker.runner.use_triton_kernels is fused
