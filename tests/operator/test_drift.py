"""When a child needs a write: the applied hash and the subset check."""

from __future__ import annotations

import copy
from typing import Any

from pagoda.operator.drift import (
    APPLIED_HASH,
    Action,
    applied_hash,
    differences,
    parse_quantity,
    plan,
    stamp,
)


def desired() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "ml", "labels": {"a": "1"}},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "img:1",
                            "resources": {"requests": {"cpu": "500m", "nvidia.com/gpu": 1}},
                        }
                    ]
                }
            },
        },
    }


def live_of(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns after applying: our fields, plus defaults and its own."""
    live = copy.deepcopy(stamp(obj))
    live["metadata"] |= {"uid": "x", "resourceVersion": "7", "managedFields": []}
    live["metadata"]["labels"]["added-by-someone"] = "x"
    container = live["spec"]["template"]["spec"]["containers"][0]
    container |= {"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/x"}
    container["resources"]["requests"] = {"cpu": "0.5", "nvidia.com/gpu": "1"}
    live["status"] = {"replicas": 2}
    return live


def test_missing_child_is_created() -> None:
    assert plan(desired(), None).action is Action.CREATE


def test_unchanged_child_needs_no_write_despite_server_defaults() -> None:
    assert plan(desired(), live_of(desired())).action is Action.NONE


def test_spec_change_is_an_update() -> None:
    live = live_of(desired())
    changed = desired()
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "img:2"
    assert plan(changed, live).action is Action.UPDATE


def test_a_field_we_stop_setting_is_an_update_too() -> None:
    live = live_of(desired())
    fewer = desired()
    del fewer["metadata"]["labels"]
    assert plan(fewer, live).action is Action.UPDATE


def test_hand_edit_of_our_field_is_a_repair_naming_the_field() -> None:
    live = live_of(desired())
    live["spec"]["replicas"] = 9
    result = plan(desired(), live)
    assert result.action is Action.REPAIR and result.drifted == ("spec.replicas",)


def test_hand_edit_of_a_list_element_is_found() -> None:
    live = live_of(desired())
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    assert plan(desired(), live).drifted == ("spec.template.spec.containers[0].image",)


def test_deleted_annotation_hash_means_update() -> None:
    live = live_of(desired())
    del live["metadata"]["annotations"][APPLIED_HASH]
    assert plan(desired(), live).action is Action.UPDATE


def test_hash_ignores_its_own_annotation() -> None:
    assert applied_hash(stamp(desired())) == applied_hash(desired())


def test_quantities_compare_by_value_only_where_they_are_quantities() -> None:
    assert differences({"requests": {"memory": "1Gi"}}, {"requests": {"memory": "1024Mi"}}) == []
    assert differences({"requests": {"cpu": "1"}}, {"requests": {"cpu": "1000m"}}) == []
    assert differences({"requests": {"cpu": "2"}}, {"requests": {"cpu": "1"}}) == ["requests.cpu"]
    assert differences({"image": "1"}, {"image": "1.0"}) == ["image"]


def test_empty_desired_values_match_absent_live_ones() -> None:
    assert differences({"a": {}, "b": [], "c": 1}, {"c": 1}) == []
    assert differences({"a": {"x": 1}}, {}) == ["a"]


def test_parse_quantity() -> None:
    assert parse_quantity("16Gi") == 16 * 2**30
    assert parse_quantity("500m") == parse_quantity("0.5")
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("lots") is None
