"""The ready-made LLMServices in examples/: admitted by the CRD, served by the operator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pagoda.operator.admission import check
from pagoda.operator.config import OperatorConfig, parse_profiles
from pagoda.operator.llmservice import parse
from pagoda.operator.render import render_children

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
PROFILES = parse_profiles(
    yaml.safe_load((REPO / "charts/pagoda/values.yaml").read_text())["profiles"]
)


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_three_promised_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"cpu-demo.yaml", "llama-3-8b.yaml", "llama-3-70b-tp4.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_admitted_by_the_crd_schema(path: Path) -> None:
    for doc in docs(path):
        if doc["kind"] != "LLMService":
            kubernetes_validate.validate(doc, "1.30", strict=True)
        else:
            assert check(doc) == [], path.name


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_renders_valid_children(path: Path) -> None:
    config = OperatorConfig(profiles=PROFILES)
    for doc in docs(path):
        if doc["kind"] != "LLMService":
            continue
        doc["metadata"] |= {"namespace": "demo", "uid": "00000000-0000-0000-0000-000000000000"}
        children = render_children(parse(doc, config), config, "key")
        for child in children.present:
            kubernetes_validate.validate(child, "1.30", strict=True)


def test_cpu_demo_needs_no_gpu_and_no_download() -> None:
    (demo,) = docs(REPO / "examples" / "cpu-demo.yaml")
    llms = parse({**demo, "metadata": {**demo["metadata"], "namespace": "demo"}}, OperatorConfig())
    assert llms.resources.gpus == 0 and llms.spec.model == "smollm2-135m-instruct"


def test_seventy_b_shards_over_four_gpus_of_one_pod() -> None:
    (big,) = docs(REPO / "examples" / "llama-3-70b-tp4.yaml")
    llms = parse({**big, "metadata": {**big["metadata"], "namespace": "demo"}}, OperatorConfig())
    assert llms.spec.tensor_parallel_size == 4 and llms.resources.gpus == 4
    (deployment,) = [
        c
        for c in render_children(llms, OperatorConfig(), "key").present
        if c["kind"] == "Deployment"
    ]
    (runtime,) = deployment["spec"]["template"]["spec"]["containers"]
    assert runtime["args"][runtime["args"].index("--tensor-parallel-size") + 1] == "4"
    assert runtime["resources"]["limits"]["nvidia.com/gpu"] == 4
    (shm,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm"]
    # The shared memory counts against the pod's memory limit: it must fit.
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert runtime["resources"]["limits"]["memory"] == "384Gi"


def test_the_four_gpu_profile_serves_the_seventy_b_example() -> None:
    (big,) = docs(REPO / "examples" / "llama-3-70b-tp4.yaml")
    spec = {**big["spec"], "resources": {"profile": "nvidia-h100-80gb-x4"}}
    doc = {**big, "metadata": {**big["metadata"], "namespace": "demo"}, "spec": spec}
    assert check(doc) == []
    llms = parse(doc, OperatorConfig(profiles=PROFILES))
    assert llms.resources.gpus == 4 == llms.spec.tensor_parallel_size
    assert llms.resources.gpu_type == "NVIDIA-H100-80GB-HBM3"
