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

NAMESPACED = {"watchNamespaces": ["team-a", "team-b"], "leaderElection": {"leaseName": "llm"}}
NON_DEFAULT: dict[str, Any] = {
    "watchNamespaces": ["team-a"],
    "replicaCount": 1,
    "leaderElection": {"enabled": False},
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


NETWORK_POLICY: dict[str, Any] = {
    "watchNamespaces": ["team-a", "team-b"],
    "networkPolicy": {
        "enabled": True,
        "gateway": {"enabled": True, "namespaces": ["gateway"]},
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "openaiFrom": [{"namespaceSelector": {"matchLabels": {"pagoda.dev/clients": "true"}}}],
    },
}


@pytest.mark.parametrize(
    "values",
    [
        None,
        NAMESPACED,
        NON_DEFAULT,
        {"monitoring": {"podMonitor": {"enabled": True}}},
        NETWORK_POLICY,
    ],
    ids=["default", "namespaced", "non-default", "pod-monitor", "network-policy"],
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


def test_two_replicas_elect_a_leader_and_roll_out_without_a_gap(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path)
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    # New pods come up as standbys before an old one (maybe the leader) goes.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/pagoda-llm/pagoda-operator:0.1.0"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (pdb,) = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }


def test_one_replica_without_the_lease_is_recreated_and_has_no_pdb(
    helm: Path, tmp_path: Path
) -> None:
    objects = template(helm, tmp_path, NON_DEFAULT)
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "topologySpreadConstraints" not in deployment["spec"]["template"]["spec"]
    # A PDB that one pod cannot satisfy would block every node drain.
    assert not by_kind(objects, "PodDisruptionBudget")
    assert not [r for r in by_kind(objects, "Role") if "leader-election" in r["metadata"]["name"]]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"leaderElection": {"enabled": False}}, "replicaCount > 1 needs leaderElection"),
        ({"podDisruptionBudget": {"minAvailable": 2}}, "minAvailable must be below replicaCount"),
        ({"networkPolicy": {"enabled": True}}, "networkPolicy.enabled needs"),
    ],
    ids=["replicas-without-lease", "pdb-blocks-drains", "policy-without-namespaces"],
)
def test_values_that_cannot_work_fail_the_render(
    helm: Path, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    result = run_helm(helm, "template", "pagoda", str(CHART), values=values, tmp=tmp_path)
    assert result.returncode != 0 and message in result.stderr


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(objects, "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_arguments_are_what_pagoda_operator_accepts(helm: Path, tmp_path: Path) -> None:
    default = parse_args(operator_container(template(helm, tmp_path))["args"])
    assert default.clusterwide and not default.standalone
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


def test_leader_election_environment_is_what_the_operator_reads(helm: Path, tmp_path: Path) -> None:
    values = {"leaderElection": {"leaseName": "llm", "leaseDurationSeconds": 30}}
    env: dict[str, str] = {}
    for entry in operator_container(template(helm, tmp_path, values))["env"]:
        if "valueFrom" in entry:
            # The downward API: the pod's own name and namespace.
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            env[entry["name"]] = {"metadata.name": "pagoda-7d9c-x2x4q", "metadata.namespace": "ns"}[
                field
            ]
        else:
            env[entry["name"]] = entry["value"]
    assert env.pop("POD_NAME") == "pagoda-7d9c-x2x4q"
    env.pop("PAGODA_OPERATOR_PROFILES_FILE")  # read in the test above
    config = OperatorConfig.from_env(env)
    assert (config.lease_name, config.lease_namespace) == ("llm", "ns")
    timing = config.lease_timing()
    assert (timing.lease_duration, timing.renew_deadline, timing.retry_period) == (30, 10, 2)


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


def leader_election_role(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-election")]
    return role


def test_cluster_wide_rbac_is_one_cluster_role_and_the_lease_role(
    helm: Path, tmp_path: Path
) -> None:
    objects = template(helm, tmp_path)
    resources = {r for rule in rules(objects, "ClusterRole") for r in rule["resources"]}
    assert {"llmservices", "deployments", "customresourcedefinitions"} <= resources
    assert not {"clusterkopfpeerings", "kopfpeerings", "leases"} & resources
    (role,) = by_kind(objects, "Role")
    assert role == leader_election_role(objects)


def test_the_lease_is_granted_in_the_release_namespace_only(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path, NAMESPACED)
    role = leader_election_role(objects)
    assert role["metadata"]["namespace"] == "pagoda-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["llm"],
            "verbs": ["get", "update"],
        },
    ]
    (binding,) = [
        b
        for b in by_kind(objects, "RoleBinding")
        if b["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["metadata"]["namespace"] == "pagoda-system"
    assert binding["subjects"][0]["name"] == "pagoda"


def test_namespaced_rbac_is_a_role_per_namespace(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path, NAMESPACED)
    served = [r for r in by_kind(objects, "Role") if r != leader_election_role(objects)]
    assert sorted(r["metadata"]["namespace"] for r in served) == ["team-a", "team-b"]
    bindings = [b for b in by_kind(objects, "RoleBinding") if b["roleRef"]["name"] == "pagoda"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    cluster = {r for rule in rules(objects, "ClusterRole") for r in rule["resources"]}
    assert cluster == {
        "customresourcedefinitions",
        "namespaces",
    }  # nothing namespaced, cluster-wide
    args = operator_container(objects)["args"]
    assert "--namespace=team-a" in args and "--standalone" not in args


@pytest.mark.parametrize(
    "values",
    [
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"operator": {"logFormat": "xml"}},
        {"operator": {"resyncSeconds": 0}},
        {"profiles": {"big": {"gpus": "four"}}},
        {"profiles": {"big": {"memory": "lots"}}},
        {"metrics": {"port": 8080}},
        {"replicas": 3},
        {"image": {"pullPolicy": "Sometimes", "repository": "x"}},
        {"replicaCount": 0},
        {"leaderElection": {"leaseDurationSeconds": 0}},
        {"networkPolicy": {"ports": {"admin": "Admin_Port"}}},
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
        "no-replicas",
        "lease-duration",
        "port-name",
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


def test_kopfs_peering_is_not_installed(helm: Path, tmp_path: Path) -> None:
    # kopf's peering pauses every peer of equal priority: the replicas elect
    # their leader on a Lease instead, and the chart carries no peering CRDs.
    assert not (CHART / "crds").exists()
    for values in (None, NAMESPACED):
        objects = template(helm, tmp_path, values, include_crds=True)
        assert not [o for o in objects if o["apiVersion"].startswith("kopf.dev/")]
        names = {o["metadata"]["name"] for o in by_kind(objects, "CustomResourceDefinition")}
        assert names == {"llmservices.pagoda.dev"}


def network_policies(values: dict[str, Any], helm: Path, tmp_path: Path) -> list[dict[str, Any]]:
    return by_kind(template(helm, tmp_path, values), "NetworkPolicy")


def test_no_network_policy_unless_asked(helm: Path, tmp_path: Path) -> None:
    assert not network_policies({}, helm, tmp_path)
    assert not network_policies(NAMESPACED, helm, tmp_path)


def test_network_policy_lets_only_the_operator_and_gateway_reach_admin_and_metrics(
    helm: Path, tmp_path: Path
) -> None:
    policies = network_policies(NETWORK_POLICY, helm, tmp_path)
    assert [p["metadata"]["namespace"] for p in policies] == ["team-a", "team-b"]
    spec = policies[0]["spec"]
    assert spec["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "pagoda-runtime",
        "app.kubernetes.io/managed-by": "pagoda-operator",
    }
    assert spec["policyTypes"] == ["Ingress"]
    control, openai = spec["ingress"]
    # The admin port by name (8001 in the runtime pods); /metrics is on the OpenAI port.
    assert control["ports"] == [
        {"port": "admin", "protocol": "TCP"},
        {"port": "http", "protocol": "TCP"},
    ]
    operator, gateway, monitoring = control["from"]
    assert operator == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pagoda-system"}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "pagoda-operator",
                "app.kubernetes.io/instance": "pagoda",
            }
        },
    }
    (deployment,) = by_kind(template(helm, tmp_path, NETWORK_POLICY), "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert operator["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert gateway == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "pagoda-gateway"}},
    }
    assert monitoring == NETWORK_POLICY["networkPolicy"]["metricsFrom"][0]
    assert openai == {
        "ports": [{"port": "http", "protocol": "TCP"}],
        "from": NETWORK_POLICY["networkPolicy"]["openaiFrom"],
    }


def test_network_policy_leaves_the_openai_port_open_by_default(helm: Path, tmp_path: Path) -> None:
    values = {"watchNamespaces": ["team-a"], "networkPolicy": {"enabled": True}}
    (policy,) = network_policies(values, helm, tmp_path)
    control, openai = policy["spec"]["ingress"]
    assert len(control["from"]) == 1  # the operator only: no gateway, no scraper
    assert openai == {"ports": [{"port": "http", "protocol": "TCP"}]}  # no `from`: everyone


def test_network_policy_with_metrics_on_their_own_port_gives_the_gateway_the_openai_port(
    helm: Path, tmp_path: Path
) -> None:
    values = {
        "networkPolicy": {
            "enabled": True,
            "namespaces": ["llm"],
            "ports": {"openai": "http", "admin": "admin", "metrics": 8002},
            "gateway": {"enabled": True},
        },
    }
    (policy,) = network_policies(values, helm, tmp_path)
    control, _ = policy["spec"]["ingress"]
    assert [p["port"] for p in control["ports"]] == ["admin", 8002, "http"]
    assert control["from"][1] == {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "pagoda-gateway"}},
    }


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
