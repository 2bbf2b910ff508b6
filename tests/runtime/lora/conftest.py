"""Random PEFT adapters made with peft itself, on SmolLM2 and on a tiny Llama."""

from __future__ import annotations

import pytest

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_random_adapter(model, folder, *, seed: int, rank: int = 8, targets=ALL_TARGETS, **config):
    """Wrap `model` with a random LoRA (B nonzero, so it changes outputs),
    save it with peft to `folder`, and return the peft model (for references).
    `model` is modified: pass a fresh copy."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    lora_config = LoraConfig(
        r=rank,
        lora_alpha=config.pop("lora_alpha", 2 * rank),
        target_modules=targets,
        init_lora_weights=False,
        **config,
    )
    peft_model = get_peft_model(model, lora_config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    peft_model.save_pretrained(str(folder))
    return peft_model.eval()


@pytest.fixture(scope="session")
def fresh_smollm2(smollm2_gguf):
    """Factory: a new transformers SmolLM2 in float32 (peft mutates what it
    wraps), copied from one load: reading the GGUF takes seconds."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    folder, name = smollm2_gguf
    base = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return lambda: copy.deepcopy(base).eval()


@pytest.fixture(scope="session")
def smollm2_adapters(fresh_smollm2, tmp_path_factory):
    """Three rank-8 adapters on every projection of SmolLM2, with the peft
    models that made them (the references): name -> (folder, peft model)."""
    out = {}
    for seed, name in enumerate(("alpha", "beta", "gamma")):
        folder = tmp_path_factory.mktemp(f"adapter-{name}")
        out[name] = (folder, save_random_adapter(fresh_smollm2(), folder, seed=seed))
    return out
