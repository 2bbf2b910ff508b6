"""An hf:// model end to end: the operator's init container downloads it from a stand-in Hub.

The Hub is kubesim.hub on loopback (HF_ENDPOINT, set through spec.env); the
model is a tiny random Llama saved with transformers' own classes and a small
byte-level BPE tokenizer. The pod's `model-download` init container (a real
`pagoda download`) fills its emptyDir cache, then `pagoda serve` starts
offline from it and answers through the Service.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubesim.cluster import Cluster
from kubesim.hub import Hub
from kubesim.testing import NS, create

from .conftest import LIGHT, STARTUP_TIMEOUT

REPO = "acme/tiny-llama"
NAME = "tiny"
TOKEN = "hf_test_token"


def save_tiny_llama(folder: Path) -> None:
    """A random 1-layer Llama and a byte-level BPE tokenizer, as a Hub repo would hold them."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["a pagoda is a tiered tower with eaves"] * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(folder)
    return folder


@pytest.fixture
async def hub(checkpoint: Path) -> AsyncIterator[Hub]:
    server = Hub(tokens={TOKEN})
    files = {str(p.relative_to(checkpoint)): p.read_bytes() for p in checkpoint.iterdir()}
    # Duplicates a real repo carries that the runtime never reads.
    files |= {p: b"x" * 4096 for p in ("model.Q4_K_M.gguf", "original/consolidated.00.pth")}
    server.commit(REPO, files, private=True)
    await server.start()
    yield server
    await server.stop()


def llmservice(hub: Hub, secret: str = "hf") -> dict[str, Any]:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "model": f"hf://{REPO}",
            "hfTokenSecretRef": {"name": secret},
            "modelCache": {"sizeLimit": "1Gi"},
            "engine": {**LIGHT["engine"], "maxModelLen": 128},
            "env": [*copy.deepcopy(LIGHT["env"]), {"name": "HF_ENDPOINT", "value": hub.url}],
            "drain": copy.deepcopy(LIGHT["drain"]),
        },
    }


def secret(token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf", "namespace": NS},
        "stringData": {"token": token},
    }


async def test_an_hf_model_is_downloaded_then_served_offline(cluster: Cluster, hub: Hub) -> None:
    await create(cluster.api, secret(TOKEN))
    await cluster.create(llmservice(hub))

    await cluster.wait_for(lambda: cluster.is_ready(NAME), STARTUP_TIMEOUT, "Ready")
    ready = await cluster.wait_for(
        lambda: (c := cluster.condition(NAME, "ModelReady")) and c["status"] == "True" and c,
        30,
        "ModelReady",
    )
    assert ready["reason"] == "Downloaded"
    assert ready["message"] == f"hf://{REPO} is in the cache of 1 pod"
    # The runtime answers from what the init container downloaded, offline.
    async with httpx.AsyncClient(base_url=cluster.service_url(NAME), timeout=60) as client:
        answer = await client.post(
            "/v1/completions", json={"model": NAME, "prompt": "a pagoda", "max_tokens": 4}
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] > 0
    (pod,) = cluster.ready_pods(NAME)
    status = cluster.get("Pod", pod.name)["status"]
    (init,) = status["initContainerStatuses"]
    assert init["name"] == "model-download" and init["state"]["terminated"]["exitCode"] == 0
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub.requests if "/resolve/" in r.path}
    assert "model.safetensors" in fetched and "config.json" in fetched
    assert not fetched & {"model.Q4_K_M.gguf", "consolidated.00.pth"}


async def test_a_refused_token_is_download_failed_with_the_hubs_reason(
    cluster: Cluster, hub: Hub
) -> None:
    await create(cluster.api, secret("hf_wrong"))
    await cluster.create(llmservice(hub))

    failed = await cluster.wait_for(
        lambda: (
            (c := cluster.condition(NAME, "ModelReady")) and c["reason"] == "DownloadFailed" and c
        ),
        60,
        "DownloadFailed",
    )
    assert failed["status"] == "False"
    assert "the Hub refused the token (401): check hfTokenSecretRef" in failed["message"]
    degraded = cluster.condition(NAME, "Degraded")
    assert degraded is not None and degraded["status"] == "True"
    assert not cluster.is_ready(NAME)
    assert all(p.pid is None for p in cluster.pods(NAME))  # the runtime never started
