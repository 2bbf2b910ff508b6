"""Converge the server's adapters on a file (usually a mounted ConfigMap).

`--lora-adapters-file PATH` holds a JSON list of `{"name": ..., "path": ...}`.
The server loads every listed adapter before it reports ready, then polls the
file's content hash and, on a change, loads what appeared or changed folder
(replacing in place) and unloads what disappeared. A pod that restarts thus
comes back with its adapters without anyone calling it, and the operator's
calls to the HTTP routes only make convergence faster. Adapters loaded by
other means are left alone: only what the file once listed is unloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from pathlib import Path

from pagoda.runtime.engine.lora_registry import LoRARegistry
from pagoda.runtime.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)


class AdaptersFileError(ValueError):
    """The file is not a JSON list of {name, path}."""


def parse_adapters_file(text: str) -> dict[str, str]:
    """name -> path, in the file's order; raises AdaptersFileError."""
    try:
        entries = json.loads(text) if text.strip() else []
    except ValueError as exc:
        raise AdaptersFileError(f"not valid JSON: {exc}") from None
    if not isinstance(entries, list):
        raise AdaptersFileError("must hold a JSON list")
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


class AdaptersFileWatcher:
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
        """Converge once if the file changed; True if it was read."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            data = b""
            if self._digest != "missing":
                logger.warning("LoRA adapters file %s unreadable (%s): none listed", self.path, exc)
            digest = "missing"
        else:
            digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            wanted = parse_adapters_file(data.decode("utf-8", "replace"))
        except AdaptersFileError as exc:
            logger.error("LoRA adapters file %s ignored: %s", self.path, exc)
            return True  # keep what is loaded; a fixed file is read again
        for name in [n for n in self._listed if n not in wanted]:
            with contextlib.suppress(InvalidRequestError):  # already unloaded over HTTP
                await self.registry.unload(name)
            self.errors.pop(name, None)
        for name, path in wanted.items():
            try:
                await self.registry.load(name, path, replace=True)
                self.errors.pop(name, None)
            except InvalidRequestError as exc:
                self.errors[name] = str(exc)
                logger.error("LoRA adapter %r from %s not loaded: %s", name, path, exc)
        self._listed = wanted
        return True

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
