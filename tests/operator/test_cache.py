"""The watch-fed cache of children: reads, and when an apply may be skipped."""

from __future__ import annotations

import copy
from typing import Any

from pagoda.operator.cache import ChildCache, Reads, index_entry
from pagoda.operator.drift import stamp


def configmap(value: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "chat-engine", "namespace": "ns", "labels": {"app": "pagoda"}},
        "data": {"PAGODA_MAX_NUM_SEQS": value},
    }


def served(desired: dict[str, Any], uid: str = "u-1", version: str = "10") -> dict[str, Any]:
    """What the API server answers to an apply of `desired`: server fields added."""
    live = stamp(desired)
    live["metadata"] |= {"uid": uid, "resourceVersion": version, "managedFields": []}
    return live


def cache_of(*objs: dict[str, Any]) -> ChildCache:
    index: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for obj in objs:
        for key, value in index_entry(obj).items():
            index.setdefault(key, []).append(value)
    return ChildCache({"ConfigMap": index, "Pod": {}})


def test_an_object_applied_and_unchanged_since_is_not_applied_again() -> None:
    desired = configmap()
    live = served(desired)
    cache = cache_of(live)
    cache.remember("ConfigMap", live)
    assert cache.unchanged(desired, cache.get("ConfigMap", "ns", "chat-engine"))
    # Someone else's annotation, a newer version: not a field we render.
    other = copy.deepcopy(live)
    other["metadata"]["annotations"]["team"] = "ml"
    other["metadata"]["resourceVersion"] = "11"
    assert cache.unchanged(desired, other)


def test_a_hand_edit_of_a_rendered_field_is_applied_again() -> None:
    desired = configmap()
    live = served(desired)
    cache = cache_of(live)
    cache.remember("ConfigMap", live)
    edited = copy.deepcopy(live)
    edited["data"]["PAGODA_MAX_NUM_SEQS"] = "64"
    assert not cache.unchanged(desired, edited)


def test_a_new_rendering_or_an_object_never_applied_is_applied() -> None:
    desired = configmap()
    live = served(desired)
    cache = cache_of(live)
    assert not cache.unchanged(desired, live)  # no apply recorded (a restart)
    cache.remember("ConfigMap", live)
    assert not cache.unchanged(configmap("2"), live)  # the spec changed
    assert not cache.unchanged(desired, None)  # gone
    assert not cache.unchanged(desired, served(desired, uid="u-2"))  # re-created by someone


def test_the_last_answer_stands_for_a_watch_that_has_not_caught_up() -> None:
    old, new = configmap("1"), configmap("2")
    cached = served(old)
    cache = cache_of(cached)
    cache.remember("ConfigMap", served(new, version="11"))
    assert cache.before(new, cached)["metadata"]["resourceVersion"] == "11"
    assert cache.before(old, cached) is cached


def test_lists_filter_by_namespace_and_labels() -> None:
    mine = configmap()
    other_ns = copy.deepcopy(mine)
    other_ns["metadata"]["namespace"] = "elsewhere"
    cache = cache_of(mine, other_ns)
    assert [
        o["metadata"]["namespace"] for o in cache.list("ConfigMap", "ns", {"app": "pagoda"})
    ] == ["ns"]
    assert cache.list("ConfigMap", "ns", {"app": "other"}) == []


class Api:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind))
        return {"kind": kind, "metadata": {"name": name, "labels": {}}}

    async def list(self, kind: str, namespace: str, labels: Any) -> list[dict[str, Any]]:
        self.calls.append(("list", kind))
        return []


async def test_a_miss_asks_the_api_for_a_name_someone_else_may_hold() -> None:
    api = Api()
    reads = Reads(api, cache_of(configmap()))
    assert await reads.get("ConfigMap", "ns", "chat-engine") is not None
    assert api.calls == []
    # Not in the cache: maybe an object without our labels, which the ownership check must see.
    assert await reads.get("ConfigMap", "ns", "taken") is not None
    assert api.calls == [("get", "ConfigMap")]
    # ...but an object that would be ours carries our labels: the cache is enough.
    assert await reads.get_owned("ConfigMap", "ns", "taken") is None
    await reads.list("Pod", "ns", {})
    await reads.get("Secret", "ns", "key")  # a kind not cached
    assert api.calls == [("get", "ConfigMap"), ("get", "Secret")]


def test_records_of_children_gone_are_dropped_at_most_once_a_minute() -> None:
    desired = configmap()
    cache = cache_of()  # the owner was deleted: its children went with it
    cache.remember("ConfigMap", served(desired))
    cache.remember("ScaledObject", {"metadata": {"namespace": "ns", "name": "chat"}})
    cache.forget_gone(100.0)
    assert list(cache.applied) == [("ScaledObject", "ns", "chat")]  # not a cached kind
    cache.remember("ConfigMap", served(desired))
    cache.forget_gone(130.0)
    assert ("ConfigMap", "ns", "chat-engine") in cache.applied
    cache.forget_gone(160.0)
    assert ("ConfigMap", "ns", "chat-engine") not in cache.applied
