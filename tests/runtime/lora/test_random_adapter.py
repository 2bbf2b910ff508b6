"""The random adapter writer: a folder the loader accepts, different per seed."""

import pytest
import torch
from pagoda.runtime.lora.peft import SUPPORTED_MODULES, load_peft_adapter
from pagoda.runtime.lora.random_adapter import write_random_adapter

from .test_peft import ARCH


def test_a_random_adapter_loads_with_every_projection(tmp_path):
    adapter = load_peft_adapter(write_random_adapter(tmp_path / "a", ARCH, rank=4), ARCH, 8)
    assert adapter.rank == 4
    assert {m for (_, m) in adapter.weights} == set(SUPPORTED_MODULES)
    assert {layer for (layer, _) in adapter.weights} == {0, 1}
    assert all(b.abs().sum() > 0 for (_, b) in adapter.weights.values())


def test_seeds_give_different_adapters_and_the_same_seed_the_same(tmp_path):
    def first_b(name, seed):
        folder = write_random_adapter(tmp_path / name, ARCH, rank=4, seed=seed)
        return load_peft_adapter(folder, ARCH, 8).weights[0, "q_proj"][1]

    assert torch.equal(first_b("a", 0), first_b("b", 0))
    assert not torch.equal(first_b("c", 0), first_b("d", 1))


def test_a_rank_above_the_limit_is_refused(tmp_path):
    with pytest.raises(ValueError, match="rank"):
        load_peft_adapter(write_random_adapter(tmp_path / "a", ARCH, rank=16), ARCH, 8)
