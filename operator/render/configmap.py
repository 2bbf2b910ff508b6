"""The ConfigMaps: engine arguments (PAGODA_* variables) and the LoRA adapters file.

Every engine flag of `pagoda serve` has a PAGODA_* environment twin, so the pod
loads the whole engine configuration with one `envFrom`. A hash of this data is stamped on
the pod template, so changing an engine argument rolls the pods.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pagoda.operator.llmservice import LLMService
from pagoda.operator.render.labels import adapters_configmap_name, configmap_name, metadata
from pagoda.operator.render.paths import ADAPTERS_FILE_KEY, adapter_path


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def engine_env(llms: LLMService) -> dict[str, str]:
    """The engine's arguments as PAGODA_* variables; unset fields are left out.

    Only `EngineArgs` fields live here (their env twins are generated from the
    field names). Serving flags (name, tensor parallelism, drain) are container
    arguments, where the pod spec shows them.
    """
    engine = llms.spec.engine
    env = {"PAGODA_DTYPE": engine.dtype}
    optional = {
        "PAGODA_MAX_MODEL_LEN": engine.max_model_len,
        "PAGODA_MAX_NUM_SEQS": engine.max_num_seqs,
        "PAGODA_MAX_NUM_BATCHED_TOKENS": engine.max_num_batched_tokens,
        "PAGODA_GPU_MEMORY_UTILIZATION": engine.gpu_memory_utilization,
        "PAGODA_KV_CACHE_MEMORY_GIB": engine.kv_cache_memory,
    }
    env |= {key: _number(value) for key, value in optional.items() if value is not None}
    if engine.kv_cache_dtype is not None:
        env["PAGODA_KV_CACHE_DTYPE"] = engine.kv_cache_dtype
    if engine.enable_prefix_caching is not None:
        env["PAGODA_ENABLE_PREFIX_CACHING"] = "true" if engine.enable_prefix_caching else "false"
    return dict(sorted(env.items()))


def config_hash(data: dict[str, str]) -> str:
    """A short, stable digest of the ConfigMap's data (for the pod template annotation)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def render_configmap(llms: LLMService) -> dict[str, Any]:
    """The ConfigMap `NAME-engine`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(llms, configmap_name(llms)),
        "data": engine_env(llms),
    }


def adapters_file(llms: LLMService) -> str:
    """The runtime's `--lora-adapters-file`: `{"generation", "adapters"}`, one adapter a line.

    `generation` orders the file against the adapter loop's calls to the pods,
    which carry the spec's `metadata.generation`: the file reaches a pod late
    (the kubelet's refresh), and a pod skips a file older than a call it has
    applied, so a removed adapter does not come back. The reconcile keeps the
    live file while it lists the same adapters (`stable_adapters_configmap`),
    so a change of anything else (a scale, an image) leaves the file alone.
    Left out while unknown (the runtime then always applies the file).
    """
    entries = [
        json.dumps({"name": a.name, "path": adapter_path(llms, a.source)}, sort_keys=True)
        for a in llms.spec.adapters
    ]
    listed = "[\n    " + ",\n    ".join(entries) + "\n  ]" if entries else "[]"
    generation = llms.generation
    head = f'  "generation": {json.dumps(generation)},\n' if generation is not None else ""
    return "{\n" + head + f'  "adapters": {listed}\n' + "}\n"


def render_adapters_configmap(llms: LLMService) -> dict[str, Any]:
    """The ConfigMap `NAME-adapters`, mounted as a volume: the kubelet updates the file
    in running pods and the runtime converges on it, so its content is kept out of
    every pod-template hash (an adapter change never restarts a pod)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(llms, adapters_configmap_name(llms)),
        "data": {ADAPTERS_FILE_KEY: adapters_file(llms)},
    }


def _parse_file(configmap: Mapping[str, Any] | None) -> dict[str, Any] | None:
    text = ((configmap or {}).get("data") or {}).get(ADAPTERS_FILE_KEY)
    try:
        parsed = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def stable_adapters_configmap(
    desired: Mapping[str, Any], live: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`desired` (the adapters ConfigMap), with the live file kept if it lists the same adapters.

    The spec's generation moves on every change of the spec, a scale
    included; the file's only needs to move when the adapters do. Keeping the
    live file then keeps the ConfigMap unchanged: no write, no Event, no
    refresh in the pods. Its older generation is still the right order: it
    is the generation that set these adapters, and no call since changed them.
    """
    want, have = _parse_file(desired), _parse_file(live)
    if (
        want is None
        or have is None
        or have.get("adapters") != want.get("adapters")
        or not isinstance(have.get("generation"), int)
        or not isinstance(want.get("generation"), int)
        or have["generation"] > want["generation"]
    ):
        return dict(desired)
    kept = copy.deepcopy(dict(desired))
    kept["data"][ADAPTERS_FILE_KEY] = live["data"][ADAPTERS_FILE_KEY]  # type: ignore[index]
    return kept
