"""The PodDisruptionBudget: voluntary evictions (node drains) take one pod at a time."""

from __future__ import annotations

from typing import Any

from pagoda.operator.llmservice import LLMService
from pagoda.operator.render.labels import metadata, pdb_name, selector_labels


def wants_pdb(llms: LLMService) -> bool:
    """A budget only helps with more than one replica; with one it would block every drain."""
    return llms.spec.replicas > 1


def render_pdb(llms: LLMService) -> dict[str, Any]:
    """The PodDisruptionBudget `NAME`: at most one pod evicted at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(llms, pdb_name(llms)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(llms)},
            # A crash-looping pod is not serving anyway: let drains evict it, or a
            # broken rollout would pin the node forever.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
