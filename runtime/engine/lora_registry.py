"""The server's LoRA adapters by name, and their life cycle in the engine.

Each loaded folder gets its own `lora_int_id`. Loading the same name with
another folder (`replace`) gives a new id: requests in flight keep the old
weights to their end, new requests get the new ones, and the two never share
prefix-cache blocks. An adapter that is unloaded or replaced leaves the
engine only once its last request is done; the core's memory is never
freed under a running request.

Two writers may change a pod's adapters for the same desired state: the
operator over HTTP, at once, and the adapters file (a mounted ConfigMap),
which lags. Each says which LLMService generation (`metadata.generation`) it
acts for; the registry remembers the highest one applied, and a change from
the file for an older generation is refused (`StaleGenerationError`), so a
late file cannot bring back an adapter the operator has already unloaded.
Calls without a generation (a user's own) are applied and order nothing.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")

# (method, lora_request, lora_int_id) -> awaitable: the engine core's call.
EngineCall = Callable[..., Awaitable[None]]
# (event, outcome): "load"/"unload", "ok"/"error"/...
EventHook = Callable[[str, str], None]


class LoRAConflictError(InvalidRequestError):
    """The name is taken by another folder (HTTP 409)."""


class LoRANotFoundError(InvalidRequestError):
    """No adapter of that name (HTTP 404)."""


class StaleGenerationError(Exception):
    """A change for an older generation than one already applied (`if_current`).

    Not an InvalidRequestError: nothing is wrong with the adapter, the
    writer's view of the desired state is out of date.
    """

    def __init__(self, generation: int, applied: int) -> None:
        super().__init__(f"generation {generation} is older than generation {applied}, applied")
        self.generation = generation
        self.applied = applied


def resolve_lora_path(path: str) -> str:
    """A folder, or `hf://org/repo[/sub/folder]` from the local Hugging Face
    cache (never downloaded: pods read a mounted cache)."""
    if not path.startswith("hf://"):
        return str(Path(path).expanduser())
    from pagoda.runtime.model_loader.resolve import hf_cache_snapshot

    parts = path.removeprefix("hf://").split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise InvalidRequestError(
            f"lora_path {path!r}: expected hf://org/repo[/subfolder]", param="lora_path"
        )
    snapshot = hf_cache_snapshot("/".join(parts[:2]))
    if snapshot is None:
        raise InvalidRequestError(
            f"lora_path {path!r}: {parts[0]}/{parts[1]} is not in the local Hugging Face "
            "cache (HF_HOME); adapters are never downloaded at run time",
            param="lora_path",
        )
    return str(snapshot.joinpath(*parts[2:]))


@dataclass(frozen=True)
class LoadedAdapter:
    """A name's adapter as the server serves it."""

    request: LoRARequest
    # What the user gave (before hf:// resolution), shown by /v1/models.
    source: str
    # When it was loaded (Unix seconds): /v1/models' `created`, stable
    # across listings as OpenAI's is.
    loaded_at: int


