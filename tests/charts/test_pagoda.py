"""The Helm chart, checked with the real helm binary and the Kubernetes schemas."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pagoda.operator import crd
from pagoda.operator.cli import parse_args
from pagoda.operator.config import OperatorConfig

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pagoda"
K8S_VERSION = "1.30"

NAMESPACED = {"watchNamespaces": ["team-a", "team-b"], "peering": {"enabled": True, "name": "llm"}}
NON_DEFAULT: dict[str, Any] = {
    "watchNamespaces": ["team-a"],
    "peering": {"enabled": False},
    "crds": {"enabled": False},
    "metrics": {"enabled": False},
    "serviceAccount": {"create": False, "name": "existing"},
    "image": {"repository": "my.registry/pagoda-operator", "tag": "dev", "pullPolicy": "Always"},
    "runtime": {"image": {"repository": "my.registry/pagoda-runtime", "tag": "dev"}},
    "imagePullSecrets": [{"name": "regcred"}],
    "profiles": {"tiny": {"cpu": 1, "memory": "2Gi"}},
    "operator": {"resyncSeconds": 10, "logFormat": "plain", "verbose": True},
    "nodeSelector": {"pool": "system"},
    "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"team": "ml-platform"},
}


def run_helm(
    helm: Path, *args: str, values: dict[str, Any] | None = None, tmp: Path
) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm), *args]
    if values is not None:
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["--values", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def template(
    helm: Path,
    tmp: Path,
    values: dict[str, Any] | None = None,
    include_crds: bool = False,
    chart: Path = CHART,
) -> list[dict[str, Any]]:
    flags = ["--include-crds"] if include_crds else []
    result = run_helm(
        helm,
        "template",
        "pagoda",
        str(chart),
        "--namespace",
        "pagoda-system",
        *flags,
        values=values,
        tmp=tmp,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def validate(obj: dict[str, Any], crds: dict[str, dict[str, Any]]) -> None:
    """Built-in kinds against the Kubernetes schemas; custom kinds against their CRD."""
    group = obj["apiVersion"].split("/")[0]
    if group == "monitoring.coreos.com":
        # No published schema here: the fields a PodMonitor cannot do without.
        assert obj["kind"] == "PodMonitor" and obj["spec"]["selector"]["matchLabels"]
        assert all(e["port"] and e["path"] for e in obj["spec"]["podMetricsEndpoints"])
    elif group in ("kopf.dev", "pagoda.dev"):
        plural = obj["kind"].lower() + "s"
        definition = crds[f"{plural}.{group}"]
        schema = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.Draft4Validator(schema).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "values", [None, NAMESPACED, NON_DEFAULT], ids=["default", "namespaced", "non-default"]
)
def test_lint_passes(helm: Path, tmp_path: Path, values: dict[str, Any] | None) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), values=values, tmp=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "values",
    [None, NAMESPACED, NON_DEFAULT, {"monitoring": {"podMonitor": {"enabled": True}}}],
    ids=["default", "namespaced", "non-default", "pod-monitor"],
)
def test_every_rendered_object_is_valid(
    helm: Path, tmp_path: Path, values: dict[str, Any] | None
) -> None:
    objects = template(helm, tmp_path, values, include_crds=True)
    crds = {
        o["metadata"]["name"]: o
        for o in template(helm, tmp_path, include_crds=True)
        if o["kind"] == "CustomResourceDefinition"
    }
    assert objects
    for obj in objects:
        validate(obj, crds)


def test_chart_installs_the_committed_crd(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path)
    (llms,) = [
        o
        for o in by_kind(objects, "CustomResourceDefinition")
        if o["spec"]["group"] == "pagoda.dev"
    ]
    assert llms == yaml.safe_load(crd.CRD_PATH.read_text())
    assert llms["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_crds_can_be_left_to_the_user(helm: Path, tmp_path: Path) -> None:
    assert not by_kind(
        template(helm, tmp_path, {"crds": {"enabled": False}}), "CustomResourceDefinition"
    )


def test_operator_runs_once_with_recreate(helm: Path, tmp_path: Path) -> None:
    (deployment,) = by_kind(template(helm, tmp_path), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/pagoda-llm/pagoda-operator:0.1.0"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(objects, "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_arguments_are_what_pagoda_operator_accepts(helm: Path, tmp_path: Path) -> None:
    default = parse_args(operator_container(template(helm, tmp_path))["args"])
    assert default.clusterwide and default.peering == "pagoda-operator" and not default.standalone
    assert default.metrics_port == 9090 and default.liveness == "http://0.0.0.0:8080/healthz"
    scoped = parse_args(operator_container(template(helm, tmp_path, NON_DEFAULT))["args"])
    assert scoped.namespaces == ("team-a",) and scoped.standalone
    assert scoped.metrics_port is None and scoped.verbose and scoped.log_format == "plain"


def test_environment_is_what_the_operator_reads(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path, NON_DEFAULT)
    env = {e["name"]: e["value"] for e in operator_container(objects)["env"]}
    (configmap,) = by_kind(objects, "ConfigMap")
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(configmap["data"]["profiles.yaml"])
    env["PAGODA_OPERATOR_PROFILES_FILE"] = str(profiles)
    config = OperatorConfig.from_env(env)
    assert config.runtime_image == "my.registry/pagoda-runtime:dev"
    assert config.resync_seconds == 10
    assert config.profiles["tiny"].memory == "2Gi"


def test_default_profiles_are_valid_for_the_operator(helm: Path, tmp_path: Path) -> None:
    (configmap,) = by_kind(template(helm, tmp_path), "ConfigMap")
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(configmap["data"]["profiles.yaml"])
    config = OperatorConfig.from_env({"PAGODA_OPERATOR_PROFILES_FILE": str(profiles)})
    assert config.profiles["nvidia-h100-80gb"].gpus == 1
    # One GPU per rank: the four-GPU profile is for tensorParallelSize 4.
    assert config.profiles["nvidia-h100-80gb-x4"].gpus == 4
    assert config.profiles["nvidia-h100-80gb-x4"].shared_memory == "32Gi"


def rules(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for role in by_kind(objects, kind) for rule in role["rules"]]


def test_rbac_is_least_privilege(helm: Path, tmp_path: Path) -> None:
    for values in (None, NAMESPACED):
        objects = template(helm, tmp_path, values)
        for rule in rules(objects, "ClusterRole") + rules(objects, "Role"):
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
            assert "*" not in rule["apiGroups"], rule
            if "secrets" in rule["resources"]:
                # The admin Secrets are read and applied; Secrets are never listed or watched.
                assert rule["verbs"] == ["get", "create", "patch"]


def test_cluster_wide_rbac_is_one_cluster_role(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path)
    assert not by_kind(objects, "Role")
    resources = {r for rule in rules(objects, "ClusterRole") for r in rule["resources"]}
    assert {
        "llmservices",
        "deployments",
        "clusterkopfpeerings",
        "customresourcedefinitions",
    } <= resources
    (peering,) = by_kind(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "pagoda-operator"


def test_namespaced_rbac_is_a_role_per_namespace(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path, NAMESPACED)
    assert sorted(r["metadata"]["namespace"] for r in by_kind(objects, "Role")) == [
        "team-a",
        "team-b",
    ]
    assert sorted(b["metadata"]["namespace"] for b in by_kind(objects, "RoleBinding")) == [
        "team-a",
        "team-b",
    ]
    cluster = {r for rule in rules(objects, "ClusterRole") for r in rule["resources"]}
    assert cluster == {
        "customresourcedefinitions",
        "namespaces",
    }  # nothing namespaced, cluster-wide
    assert [p["metadata"]["namespace"] for p in by_kind(objects, "KopfPeering")] == [
        "team-a",
        "team-b",
    ]
    args = operator_container(objects)["args"]
    assert "--namespace=team-a" in args and "--peering=llm" in args


@pytest.mark.parametrize(
    "values",
    [
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"operator": {"logFormat": "xml"}},
        {"operator": {"resyncSeconds": 0}},
        {"profiles": {"big": {"gpus": "four"}}},
        {"profiles": {"big": {"memory": "lots"}}},
        {"metrics": {"port": 8080}},
        {"replicaCount": 3},
        {"image": {"pullPolicy": "Sometimes", "repository": "x"}},
    ],
    ids=[
        "namespace",
        "log-format",
        "resync",
        "gpus",
        "memory",
        "port-clash",
        "unknown-key",
        "pull-policy",
    ],
)
def test_bad_values_are_rejected_by_the_schema(
    helm: Path, tmp_path: Path, values: dict[str, Any]
) -> None:
    result = run_helm(helm, "template", "pagoda", str(CHART), values=values, tmp=tmp_path)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr


def test_values_schema_is_a_valid_json_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((CHART / "values.yaml").read_text()))


def test_notes_tell_the_next_command(helm: Path, tmp_path: Path) -> None:
    result = run_helm(
        helm,
        "install",
        "pagoda",
        str(CHART),
        "--dry-run",
        "--namespace",
        "pagoda-system",
        tmp=tmp_path,
    )
    # A dry-run install needs no cluster only with --dry-run=client on newer helm.
    if result.returncode != 0:
        result = run_helm(
            helm,
            "install",
            "pagoda",
            str(CHART),
            "--dry-run=client",
            "--namespace",
            "pagoda-system",
            tmp=tmp_path,
        )
    assert result.returncode == 0, result.stderr
    assert "kubectl get llms" in result.stdout and "curl" in result.stdout


def hooks(objects: list[dict[str, Any]]) -> list[str]:
    return [
        f"{o['kind']} {o['metadata']['name']}"
        for o in objects
        if "helm.sh/hook" in (o["metadata"].get("annotations") or {})
    ]


@pytest.mark.parametrize("values", [None, NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_nothing_is_a_hook_so_uninstall_removes_everything_it_installed(
    helm: Path, tmp_path: Path, values: dict[str, Any] | None
) -> None:
    objects = template(helm, tmp_path, values, include_crds=True)
    assert hooks(objects) == []
    assert by_kind(objects, "ClusterKopfPeering") or by_kind(objects, "KopfPeering")


def test_kopfs_peering_crds_are_helm_crds_installed_first_and_never_collide(
    helm: Path, tmp_path: Path
) -> None:
    # Helm's crds/ folder: installed before the templates (the peering object
    # needs them), skipped when another kopf-based chart already installed
    # them, never deleted on uninstall.
    assert {p.name for p in (CHART / "crds").iterdir()} == {"kopf-peering.yaml"}
    names = {
        o["metadata"]["name"]
        for o in template(helm, tmp_path, include_crds=True)
        if o["kind"] == "CustomResourceDefinition"
    }
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= names
    templated = {
        o["metadata"]["name"] for o in by_kind(template(helm, tmp_path), "CustomResourceDefinition")
    }
    assert templated == {"llmservices.pagoda.dev"}


def test_the_chart_works_as_a_subchart_with_global_values(helm: Path, tmp_path: Path) -> None:
    parent = tmp_path / "platform"
    shutil.copytree(CHART, parent / "charts" / "pagoda")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: pagoda\n    version: 0.1.0\n"
    )
    values = {
        "global": {"imageRegistry": "registry.corp", "storageClass": "fast"},
        "pagoda": {"watchNamespaces": ["ml"], "metrics": {"enabled": False}},
    }
    objects = template(helm, tmp_path, values, chart=parent)
    (deployment,) = by_kind(objects, "Deployment")
    assert "--namespace=ml" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_pod_monitors_are_off_by_default_and_select_the_pods(helm: Path, tmp_path: Path) -> None:
    assert not by_kind(template(helm, tmp_path), "PodMonitor")
    on = {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    runtime, operator = by_kind(template(helm, tmp_path, on), "PodMonitor")
    assert runtime["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "pagoda-runtime"
    assert runtime["spec"]["namespaceSelector"] == {"any": True}
    assert runtime["spec"]["podMetricsEndpoints"][0] == {
        "port": "http",
        "path": "/metrics",
        "interval": "30s",
    }
    assert runtime["metadata"]["labels"]["release"] == "prom"
    assert operator["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    scoped = template(helm, tmp_path, {**on, "watchNamespaces": ["a", "b"]})
    assert by_kind(scoped, "PodMonitor")[0]["spec"]["namespaceSelector"] == {
        "matchNames": ["a", "b"]
    }


def test_the_documented_crd_adoption_gives_helm_ownership(tmp_path: Path) -> None:
    # docs/operator.md: a CRD first applied with kubectl is adopted by the release.
    from .conftest import extract_tools

    kubectl = extract_tools()["kubectl"]
    doc = (REPO / "docs" / "operator.md").read_text()
    install = re.search(r"helm install (\S+) charts/pagoda --namespace (\S+)", doc)
    assert install is not None
    release, namespace = install.groups()
    text = crd.CRD_PATH.read_text()
    for verb in ("annotate", "label"):
        (line,) = [
            line
            for line in doc.splitlines()
            if line.startswith(f"kubectl {verb} crd llmservices.pagoda.dev ")
        ]
        args = line.split()[4:]
        result = subprocess.run(
            [str(kubectl), verb, "--local", "-f", "-", "-o", "yaml", *args],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
            env={"KUBECONFIG": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, result.stderr
        text = result.stdout
    adopted = yaml.safe_load(text)["metadata"]
    assert adopted["annotations"]["meta.helm.sh/release-name"] == release
    assert adopted["annotations"]["meta.helm.sh/release-namespace"] == namespace
    assert adopted["labels"]["app.kubernetes.io/managed-by"] == "Helm"
