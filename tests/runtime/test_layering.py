"""Imports run one way: front end -> engine core -> workers. A core module
that imported the front end (or a worker that imported the scheduler) would
tie the processes together again; this reads every import to keep it so."""

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"

# package folder (or module) -> import prefixes it must never use
FORBIDDEN = {
    "core": ["pagoda.runtime.engine", "pagoda.runtime.entrypoints"],
    "executor": [
        "pagoda.runtime.engine",
        "pagoda.runtime.entrypoints",
        "pagoda.runtime.core.scheduler",
        "pagoda.runtime.core.engine_core",
        "pagoda.runtime.core.core_proc",
    ],
    "worker": [
        "pagoda.runtime.engine",
        "pagoda.runtime.entrypoints",
        "pagoda.runtime.executor",
        "pagoda.runtime.core.scheduler",
        "pagoda.runtime.core.engine_core",
        "pagoda.runtime.core.core_proc",
    ],
    # Speculative decoding runs in the worker (its config is also read by
    # the scheduler): the worker's rules.
    "spec_decode": [
        "pagoda.runtime.engine",
        "pagoda.runtime.entrypoints",
        "pagoda.runtime.executor",
        "pagoda.runtime.core.scheduler",
        "pagoda.runtime.core.engine_core",
        "pagoda.runtime.core.core_proc",
    ],
    "model_config.py": ["pagoda.runtime.model_loader"],
}


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("part", list(FORBIDDEN))
def test_imports_run_one_way(part):
    target = RUNTIME / part
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    assert files
    bad = [
        f"{path.relative_to(RUNTIME)} imports {name}"
        for path in files
        for name in imports_of(path)
        if any(name == p or name.startswith(p + ".") for p in FORBIDDEN[part])
    ]
    assert not bad, "\n".join(bad)
