"""Converge the server's adapters on a file (usually a mounted ConfigMap).

`--lora-adapters-file PATH` holds

    {"generation": G, "adapters": [{"name": ..., "path": ...}, ...]}

as the operator writes it (G: the LLMService's `metadata.generation` it was
rendered from; optional), or the plain list of `{"name", "path"}` (no
generation), as a user may write it by hand. The server loads every listed
adapter before it reports ready, then polls the file's content hash and, on a
change, loads what appeared or changed folder (replacing in place) and
unloads what disappeared. A pod that restarts thus comes back with its
adapters without anyone calling it, and the operator's calls to the HTTP
routes only make convergence faster. Adapters loaded by other means are left
alone: only what the file once listed is unloaded.

The file lags the spec (the kubelet refreshes a ConfigMap volume every minute
or so), so it may still list an adapter the operator has since unloaded over
HTTP. Both writers say which generation they act for, and the registry keeps
the highest one applied (lora_registry.py): a file for an older generation
is skipped until a newer one arrives. A file without a generation is always
applied, as is every file after a restart (nothing is remembered).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagoda.runtime.engine.lora_registry import LoRARegistry, StaleGenerationError
from pagoda.runtime.sampling_params import INT64_MAX, InvalidRequestError

logger = logging.getLogger(__name__)


class AdaptersFileError(ValueError):
    """The file is neither {"generation", "adapters"} nor a JSON list of {name, path}."""


@dataclass(frozen=True, slots=True)
class AdaptersFile:
    """What the file asks for."""

    adapters: dict[str, str] = field(default_factory=dict)  # name -> path, in file order
    generation: int | None = None  # None: a hand-written file, applied whatever came before


def _generation(value: Any) -> int | None:
    """The file's `generation`: absent or null, or an int64 >= 0 (not a bool)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise AdaptersFileError(
            f"generation must be an integer from 0 to {INT64_MAX}, got {json.dumps(value)}"
        )
    return value


def _adapters(entries: Any) -> dict[str, str]:
    """name -> path from the list of {name, path}."""
    if not isinstance(entries, list):
        raise AdaptersFileError('must hold a JSON list, or an object with an "adapters" list')
    out: dict[str, str] = {}
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("path"), str)
        ):
            raise AdaptersFileError(f"entry {i} must be an object with string name and path")
        if entry["name"] in out:
            raise AdaptersFileError(f"adapter name {entry['name']!r} appears twice")
        out[entry["name"]] = entry["path"]
    return out


def parse_adapters_file(text: str) -> AdaptersFile:
    """The file's adapters and generation; raises AdaptersFileError.

    An empty file lists nothing. Keys of the object form other than
    `generation` and `adapters` are ignored (a newer operator may add some).
    """
    try:
        data = json.loads(text) if text.strip() else []
    except ValueError as exc:
        raise AdaptersFileError(f"not valid JSON: {exc}") from None
    if isinstance(data, list):
        return AdaptersFile(_adapters(data))
    if not isinstance(data, dict) or "adapters" not in data:
        raise AdaptersFileError('must hold a JSON list, or an object with an "adapters" list')
    return AdaptersFile(_adapters(data["adapters"]), _generation(data.get("generation")))


class AdaptersFileWatcher:
    """Polls the adapters file and converges the registry on it (see the module)."""

    def __init__(self, path: str, registry: LoRARegistry, interval_s: float = 2.0):
        self.path = Path(path)
        self.registry = registry
        self.interval_s = interval_s
        self._digest: str | None = None
        self._listed: dict[str, str] = {}  # what the file last asked for
        # name -> the runtime's last error for it (shown in the log and metrics).
        self.errors: dict[str, str] = {}
        self._task: asyncio.Task | None = None

    async def sync(self) -> bool:
        """Converge once if the file changed; True if it was read.

        A file older than a generation already applied is read but not
        applied; its digest is kept, so it is not read again every poll.
        """
        data, digest = self._read()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            wanted = parse_adapters_file(data.decode("utf-8", "replace"))
        except AdaptersFileError as exc:
            logger.error("LoRA adapters file %s ignored: %s", self.path, exc)
            return True  # keep what is loaded; a fixed file is read again
        if self.registry.is_stale(wanted.generation):
            # The operator has already applied a newer spec over HTTP; this
            # content is on its way out (the kubelet's refresh lags).
            logger.info(
                "LoRA adapters file %s skipped: generation %s is older than generation %s, "
                "already applied",
                self.path,
                wanted.generation,
                self.registry.generation,
            )
            return True
        try:
            await self._apply(wanted)
        except StaleGenerationError as exc:
            # A newer call came in while the file was being applied.
            logger.info("LoRA adapters file %s superseded while applied: %s", self.path, exc)
        return True

    def _read(self) -> tuple[bytes, str]:
        """The file's bytes and digest; a missing or unreadable file lists nothing."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            if self._digest != "missing":
                logger.warning("LoRA adapters file %s unreadable (%s): none listed", self.path, exc)
            return b"", "missing"
        return data, hashlib.sha256(data).hexdigest()

    async def _apply(self, wanted: AdaptersFile) -> None:
        """Unload what the file no longer lists, load what it lists.

        Each change is made only if no newer generation was applied
        meanwhile (StaleGenerationError, from the registry, under its lock).
        """
        generation = wanted.generation
        listed, self._listed = self._listed, wanted.adapters
        for name in [n for n in listed if n not in wanted.adapters]:
            with contextlib.suppress(InvalidRequestError):  # already unloaded over HTTP
                await self.registry.unload(name, generation=generation, if_current=True)
            self.errors.pop(name, None)
        for name, path in wanted.adapters.items():
            try:
                await self.registry.load(
                    name, path, replace=True, generation=generation, if_current=True
                )
                self.errors.pop(name, None)
            except InvalidRequestError as exc:
                self.errors[name] = str(exc)
                logger.error("LoRA adapter %r from %s not loaded: %s", name, path, exc)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:  # the engine died, say: the server handles that
                logger.exception("LoRA adapters file sync failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
