"""kubesim's API server refuses and behaves where kube-apiserver does.

Optimistic concurrency (409 on a stale resourceVersion), server-assigned uids,
the real CRD's structural schema and CEL rules on every write (the object,
/status and /scale), server-side apply's list-map keys and its refusal of
duplicate keys, watches with versions, bookmarks, 410 Gone and timeouts, and
label and field selectors evaluated on the server.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from kubesim import cel, fields
from kubesim.apiserver import APPLY, JSON_PATCH, MERGE, STRATEGIC, ApiServer
from kubesim.crd import CustomResource
from kubesim.resources import CRDS, declare
from kubesim.testing import (
    CONFIGMAPS,
    DEPLOYMENTS,
    LLMS,
    NS,
    PODS,
    create,
    llmservice,
    obj,
    patch,
    path_of,
)
from kubesim.watches import EventLog, Expired
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import InvalidSpec, parse


@pytest.fixture()
def api(kmock: ApiServer) -> ApiServer:
    declare(kmock)
    return kmock


async def send(
    api: ApiServer,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = MERGE,
    **params: str,
) -> tuple[int, Any, list[str]]:
    """One request: (status, JSON body, Warning headers)."""
    headers = {"Content-Type": content_type}
    async with api.request(method, path, json=body, headers=headers, params=params) as response:
        return response.status, await response.json(), response.headers.getall("Warning", [])


def configmap(name: str = "c", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"a": "1"},
    }


def stale(body: dict[str, Any], version: str) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body.setdefault("metadata", {})["resourceVersion"] = version
    return body


# --- 1. resourceVersion conflicts and server-assigned identity


async def test_every_kind_of_write_with_a_stale_resource_version_conflicts(api: ApiServer) -> None:
    first = await create(api, configmap())
    old = first["metadata"]["resourceVersion"]
    path = path_of(CONFIGMAPS, NS, "c")
    await patch(api, path, {"data": {"a": "2"}})  # the stored version moves on
    writes = [
        ("PUT", stale(configmap(), old), MERGE),
        ("PATCH", stale({"data": {"a": "3"}}, old), MERGE),
        ("PATCH", stale({"data": {"a": "3"}}, old), STRATEGIC),
        (
            "PATCH",
            [{"op": "replace", "path": "/metadata/resourceVersion", "value": old}],
            JSON_PATCH,
        ),
        ("PATCH", stale(configmap(), old), APPLY),
    ]
    for method, body, content_type in writes:
        status, answer, _ = await send(api, method, path, body, content_type, fieldManager="t")
        assert status == 409 and answer["reason"] == "Conflict", (content_type, answer)
        assert answer["message"] == (
            'Operation cannot be fulfilled on configmaps "c": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
    assert obj(api, CONFIGMAPS, "c")["data"] == {"a": "2"}
    current = obj(api, CONFIGMAPS, "c")["metadata"]["resourceVersion"]
    status, answer, _ = await send(
        api, "PUT", path, stale({**configmap(), "data": {"a": "4"}}, current)
    )
    assert status == 200 and answer["data"] == {"a": "4"}
    status, answer, _ = await send(api, "PUT", path, {**configmap(), "data": {"a": "5"}})
    assert status == 200, "an update without a resourceVersion is unconditional"


async def test_status_and_scale_writes_with_a_stale_version_conflict(api: ApiServer) -> None:
    created = await create(api, llmservice(replicas=1))
    old = created["metadata"]["resourceVersion"]
    path = path_of(LLMS, NS, "chat")
    await patch(api, path + "/status", {"status": {"replicas": 1}})
    status, answer, _ = await send(api, "PATCH", path + "/status", stale({"status": {}}, old))
    assert status == 409 and "llmservices.pagoda.dev" in answer["message"]
    scale = {"metadata": {"name": "chat", "resourceVersion": old}, "spec": {"replicas": 2}}
    status, answer, _ = await send(api, "PUT", path + "/scale", scale)
    assert status == 409 and answer["reason"] == "Conflict"
    status, answer, _ = await send(api, "PATCH", path + "/scale", scale)
    assert status == 409
    live = obj(api, LLMS, "chat")["metadata"]["resourceVersion"]
    status, answer, _ = await send(api, "PUT", path + "/scale", stale(scale, live))
    assert status == 200 and answer["spec"]["replicas"] == 2
    assert answer["metadata"]["resourceVersion"] != live


async def test_the_server_assigns_uids_and_refuses_a_version_on_create(api: ApiServer) -> None:
    body = configmap()
    body["metadata"]["uid"] = "mine"
    created = await create(api, body)
    assert created["metadata"]["uid"] not in ("mine", None)
    await send(api, "DELETE", path_of(CONFIGMAPS, NS, "c"))
    again = await create(api, body)
    assert again["metadata"]["uid"] != created["metadata"]["uid"]
    status, answer, _ = await send(api, "POST", path_of(CONFIGMAPS, NS), stale(configmap("d"), "7"))
    assert status == 500 and "resourceVersion should not be set" in answer["message"]


async def test_a_deletion_is_a_new_version(api: ApiServer) -> None:
    created = await create(api, configmap())
    status, _, _ = await send(api, "DELETE", path_of(CONFIGMAPS, NS, "c"))
    assert status == 200
    assert int(api.history.last) > int(created["metadata"]["resourceVersion"])


# --- 2. the CRD's structural schema: pruning, defaulting, validation


async def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(
    api: ApiServer,
) -> None:
    body = llmservice(surprise=True)
    status, answer, warnings = await send(api, "POST", path_of(LLMS, NS), body)
    assert status == 201 and "surprise" not in answer["spec"]
    assert warnings == ['299 - "unknown field \\"spec.surprise\\""']
    body["metadata"]["name"] = "strict"
    status, answer, _ = await send(api, "POST", path_of(LLMS, NS), body, fieldValidation="Strict")
    assert status == 400 and 'unknown field "spec.surprise"' in answer["message"]


async def test_defaults_fill_objects_then_their_fields(api: ApiServer) -> None:
    created = await create(api, llmservice(autoscaling={"maxReplicas": 3}))
    spec = created["spec"]
    assert spec["replicas"] == 1 and spec["service"] == {"type": "ClusterIP", "port": 80}
    assert spec["autoscaling"]["scaleDown"] == {"stabilizationSeconds": 300}  # {} then its default
    assert spec["drain"] == {"timeoutSeconds": 60, "preStopSeconds": 5}
    assert "status" not in created, "status is set only through /status"


async def test_schema_violations_are_422_with_the_api_servers_causes(api: ApiServer) -> None:
    body = llmservice(replicas="two", imagePullPolicy="Sometimes")
    body["spec"].pop("model")
    status, answer, _ = await send(api, "POST", path_of(LLMS, NS), body)
    assert status == 422 and answer["reason"] == "Invalid"
    causes = {c["field"]: c for c in answer["details"]["causes"]}
    assert causes["spec.model"]["reason"] == "FieldValueRequired"
    assert causes["spec.replicas"]["reason"] == "FieldValueTypeInvalid"
    assert causes["spec.imagePullPolicy"]["message"] == (
        'Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never"'
    )
    assert answer["message"].startswith('LLMService.pagoda.dev "chat" is invalid: [')
    status, answer, _ = await send(api, "POST", path_of(LLMS, NS), llmservice(replicas=-1))
    assert status == 422
    assert answer["message"] == (
        'LLMService.pagoda.dev "chat" is invalid: spec.replicas: Invalid value: -1: '
        "spec.replicas in body should be greater than or equal to 0"
    )


async def test_a_list_map_of_the_crd_refuses_duplicate_keys(api: ApiServer) -> None:
    await create(api, llmservice())
    condition = {"type": "Ready", "status": "True", "reason": "R", "lastTransitionTime": "t"}
    status, answer, _ = await send(
        api, "PATCH", path_of(LLMS, NS, "chat") + "/status",
        {"status": {"conditions": [condition, condition]}},
    )  # fmt: skip
    assert status == 422
    assert answer["details"]["causes"][0] == {
        "reason": "FieldValueDuplicate",
        "message": 'Duplicate value: {"type":"Ready"}',
        "field": "status.conditions[1]",
    }


# --- 3. the CRD's CEL rules, on the object and its subresources


def _crd() -> CustomResource:
    return CustomResource.from_file(CRDS[0])


def _messages() -> dict[str, str]:
    return {entry["rule"]: entry["message"] for _, entry in cel.walk_rules(_crd().schema)}


# An LLMService that reaches every node of the schema that carries a rule.
EVERY_RULE = {
    "model": "smollm2-135m-instruct",
    "resources": {"gpus": 1, "cpu": "8", "memory": "16Gi", "sharedMemory": 1024},
    "engine": {"maxNumSeqs": 4, "maxNumBatchedTokens": 512, "extraArgs": ["--seed=1"]},
    "rollout": {"maxSurge": "25%", "maxUnavailable": 0},
    "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4},
    "adapters": [{"name": "sql", "source": "/loras/sql"}],
    "modelCache": {"claimName": "hf"},
}


def test_every_rule_of_the_real_crd_compiles_and_is_evaluated() -> None:
    crd = _crd()
    rules = [entry["rule"] for _, entry in cel.walk_rules(crd.schema)]
    assert len(rules) >= 18
    for rule in rules:
        cel.compile_rule(rule)  # raises if celpy cannot parse it
    evaluated: set[str] = set()
    admitted = crd.admit(llmservice(**EVERY_RULE), None)
    assert admitted.causes == []
    cel.evaluate(crd.schema, admitted.obj, None, evaluated)
    assert evaluated == set(rules)


# (spec, the field the API server names, a fragment of the rule's message)
RULE_CASES = [
    ({"resources": {"gpuType": "NVIDIA-H100"}}, "spec.resources.gpuType", "needs gpus > 0"),
    ({"resources": {"cpu": "8x"}}, "spec.resources.cpu", "must be a quantity"),
    ({"resources": {"memory": -1}}, "spec.resources.memory", "must be a quantity"),
    ({"resources": {"gpus": 4}}, "spec.resources.gpus", "resources.gpus must equal"),
    ({"engine": {"extraArgs": ["--port=1"]}}, "spec.engine.extraArgs", "must not repeat flags"),
    (
        {"engine": {"maxNumSeqs": 8, "maxNumBatchedTokens": 4}},
        "spec.engine.maxNumBatchedTokens",
        "at least",
    ),
    ({"rollout": {"maxSurge": "x"}}, "spec.rollout.maxSurge", "a count or a percentage"),
    ({"rollout": {"maxSurge": 0, "maxUnavailable": "0%"}}, "spec.rollout", "cannot both be zero"),
    (
        {"autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
        "spec.autoscaling.minReplicas",
        "must not exceed",
    ),
    ({"autoscaling": {"maxReplicas": 2, "mode": "keda"}}, "spec.autoscaling.keda", "serverAddress"),
    ({"modelCache": {"sizeLimit": "20Gi"}}, "spec.modelCache.sizeLimit", "it needs an hf://"),
    ({"modelCache": {}}, "spec.modelCache", "set exactly one"),
]


@pytest.mark.parametrize(("spec", "field", "message"), RULE_CASES)
async def test_a_broken_rule_is_a_422_with_its_message_and_the_model_agrees(
    api: ApiServer, spec: dict[str, Any], field: str, message: str
) -> None:
    body = llmservice(**spec)
    status, answer, _ = await send(api, "POST", path_of(LLMS, NS), body)
    assert status == 422, answer
    (cause,) = [c for c in answer["details"]["causes"] if c["field"] == field]
    assert message in cause["message"]
    assert cause["message"].split(": ", 2)[2] in _messages().values()  # Invalid value: "T": ...
    # The operator's pydantic twin refuses the same spec, naming the same field.
    with pytest.raises(InvalidSpec) as refused:
        parse(body, OperatorConfig())
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"adapters": [{"name": "a", "source": "/a"}, {"name": "a", "source": "/b"}]}, "adapters"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "env"),
        ({"imagePullSecrets": ["reg", "reg"]}, "imagePullSecrets"),
    ],
)
async def test_a_repeated_list_key_is_a_422_and_the_model_agrees(
    api: ApiServer, spec: dict[str, Any], field: str
) -> None:
    body = llmservice(**spec)
    status, answer, _ = await send(api, "POST", path_of(LLMS, NS), body)
    assert status == 422, answer
    (cause,) = answer["details"]["causes"]
    assert cause["field"] == f"spec.{field}[1]" and "Duplicate value" in cause["message"]
    with pytest.raises(InvalidSpec) as refused:
        parse(body, OperatorConfig())
    assert refused.value.field == f"spec.{field}"


async def test_the_name_rule_at_the_root_sees_metadata_name(api: ApiServer) -> None:
    status, answer, _ = await send(api, "POST", path_of(LLMS, NS), llmservice("Chat"))
    assert status == 422 and "must be a DNS label" in answer["message"]


async def test_scale_writes_validate_the_whole_object(api: ApiServer) -> None:
    """A /scale write changes spec.replicas, then the whole object is validated."""
    await create(api, llmservice(replicas=1))
    path = path_of(LLMS, NS, "chat") + "/scale"
    status, answer, _ = await send(api, "PATCH", path, {"spec": {"replicas": 2000}})
    assert status == 422
    assert answer["details"]["causes"][0]["field"] == "spec.replicas"
    status, answer, _ = await send(api, "PATCH", path, {"spec": {"replicas": 2}})
    assert status == 200 and obj(api, LLMS, "chat")["spec"]["replicas"] == 2


async def test_lowering_max_replicas_below_the_live_count_is_accepted(api: ApiServer) -> None:
    """A GitOps change of the bounds is never refused for the live count: the operator clamps."""
    await create(api, llmservice(replicas=3, autoscaling={"minReplicas": 1, "maxReplicas": 4}))
    path = path_of(LLMS, NS, "chat")
    status, answer, _ = await send(
        api, "PATCH", path, {"spec": {"autoscaling": {"maxReplicas": 2}}}
    )
    assert status == 200, answer
    status, answer, _ = await send(api, "PATCH", path + "/scale", {"spec": {"replicas": 4}})
    assert status == 200, answer  # kubectl scale past the bounds: the autoscaler clamps it


async def test_status_writes_are_validated_with_the_whole_object(api: ApiServer) -> None:
    await create(api, llmservice())
    path = path_of(LLMS, NS, "chat") + "/status"
    bad = {"status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}}
    status, answer, _ = await send(api, "PATCH", path, bad)
    assert status == 422
    fields_ = {c["field"] for c in answer["details"]["causes"]}
    assert {"status.conditions[0].status", "status.conditions[0].reason"} <= fields_


def test_transition_rules_run_only_on_updates_with_an_old_value() -> None:
    manifest = {
        "spec": {
            "group": "example.dev",
            "names": {"plural": "things", "kind": "Thing"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "size": {
                                            "type": "integer",
                                            "x-kubernetes-validations": [
                                                {
                                                    "rule": "self >= oldSelf",
                                                    "message": "no shrinking",
                                                }
                                            ],
                                        },
                                        "note": {"type": "string"},
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        }
    }
    crd = CustomResource.from_manifest(manifest)
    thing = {"metadata": {"name": "t"}, "spec": {"note": "a"}}
    assert crd.admit(thing, None).causes == []
    grown = {"metadata": {"name": "t"}, "spec": {"size": 2}}
    assert crd.admit(grown, thing).causes == [], "no old value: the transition rule is skipped"
    shrunk = {"metadata": {"name": "t"}, "spec": {"size": 1}}
    (cause,) = crd.admit(shrunk, grown).causes
    assert cause.field == "spec.size" and cause.message.endswith("no shrinking")


def test_number_fields_are_doubles_in_cel_even_when_written_as_integers() -> None:
    schema = {
        "type": "object",
        "properties": {"target": {"type": "number"}, "count": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "type(self.target) == double && type(self.count) == int"}
        ],
    }
    assert cel.evaluate(schema, {"target": 4, "count": 4}, None) == []


def test_an_unchanged_invalid_value_is_ratcheted_on_update() -> None:
    crd = _crd()
    old = crd.admit(llmservice(), None).obj
    old["spec"]["resources"] = {"cpu": "lots"}  # stored before a rule existed
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 2
    assert crd.admit(new, old).causes == []
    new["spec"]["resources"]["memory"] = "8Gi"
    assert crd.admit(new, old).causes == [], "a sibling changed, the invalid value did not"
    new["spec"]["resources"]["cpu"] = "more"
    assert [c.field for c in crd.admit(new, old).causes] == ["spec.resources.cpu"]


# --- 4. server-side apply: list-map keys and duplicate keys


def deployment(*env: str) -> dict[str, Any]:
    container = {"name": "app", "image": "img", "env": [{"name": n, "value": "1"} for n in env]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [container]}},
        },
    }


async def test_applying_duplicate_env_names_is_refused_as_the_api_server_does(
    api: ApiServer,
) -> None:
    path = path_of(DEPLOYMENTS, NS, "d")
    status, answer, _ = await send(
        api, "PATCH", path, deployment("HF_HOME", "HF_HOME"), APPLY, fieldManager="op"
    )
    assert status == 500
    assert answer["message"] == (
        f"failed to create typed patch object ({NS}/d; apps/v1, Kind=Deployment): "
        '.spec.template.spec.containers[name="app"].env: duplicate entries for key [name="HF_HOME"]'
    )
    assert api.get_object(DEPLOYMENTS, NS, "d") is None


async def test_a_create_or_update_with_duplicate_env_names_is_kept_with_a_warning(
    api: ApiServer,
) -> None:
    status, _, warnings = await send(api, "POST", path_of(DEPLOYMENTS, NS), deployment("A", "A"))
    assert status == 201
    assert warnings == [
        '299 - "spec.template.spec.containers[0].env[1]: hides previous definition of \\"A\\", '
        'which may be dropped when using apply"'
    ]
    env = obj(api, DEPLOYMENTS, "d")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["A", "A"]


async def test_list_map_keys_come_from_the_crd_schema(api: ApiServer) -> None:
    """engine.extraArgs is atomic (the CRD declares no keys), spec.env merges by name."""
    path = path_of(LLMS, NS, "chat")
    ours = llmservice(engine={"extraArgs": ["--a"]}, env=[{"name": "A", "value": "1"}])
    await patch(api, path, ours, APPLY, fieldManager="one", force="true")
    theirs = llmservice(engine={"extraArgs": ["--b"]}, env=[{"name": "B", "value": "2"}])
    await patch(api, path, theirs, APPLY, fieldManager="two", force="true")
    spec = obj(api, LLMS, "chat")["spec"]
    assert spec["engine"]["extraArgs"] == ["--b"]
    assert [e["name"] for e in spec["env"]] == ["A", "B"]
    dpath = path_of(DEPLOYMENTS, NS, "d")
    await patch(api, dpath, deployment("A"), APPLY, fieldManager="one", force="true")
    await patch(api, dpath, deployment("B"), APPLY, fieldManager="two", force="true")
    container = obj(api, DEPLOYMENTS, "d")["spec"]["template"]["spec"]["containers"][0]
    assert [e["name"] for e in container["env"]] == ["A", "B"]
    keys = api.custom_resources[next(iter(api.custom_resources))].list_keys
    assert keys(("status", "conditions"), [{"type": "Ready"}]) == ("type",)
    assert fields.duplicate_keys({"status": {"conditions": [{"type": "R"}] * 2}}, keys) == [
        '.status.conditions: duplicate entries for key [type="R"]'
    ]


async def test_a_custom_resource_takes_no_strategic_merge_patch(api: ApiServer) -> None:
    await create(api, llmservice())
    status, answer, _ = await send(
        api, "PATCH", path_of(LLMS, NS, "chat"), {"spec": {"replicas": 2}}, STRATEGIC
    )
    assert status == 415 and answer["reason"] == "UnsupportedMediaType"


# --- 5. watches


async def watch(api: ApiServer, path: str, limit: int | None = None, **params: str) -> list[Any]:
    """The events of a watch, until the server ends it or `limit` events came."""
    events: list[Any] = []

    async def read() -> None:
        async with api.get(path, params={"watch": "true", **params}) as response:
            assert response.status == 200, await response.text()
            async for line in response.content:
                if line.strip():
                    events.append(json.loads(line))
                if limit is not None and len(events) >= limit:
                    return

    await asyncio.wait_for(read(), 30)  # a bound against a hang, not a timing assertion
    return events


async def test_a_watch_resumes_after_its_version(api: ApiServer) -> None:
    first = await create(api, configmap("a"))
    await create(api, configmap("b"))
    await patch(api, path_of(CONFIGMAPS, NS, "a"), {"data": {"a": "2"}})
    since = first["metadata"]["resourceVersion"]
    events = await watch(api, path_of(CONFIGMAPS, NS), 2, resourceVersion=since)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
    ]


async def test_a_list_names_its_version_and_a_watch_from_it_sees_only_later_changes(
    api: ApiServer,
) -> None:
    await create(api, configmap("a"))
    status, listed, _ = await send(api, "GET", path_of(CONFIGMAPS, NS))
    version = listed["metadata"]["resourceVersion"]
    assert status == 200 and int(version) == api.history.last
    await send(api, "DELETE", path_of(CONFIGMAPS, NS, "a"))
    (event,) = await watch(api, path_of(CONFIGMAPS, NS), 1, resourceVersion=version)
    assert event["type"] == "DELETED" and int(event["object"]["metadata"]["resourceVersion"]) > int(
        version
    )


async def test_a_watch_from_a_compacted_version_gets_410_gone(api: ApiServer) -> None:
    first = await create(api, configmap("a"))
    await create(api, configmap("b"))
    api.history.compact()
    events = await watch(
        api, path_of(CONFIGMAPS, NS), resourceVersion=first["metadata"]["resourceVersion"]
    )
    (error,) = events
    assert error["type"] == "ERROR"
    assert error["object"]["code"] == 410 and error["object"]["reason"] == "Expired"
    assert error["object"]["message"].startswith("too old resource version:")


async def test_a_watch_ends_at_its_timeout_and_idle_watches_get_bookmarks(api: ApiServer) -> None:
    api.bookmark_seconds = 0.1
    await create(api, configmap("a"))
    version = str(api.history.last)
    events = await watch(
        api, path_of(CONFIGMAPS, NS), resourceVersion=version,
        allowWatchBookmarks="true", timeoutSeconds="1",
    )  # fmt: skip
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert events[0]["object"]["metadata"]["resourceVersion"] == version
    assert events[0]["object"]["kind"] == "ConfigMap"


async def test_initial_events_end_with_an_annotated_bookmark(api: ApiServer) -> None:
    await create(api, configmap("a"))
    events = await watch(
        api, path_of(CONFIGMAPS, NS), 2, sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true",
    )  # fmt: skip
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


# --- 6. label and field selectors


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("team=ml", ["a", "b"]),
        ("team==ml", ["a", "b"]),
        ("team!=ml", ["c", "d"]),
        ("team in (ml,web)", ["a", "b", "c"]),
        ("team notin (ml)", ["c", "d"]),
        ("tier", ["b"]),
        ("!team", ["d"]),
        ("team=ml,!tier", ["a"]),
        ("team=ml,tier in (gpu)", ["b"]),
    ],
)
async def test_label_selectors_of_every_form(
    api: ApiServer, selector: str, names: list[str]
) -> None:
    for name, labels in {
        "a": {"team": "ml"},
        "b": {"team": "ml", "tier": "gpu"},
        "c": {"team": "web"},
        "d": {},
    }.items():
        await create(api, configmap(name, **labels))
    status, listed, _ = await send(api, "GET", path_of(CONFIGMAPS, NS), labelSelector=selector)
    assert status == 200
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == names


async def test_field_selectors_and_what_the_server_refuses(api: ApiServer) -> None:
    for name, phase in (("p1", "Running"), ("p2", "Pending")):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}}
        await create(api, {**pod, "spec": {"nodeName": "n1"}, "status": {"phase": phase}})
    for selector, names in (
        ("status.phase=Running", ["p1"]),
        ("status.phase!=Running,spec.nodeName=n1", ["p2"]),
        ("metadata.name=p2", ["p2"]),
        (f"metadata.namespace={NS}", ["p1", "p2"]),
    ):
        status, listed, _ = await send(api, "GET", path_of(PODS, NS), fieldSelector=selector)
        assert sorted(i["metadata"]["name"] for i in listed["items"]) == names, selector
    status, answer, _ = await send(api, "GET", path_of(CONFIGMAPS, NS), fieldSelector="data.a=1")
    assert status == 400 and answer["message"] == "field label not supported: data.a"
    status, answer, _ = await send(api, "GET", path_of(CONFIGMAPS, NS), labelSelector="a in b")
    assert status == 400 and answer["message"].startswith("unable to parse requirement")
    status, answer, _ = await send(
        api, "GET", path_of(CONFIGMAPS, NS), watch="true", fieldSelector="spec.x=1"
    )
    assert status == 400


async def test_the_server_records_what_each_list_and_watch_asked_for(api: ApiServer) -> None:
    await create(api, configmap("a", team="ml"))
    await send(api, "GET", path_of(CONFIGMAPS, NS), labelSelector="team=ml")
    await watch(api, path_of(CONFIGMAPS, NS), 1, fieldSelector="metadata.name=a")
    assert [
        (r.resource, r.label_selector, r.field_selector, r.watch) for r in api.watch_requests
    ] == [
        (CONFIGMAPS, "team=ml", "", False),
        (CONFIGMAPS, "", "metadata.name=a", True),
    ]


async def test_the_history_gives_the_events_after_a_version_and_expires_old_ones() -> None:
    log = EventLog(size=3)
    for _ in range(5):
        version = log.next_version()
        await log.append("r", "MODIFIED", {"v": version}, version)
    assert [e.version for e in log.since(3)] == [4, 5]
    assert log.since(5) == []
    with pytest.raises(Expired):
        log.since(1)
