"""Model delivery for `hf://` models: the cache volume and the init container that fills it.

KServe's storage initializer, for the Hugging Face Hub: before the runtime
starts, an init container of the same image runs `pagoda download
hf://org/repo[@revision]` into the pod's Hugging Face cache (HF_HOME). The
cache is the spec's claim (shared by the pods, kept across restarts: a pod
finds the files present, checks their hashes and starts) or an emptyDir of
the pod's own (filled by every new pod). The runtime container then mounts
the cache read-only and starts with HF_HUB_OFFLINE=1, so it never reaches the
Hub; only the init container sees the token.

While it downloads, the init container serves `GET /progress` on the
runtime's port (the runtime is not running yet), which the operator reads
for the ModelReady condition (`operator/model_download.py`).
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.llmservice import LLMService
from pagoda.operator.render.labels import RUNTIME_PORT
from pagoda.operator.render.paths import HF_CACHE_MOUNT

DOWNLOAD_CONTAINER = "model-download"
HF_CACHE_VOLUME = "hf-cache"
PROGRESS_PATH = "/progress"
# The download streams to disk: a core and a little memory, whatever the model's size.
DOWNLOAD_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
# Set by the operator for the download whatever spec.env says: the image is
# offline by default and the cache's place is fixed by the mounts.
DOWNLOAD_OWNED_ENV = ("HF_HOME", "HF_HUB_OFFLINE")


def downloads_model(llms: LLMService) -> bool:
    """Whether the pods download their model from the Hub before they start."""
    return llms.spec.model.startswith("hf://")


def hf_repo(llms: LLMService) -> tuple[str, str | None]:
    """(org/repo, revision or None) of an `hf://org/repo[@revision]` model."""
    repo, _, revision = llms.spec.model.removeprefix("hf://").partition("@")
    return repo, revision or None


def revision_arguments(llms: LLMService) -> list[str]:
    """`pagoda serve` flags that pick the downloaded revision in the offline cache."""
    if not downloads_model(llms):
        return []
    revision = hf_repo(llms)[1]
    return ["--revision", revision] if revision else []


def uses_hf_cache(llms: LLMService) -> bool:
    """Whether the runtime reads a Hugging Face cache (HF_HOME): hf:// models, or hf:// adapters
    on a claim."""
    cache = llms.spec.model_cache
    return downloads_model(llms) or bool(cache and cache.claim_name and llms.spec.lora_enabled)


def hf_cache_volume(llms: LLMService) -> dict[str, Any] | None:
    """The cache volume: the spec's claim, else (for a download) an emptyDir of the pod's own.

    The claim is mounted writable at the volume level: the init container
    writes into it, and the runtime's mount is read-only.
    """
    cache = llms.spec.model_cache
    if cache is not None and cache.claim_name:
        writable = downloads_model(llms)
        return {
            "name": HF_CACHE_VOLUME,
            "persistentVolumeClaim": {"claimName": cache.claim_name, "readOnly": not writable},
        }
    if not downloads_model(llms):
        return None
    empty: dict[str, Any] = {}
    if cache is not None and cache.size_limit is not None:
        empty["sizeLimit"] = str(cache.size_limit)
    return {"name": HF_CACHE_VOLUME, "emptyDir": empty}


def hf_cache_mount(read_only: bool = True) -> dict[str, Any]:
    """Where a container sees the cache (HF_HOME)."""
    return {"name": HF_CACHE_VOLUME, "mountPath": HF_CACHE_MOUNT, "readOnly": read_only}


def _download_env(llms: LLMService) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": HF_CACHE_MOUNT},
        # The image's default is offline (the runtime must never download).
        {"name": "HF_HUB_OFFLINE", "value": "0"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    ref = llms.spec.hf_token_secret_ref
    if ref is not None:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    # The user's variables reach the download too (HF_ENDPOINT for a mirror,
    # HTTPS_PROXY), with their value winning, except where the download must
    # have its own.
    owned = {*DOWNLOAD_OWNED_ENV, *(["HF_TOKEN"] if ref is not None else [])}
    mine = {var["name"]: index for index, var in enumerate(env)}
    for var in llms.spec.env:
        if var.name in owned:
            continue
        rendered = var.model_dump(by_alias=True, exclude_none=True)
        if var.name in mine:
            env[mine[var.name]] = rendered
        else:
            env.append(rendered)
    return env


def download_container(llms: LLMService, runtime: dict[str, Any]) -> dict[str, Any]:
    """The init container that downloads the model; image and security from the `runtime`
    container, so both always run the same build under the same rules."""
    repo, revision = hf_repo(llms)
    args = [f"hf://{repo}" + (f"@{revision}" if revision else "")]
    args += ["--host", "0.0.0.0", "--port", str(RUNTIME_PORT)]
    cache = llms.spec.model_cache
    if cache is not None and cache.size_limit is not None:
        args += ["--size-limit", str(cache.size_limit)]
    container: dict[str, Any] = {
        "name": DOWNLOAD_CONTAINER,
        "image": runtime["image"],
        "command": ["pagoda", "download"],
        "args": args,
        "env": _download_env(llms),
        "resources": DOWNLOAD_RESOURCES,
        # A refused token or an unknown revision is the last log line: it
        # becomes the container's termination message, then ModelReady's.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [hf_cache_mount(read_only=False)],
        "securityContext": runtime["securityContext"],
    }
    if "imagePullPolicy" in runtime:
        container["imagePullPolicy"] = runtime["imagePullPolicy"]
    return container
