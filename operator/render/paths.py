"""Where things are inside a runtime pod: the model, the caches, the adapters.

Shared by the Deployment (which mounts them) and the adapters ConfigMap (which
names adapter folders as the pod sees them).
"""

from __future__ import annotations

from pagoda.operator.llmservice import LLMService

MODEL_MOUNT = "/mnt/models"
HF_CACHE_MOUNT = "/var/cache/pagoda/huggingface"
# Adapters on claims other than the model's are mounted under here, by claim.
ADAPTER_CLAIMS_MOUNT = "/mnt/adapters"
# The adapters file (a ConfigMap volume) the runtime converges on.
ADAPTERS_FILE_MOUNT = "/etc/pagoda/adapters"
ADAPTERS_FILE_KEY = "adapters.json"


def model_claim(llms: LLMService) -> str | None:
    """The claim of a `pvc://` model, else None."""
    model = llms.spec.model
    return model.removeprefix("pvc://").partition("/")[0] if model.startswith("pvc://") else None


def adapter_claims(llms: LLMService) -> list[str]:
    """Claims that hold adapters and are not the model's (each gets a volume)."""
    claims = {
        a.source.removeprefix("pvc://").partition("/")[0]
        for a in llms.spec.adapters
        if a.source.startswith("pvc://")
    }
    claims.discard(model_claim(llms))
    return sorted(claims)


def adapter_path(llms: LLMService, source: str) -> str:
    """Where the pod reads an adapter of `spec.adapters` (what the adapters file lists)."""
    if source.startswith("pvc://"):
        claim, _, path = source.removeprefix("pvc://").partition("/")
        root = MODEL_MOUNT if claim == model_claim(llms) else f"{ADAPTER_CLAIMS_MOUNT}/{claim}"
        return f"{root}/{path}".rstrip("/")
    return source  # an absolute path, or hf://, which the runtime finds in HF_HOME