class LoRARegistry:
    def __init__(self, call: EngineCall, base_model_name: str, on_event: EventHook | None = None):
        self._call = call
        self.base_model_name = base_model_name
        self._on_event = on_event or (lambda event, outcome: None)
        self.adapters: dict[str, LoadedAdapter] = {}
        self.names: dict[int, str] = {}  # every id ever loaded -> its name
        self._next_id = 0
        self._lock = asyncio.Lock()
        self._in_flight: Counter[int] = Counter()
        self._request_lora: dict[str, int] = {}
        self._retired: set[int] = set()
        self._background: set[asyncio.Task] = set()
        # The highest LLMService generation a change was made for (None: no
        # change carried one since start-up).
        self.generation: int | None = None

    def is_stale(self, generation: int | None) -> bool:
        """Whether a change for `generation` comes after a newer one (None never is)."""
        applied = self.generation
        return generation is not None and applied is not None and generation < applied

    def _order(self, generation: int | None, if_current: bool) -> None:
        """Record a change for `generation`; under the lock, before the change.

        Recorded even if the change then fails (a 404 unload, a bad folder):
        the writer has said what that generation wants, so an older wish
        must not be applied after it.
        """
        if generation is None:
            return
        applied = self.generation
        if applied is None or generation >= applied:
            self.generation = generation
        elif if_current:
            raise StaleGenerationError(generation, applied)

    def get(self, name: str) -> LoRARequest | None:
        """The adapter served under `name`, or None."""
        loaded = self.adapters.get(name)
        return loaded.request if loaded is not None else None

    async def load(
        self,
        name: str,
        path: str,
        replace: bool = False,
        *,
        generation: int | None = None,
        if_current: bool = False,
    ) -> LoRARequest:
        """Load `path` under `name`. Idempotent for the same folder; another
        folder under a taken name is a LoRAConflictError unless `replace`.

        `generation`: the LLMService generation this change is for (see the
        module's docstring); with `if_current`, a StaleGenerationError if a
        newer one was applied, and nothing changes.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequestError(
                f"lora_name {name!r} must be 1-128 letters, digits or ._:/- "
                "and start with a letter or digit",
                param="lora_name",
            )
        if name == self.base_model_name:
            raise InvalidRequestError(
                f"lora_name {name!r} is the base model's name", param="lora_name"
            )
        if not isinstance(path, str) or not path:
            raise InvalidRequestError("lora_path must be a non-empty string", param="lora_path")
        async with self._lock:
            self._order(generation, if_current)
            old = self.adapters.get(name)
            if old is not None and old.source == path:
                return old.request  # the same folder again: nothing to do
            if old is not None and not replace:
                raise LoRAConflictError(
                    f"adapter {name!r} is already loaded from {old.source}; "
                    'unload it first, or pass "replace": true',
                    param="lora_name",
                )
            try:
                resolved = resolve_lora_path(path)
                self._next_id += 1
                lora = LoRARequest(name, self._next_id, resolved)
                await self._call("add_lora", lora_request=lora)
            except InvalidRequestError:
                self._on_event("load", "error")
                raise
            self.adapters[name] = LoadedAdapter(lora, path, int(time.time()))
            self.names[lora.lora_int_id] = name
            self._on_event("load", "replaced" if old is not None else "ok")
            logger.info("LoRA adapter %r loaded from %s (id %d)", name, path, lora.lora_int_id)
            if old is not None:
                self._retire(old.request.lora_int_id)
            return lora

    async def unload(
        self, name: str, *, generation: int | None = None, if_current: bool = False
    ) -> None:
        """Stop serving `name`: new requests get 404, those in flight finish.

        `generation` and `if_current` as for `load`.
        """
        async with self._lock:
            self._order(generation, if_current)
            loaded = self.adapters.pop(name, None)
            if loaded is None:
                self._on_event("unload", "not_found")
                raise LoRANotFoundError(f"no LoRA adapter named {name!r}", param="lora_name")
            lora = loaded.request
            self._on_event("unload", "ok")
            logger.info("LoRA adapter %r unloaded (id %d)", name, lora.lora_int_id)
            self._retire(lora.lora_int_id)

    # -- requests in flight ------------------------------------------------------

    def request_started(self, request_id: str, lora: LoRARequest | None) -> None:
        if lora is not None:
            self._in_flight[lora.lora_int_id] += 1
            self._request_lora[request_id] = lora.lora_int_id

    def request_done(self, request_id: str) -> None:
        lora_id = self._request_lora.pop(request_id, None)
        if lora_id is None:
            return
        self._in_flight[lora_id] -= 1
        if self._in_flight[lora_id] <= 0:
            del self._in_flight[lora_id]
            if lora_id in self._retired:
                self._remove_from_engine(lora_id)

    def in_flight(self, lora_int_id: int) -> int:
        return self._in_flight.get(lora_int_id, 0)

    def _retire(self, lora_id: int) -> None:
        if self._in_flight.get(lora_id, 0) > 0:
            self._retired.add(lora_id)  # removed when its last request is done
        else:
            self._remove_from_engine(lora_id)

    def _remove_from_engine(self, lora_id: int) -> None:
        self._retired.discard(lora_id)
        task = asyncio.get_running_loop().create_task(
            self._call("remove_lora", lora_int_id=lora_id)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)
