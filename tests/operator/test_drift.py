"""What a write did to a child, told from the API server's answer (pure)."""

from __future__ import annotations

import copy
from typing import Any

from pagoda.operator.drift import (
    APPLIED_HASH,
    Action,
    applied_hash,
    changed_fields,
    classify,
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
                            "env": [{"name": "LOG", "value": "info"}],
                        }
                    ]
                }
            },
        },
    }


def live_of(obj: dict[str, Any], version: str = "7") -> dict[str, Any]:
    """What the API server holds after an apply: our fields, plus its own and others'."""
    live = copy.deepcopy(stamp(obj))
    live["metadata"] |= {"uid": "x", "resourceVersion": version, "managedFields": []}
    container = live["spec"]["template"]["spec"]["containers"][0]
    container |= {"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/x"}
    live["status"] = {"replicas": 2}
    return live


def with_version(obj: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = version
    return out


def test_a_missing_child_was_created() -> None:
    assert classify(desired(), None, live_of(desired())).action is Action.CREATE


def test_an_apply_that_changed_nothing_did_nothing() -> None:
    live = live_of(desired())
    assert classify(desired(), live, live).action is Action.NONE


def test_a_new_spec_is_an_update() -> None:
    changed = desired()
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "img:2"
    assert classify(changed, live_of(desired()), live_of(changed, "8")).action is Action.UPDATE


def test_a_field_we_stop_setting_is_an_update_too() -> None:
    fewer = desired()
    del fewer["metadata"]["labels"]
    assert classify(fewer, live_of(desired()), live_of(fewer, "8")).action is Action.UPDATE


def test_a_hand_edit_of_our_field_is_a_repair_naming_the_field() -> None:
    before = live_of(desired())
    before["spec"]["replicas"] = 9
    plan = classify(desired(), before, live_of(desired(), "8"))
    assert plan.action is Action.REPAIR and plan.drifted == ("spec.replicas",)


def test_a_hand_edit_inside_a_named_list_item_is_named() -> None:
    before = live_of(desired())
    before["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    plan = classify(desired(), before, live_of(desired(), "8"))
    assert plan.drifted == ("spec.template.spec.containers[runtime].image",)


def test_another_managers_list_entry_is_not_drift() -> None:
    # `kubectl set env` added EXTRA; a force-apply leaves it (another manager
    # owns it), so the object is the same before and after: nothing happened.
    live = live_of(desired())
    live["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "EXTRA", "value": "1"})
    assert classify(desired(), live, live).action is Action.NONE


def test_a_concurrent_change_of_a_field_we_do_not_render_is_not_drift() -> None:
    # The Deployment controller wrote the status between our read and our
    # apply: the version moved, but none of our fields did.
    before = live_of(desired())
    after = with_version(before, "8")
    after["status"] = {"replicas": 2, "readyReplicas": 2}
    assert classify(desired(), before, after).action is Action.NONE


def test_a_deleted_hash_annotation_is_an_update() -> None:
    live = live_of(desired())
    del live["metadata"]["annotations"][APPLIED_HASH]
    assert classify(desired(), live, live_of(desired(), "8")).action is Action.UPDATE


def test_the_hash_ignores_its_own_annotation() -> None:
    assert applied_hash(stamp(desired())) == applied_hash(desired())


def test_changed_fields_match_named_items_by_name_not_position() -> None:
    want = {"env": [{"name": "A", "value": "1"}]}
    before = {"env": [{"name": "X", "value": "0"}, {"name": "A", "value": "2"}]}
    after = {"env": [{"name": "X", "value": "0"}, {"name": "A", "value": "1"}]}
    assert changed_fields(want, before, after) == ["env[A].value"]
    assert changed_fields(want, after, after) == []
