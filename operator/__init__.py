"""Pagoda's Kubernetes operator: `LLMService` objects in, runtime pods out.

Modules, by concept: `model` (the typed spec, source of the CRD schema),
`crd` (generates the CRD), `llmservice` (validation), `render/` (pure
renderers of the children), `drift` (when to write), `kube` (the API client),
`status` (conditions), `reconcile` (one pass), `handlers` + `main` (kopf),
`cli` (the `pagoda-operator` command), `metrics`, `config`.
"""
