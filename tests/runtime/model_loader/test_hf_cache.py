"""A Hugging Face repo id resolves to its snapshot in the local cache (how
the operator's `hf://org/name` models reach the runtime), never downloading."""

import pytest
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.model_loader.resolve import hf_cache_snapshot, resolve_model_config
from pagoda.runtime.sampling_params import InvalidRequestError
from transformers import LlamaConfig


def _tiny_config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )


def test_repo_id_resolves_to_the_cached_snapshot(tmp_path, monkeypatch, tiny_checkpoint):
    hub = tmp_path / "hub"
    repo = hub / "models--acme--tiny-llama"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    tiny_checkpoint(snapshot, _tiny_config())
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    assert hf_cache_snapshot("acme/tiny-llama") == snapshot
    cfg = resolve_model_config(EngineArgs(model="acme/tiny-llama", dtype="float32"))
    assert cfg.source == "hf" and cfg.path == snapshot
    assert cfg.arch.hidden_size == 32


def test_uncached_repo_id_is_a_clear_model_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hf_cache_snapshot("acme/absent") is None
    with pytest.raises(InvalidRequestError) as err:
        resolve_model_config(EngineArgs(model="acme/absent"))
    assert err.value.param == "model" and "cache" in str(err.value)


def test_a_revision_resolves_through_its_ref(tmp_path, monkeypatch, tiny_checkpoint):
    repo = tmp_path / "models--acme--tiny-llama"
    for commit, ref in (("1111", "main"), ("2222", "v2")):
        tiny_checkpoint(repo / "snapshots" / commit, _tiny_config())
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))

    assert hf_cache_snapshot("acme/tiny-llama", "v2") == repo / "snapshots" / "2222"
    cfg = resolve_model_config(EngineArgs(model="acme/tiny-llama", revision="v2", dtype="float32"))
    assert cfg.path == repo / "snapshots" / "2222"
