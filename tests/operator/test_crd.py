"""The CRD is generated from the model, committed twice, and must never drift."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import yaml
from pagoda.operator import crd


def test_committed_crd_is_the_generated_one() -> None:
    assert crd.CRD_PATH.read_text() == crd.render_yaml(), (
        "crds/ is stale: run `python -m pagoda.operator.crd`"
    )


def test_chart_installs_the_same_bytes_behind_its_guard() -> None:
    text = crd.CHART_CRD_PATH.read_text()
    assert text == crd.render_chart_template()
    inner = text.removeprefix(crd.CHART_GUARD_OPEN).removesuffix(crd.CHART_GUARD_CLOSE)
    assert inner == crd.CRD_PATH.read_text()


def test_check_mode_reports_drift(tmp_path: Any, monkeypatch: Any) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text("# edited by hand\n")
    monkeypatch.setattr(crd, "CRD_PATH", stale)
    monkeypatch.setattr(crd, "CHART_CRD_PATH", tmp_path / "missing.yaml")
    monkeypatch.setattr(crd, "REPO", tmp_path)
    assert crd.main(["--check"]) == 1
    assert stale.read_text() == "# edited by hand\n"  # --check never writes
    assert crd.main([]) == 0 and crd.main(["--check"]) == 0


def test_crd_is_a_valid_customresourcedefinition() -> None:
    doc = yaml.safe_load(crd.CRD_PATH.read_text())
    kubernetes_validate.validate(doc, "1.30", strict=True)


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        nodes += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        nodes += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += _walk(schema["additionalProperties"], f"{path}{{}}")
    return nodes


def test_schema_is_structural() -> None:
    root = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root):
        # Every node has a type, or is one of the two typeless forms allowed.
        typeless = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert "type" in node or typeless, path
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        if node.get("type") == "object" and "properties" in node:
            assert "additionalProperties" not in node, path
        if "default" in node:
            assert node["default"] is not None, path


def test_subresources_printer_columns_and_names() -> None:
    spec = crd.build()["spec"]
    version = spec["versions"][0]
    assert spec["names"]["shortNames"] == ["llms"] and spec["scope"] == "Namespaced"
    scale = version["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model"
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Desired"] == ".spec.replicas"
    assert columns["Current"] == ".status.replicas"  # desired and current, as for Deployments
    assert columns["Queue"] == ".status.autoscaling.queueDepth"  # with -o wide
    assert columns["Endpoint"] == ".status.endpoint"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_status_has_only_fields_the_operator_writes() -> None:
    status = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    props = status["status"]["properties"]
    written = {
        "observedGeneration",
        "replicas",
        "readyReplicas",
        "updatedReplicas",
        "selector",
        "endpoint",
        "conditions",
        "autoscaling",  # the autoscaler loop (operator/autoscaler.py)
        "adapters",  # the adapter loop (operator/adapters.py)
    }
    assert set(props) == written
    conditions = props["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert set(conditions["items"]["required"]) >= {"type", "status", "reason"}


def test_nested_objects_default_to_empty_so_inner_defaults_apply() -> None:
    spec = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for name in ("engine", "service", "rollout", "drain", "resources", "scheduling"):
        assert spec["properties"][name]["default"] == {}, name
    assert spec["required"] == ["model"]


def test_every_cel_rule_is_estimated_well_under_the_api_servers_cost_limit() -> None:
    root = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    costs = crd.rule_costs(root)
    assert len(costs) >= 15  # every rule of the CRD was sized
    for rule, cost in costs.items():
        assert cost <= crd.PER_RULE_COST_LIMIT // 20, (rule, cost)


def test_the_cost_estimate_sizes_unbounded_strings_to_the_whole_request() -> None:
    quantity = f"type(self) == string ? self.matches('{crd.m.QUANTITY_PATTERN}') : self >= 0"
    unbounded = crd.regex_cost(quantity, {"x-kubernetes-int-or-string": True})
    assert unbounded > crd.PER_RULE_COST_LIMIT * 0.9  # what a quantity without maxLength costs
    bounded = crd.regex_cost(quantity, {"x-kubernetes-int-or-string": True, "maxLength": 64})
    assert bounded < 1000
    listed = {"properties": {"args": {"maxItems": 8, "items": {"maxLength": 9}}}}
    # ceil(0.1 * (9 + 1)) * ceil(0.25 * (3 + 1)) per item, 8 items
    assert crd.regex_cost("self.args.all(a, a.matches('^x$'))", listed) == 8


def test_no_rule_ties_replicas_to_the_autoscaling_bounds() -> None:
    # The rules run on every write, /scale included: one on replicas against
    # [minReplicas, maxReplicas] refuses a GitOps change that lowers
    # maxReplicas below the live count. The operator clamps instead, as HPA does.
    spec = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for rule in spec.get("x-kubernetes-validations", []):
        assert "self.replicas" not in rule["rule"], rule
