"""The operator's view of its children, kept current by the watches it already runs.

kopf watches every owned kind (main.CHILDREN) to wake the owning LLMService's
sync loop. An index on the same streams (`kopf.index`, one per kind) keeps the
latest body of each child in memory, as client-go's informers do, and kopf
starts no other handler before every index holds its initial list. So a
reconcile woken by a pod event reads its children, pods and EndpointSlices
without a request, and a tick of the autoscaler lists its pods the same way.

Two rules keep the cache from hiding anything:

* A miss is not an absence. Only objects with our labels are watched, so an
  object of the same name that someone else made (a name conflict) is never
  in the cache: `Reads.get` asks the API on a miss, and the ownership check
  sees it.
* A skipped write must be a write that would have changed nothing. The
  operator skips the apply of a child only when the live object (from the
  watch) carries the applied-hash of what it renders now, and every field it
  renders still has the value the API server answered to its last apply
  (`ChildCache.unchanged`). A hand edit of one of those fields is seen in the
  watch event it causes, so drift is repaired within a pass as before. The
  resync pass applies every child whatever the cache says: the safety net for
  what a watch can miss (an event lost across a reconnect).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pagoda.operator.drift import APPLIED_HASH, applied_hash, changed_fields

INDEX_PREFIX = "pagoda_cache_"

ChildKey = tuple[str, str, str]  # (kind, namespace, name)


def index_id(kind: str) -> str:
    """The kopf index id (and handler keyword) of one owned kind."""
    return f"{INDEX_PREFIX}{kind}"


def index_entry(body: Mapping[str, Any], **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """kopf.index callback: the object's body under (namespace, name).

    A copy, detached from kopf's event: the cache must not change when kopf
    reuses or patches what it received.
    """
    meta = body.get("metadata") or {}
    return {(meta.get("namespace") or "", meta.get("name") or ""): copy.deepcopy(dict(body))}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _meta(obj: Mapping[str, Any] | None, key: str) -> Any:
    return ((obj or {}).get("metadata") or {}).get(key)


def _hash(obj: Mapping[str, Any] | None) -> Any:
    return (_meta(obj, "annotations") or {}).get(APPLIED_HASH)


@dataclass(slots=True)
class ChildCache:
    """The owned kinds' objects, by kind, from kopf's indices; and what this operator applied.

    `indices` maps a kind to a kopf index (or any mapping of (namespace, name)
    to the bodies stored under it).
    """

    indices: Mapping[str, Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]]
    # The API server's answer to the last apply of each child.
    applied: dict[ChildKey, dict[str, Any]] = field(default_factory=dict)
    # When `forget_gone` last looked (monotonic seconds), and how often it may.
    pruned_at: float | None = None
    prune_every: float = 60.0

    @classmethod
    def from_indices(cls, indices: Mapping[str, Any], kinds: Iterable[str]) -> ChildCache:
        """From kopf's handler keywords (`**kwargs` of a handler): one index per kind."""
        return cls({kind: indices[index_id(kind)] for kind in kinds if index_id(kind) in indices})

    def covers(self, kind: str) -> bool:
        """Whether objects of this kind (with our labels) are all in the cache."""
        return kind in self.indices

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object, or None (not cached, or gone)."""
        found = [obj for obj in self.indices[kind].get((namespace, name)) or ()]
        if not found:
            return None
        # Two objects under one name: a delete and a re-create whose events
        # are both in; the one not being deleted is the current one.
        found.sort(key=lambda obj: bool(_meta(obj, "deletionTimestamp")))
        # Copies: what a caller does with its object must not change the cache.
        return copy.deepcopy(dict(found[0]))

    def list(self, kind: str, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Cached objects of one namespace whose labels include `labels`."""
        out = []
        for (ns, _), objs in list(self.indices[kind].items()):
            if ns != namespace:
                continue
            for obj in objs:
                have = _labels(obj)
                if all(have.get(k) == v for k, v in labels.items()):
                    out.append(copy.deepcopy(dict(obj)))
        return out

    def remember(self, kind: str, applied: Mapping[str, Any]) -> None:
        """Record the API server's answer to an apply."""
        key = (kind, _meta(applied, "namespace") or "", _meta(applied, "name") or "")
        self.applied[key] = copy.deepcopy(dict(applied))

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """Drop the record of a child that was deleted or found absent."""
        self.applied.pop((kind, namespace, name), None)

    def last_applied(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The answer to this operator's last apply of the child, if any."""
        return self.applied.get((kind, namespace, name))

    def unchanged(self, desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
        """Whether applying `desired` (unstamped) now would change nothing.

        True only when the live object carries the hash of `desired`, this
        operator applied that very hash to that very object (same uid), and
        no field `desired` sets has moved since the API server answered.
        """
        if live is None:
            return False
        meta = desired["metadata"]
        before = self.last_applied(desired["kind"], meta.get("namespace") or "", meta["name"])
        if before is None or _meta(before, "uid") != _meta(live, "uid"):
            return False
        want = applied_hash(desired)
        if _hash(live) != want or _hash(before) != want:
            return False
        return not changed_fields(dict(desired), before, live)

    def before(self, desired: Mapping[str, Any], live: dict[str, Any] | None) -> Any:
        """The object as it stood before this pass's apply, as far as the operator knows.

        The watch may not have brought this operator's own last write yet:
        when the cached object still has an older hash and the last apply's
        answer has the one rendered now, that answer is the newer of the two
        (so a change already told is not told again).
        """
        if live is None:
            return None
        meta = desired["metadata"]
        mine = self.last_applied(desired["kind"], meta.get("namespace") or "", meta["name"])
        want = applied_hash(desired)
        if (
            mine is not None
            and _meta(mine, "uid") == _meta(live, "uid")
            and _hash(live) != want
            and _hash(mine) == want
        ):
            return mine
        return live

    def forget_gone(self, now: float) -> None:
        """Drop the records of children that no longer exist (their owner was deleted).

        Every loop's full pass calls this, and it looks at every record: it
        runs at most once per `prune_every` seconds (`now`: monotonic).
        """
        if self.pruned_at is not None and now - self.pruned_at < self.prune_every:
            return
        self.pruned_at = now
        for kind, namespace, name in list(self.applied):
            if self.covers(kind) and self.get(kind, namespace, name) is None:
                del self.applied[kind, namespace, name]


class Api(Protocol):
    """The reads that `Reads` falls back to (pagoda.operator.api.KubeApi)."""

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def list(
        self, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class Reads:
    """Reads of children: from the cache where it has them, else from the API."""

    api: Api
    cache: ChildCache | None = None

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object; a cache miss asks the API (a name taken by an object not ours)."""
        if self.cache is not None and self.cache.covers(kind):
            found = self.cache.get(kind, namespace, name)
            if found is not None:
                return found
        return await self.api.get(kind, namespace, name)

    async def get_owned(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object that, if it exists and is ours, carries our labels: the cache is enough."""
        if self.cache is not None and self.cache.covers(kind):
            return self.cache.get(kind, namespace, name)
        return await self.api.get(kind, namespace, name)

    async def list(
        self, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Objects of one namespace whose labels include `labels`."""
        if self.cache is not None and self.cache.covers(kind):
            return self.cache.list(kind, namespace, labels)
        return await self.api.list(kind, namespace, labels)
