"""Pagoda's Kubernetes operator: `LLMService` objects in, runtime pods out.

Modules, by concept: `model` (the typed spec, source of the CRD schema), `crd` (generates the CRD),
`llmservice` (validation), `render/` (pure renderers of the children),
`ownership` (whose object is it), `drift` (what a write did), `api` (the one
door to the Kubernetes API), `errors` (what to retry), `status` (conditions),
`reconcile` (one pass), `triggers` (watch events to owners), `handlers` +
`main` (kopf), `cli` (the `pagoda-operator` command), `metrics`, `config`.
"""
