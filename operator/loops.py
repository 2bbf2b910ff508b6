"""The per-LLMService loops (sync, autoscaler, adapters), run without a finalizer.

kopf's daemons would do this, but kopf puts a finalizer on every object that
has one, so that it sees the deletion before the object goes. With the
operator down or uninstalled, that finalizer leaves LLMServices, and the
namespaces holding them, in Terminating for good. These loops need no
warning: the garbage collector removes the children, and a loop whose object
is gone only has to stop. So they are plain asyncio tasks, started and
stopped from the LLMService's watch events (`observe`):

* an object seen (listing, ADDED, MODIFIED) gets the loops its spec asks for;
  one whose spec no longer asks for a loop has it stopped;
* an object being deleted or DELETED has all of its loops stopped;
* a stop sets the loop's `stopped` flag and, after `cancellation_timeout`,
  cancels the task; a loop that crashed is restarted after `restart_delay`.

Each loop reads one live body: the supervisor replaces its contents with each
event, as kopf does for its daemons.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator.triggers import Key

log = logging.getLogger("pagoda.operator.loops")

# run(body, memo, stopped, logger): the loop, until `stopped` or its object goes.
LoopFn = Callable[[MutableMapping[str, Any], Any, "Stopped", Any], Awaitable[None]]


class Stopped:
    """A loop's stop flag: false until the loop must end; awaitable."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        """Ask the loop to end."""
        self._event.set()

    async def wait(self) -> None:
        """Return once the loop is asked to end."""
        await self._event.wait()


@dataclass(frozen=True, slots=True)
class Loop:
    """One kind of loop: its name, which specs want it, what it runs."""

    name: str
    run: LoopFn
    wanted: Callable[[Mapping[str, Any]], bool] = lambda spec: True


@dataclass(slots=True)
class _Running:
    task: asyncio.Task[None]
    stopped: Stopped


@dataclass(slots=True)
class _Object:
    """One LLMService: its live body and its running loops."""

    uid: str | None
    body: dict[str, Any]
    running: dict[str, _Running] = field(default_factory=dict)


def _deleting(event_type: str | None, body: Mapping[str, Any]) -> bool:
    return event_type == "DELETED" or bool((body.get("metadata") or {}).get("deletionTimestamp"))


class Loops:
    """The supervisor of every LLMService's loops (one per operator, kept in kopf's memo)."""

    def __init__(
        self,
        loops: tuple[Loop, ...],
        logger_for: Callable[[Mapping[str, Any]], Any] = lambda body: log,
        cancellation_timeout: float = 10.0,
        restart_delay: float = 10.0,
    ) -> None:
        self._loops = loops
        self._logger_for = logger_for
        self._cancellation_timeout = cancellation_timeout
        self._restart_delay = restart_delay
        self._objects: dict[Key, _Object] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def running(self, key: Key) -> set[str]:
        """The names of the loops that run for one LLMService."""
        found = self._objects.get(key)
        return {name for name, r in found.running.items() if not r.task.done()} if found else set()

    def observe(self, event_type: str | None, body: Mapping[str, Any], memo: Any) -> None:
        """A watch event of an LLMService: start or stop its loops to match it.

        Call it from the event loop that runs the loops (an async handler).
        """
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        known = self._objects.get(key)
        if known is not None and known.uid != meta.get("uid"):
            self._forget(key)  # deleted and created again under the same name
            known = None
        if _deleting(event_type, body):
            if known is not None:
                known.body.clear()
                known.body.update(copy.deepcopy(dict(body)))
                self._forget(key)
            return
        if known is None:
            known = self._objects[key] = _Object(meta.get("uid"), {})
        known.body.clear()
        known.body.update(copy.deepcopy(dict(body)))
        spec = body.get("spec") or {}
        for loop in self._loops:
            current = known.running.get(loop.name)
            if loop.wanted(spec):
                if current is None:
                    known.running[loop.name] = self._start(loop, known, memo)
            elif current is not None:
                self._stop(known.running.pop(loop.name))

    def _start(self, loop: Loop, known: _Object, memo: Any) -> _Running:
        stopped = Stopped()
        logger = self._logger_for(known.body)
        task = asyncio.create_task(
            self._supervise(loop, known.body, memo, stopped, logger),
            name=f"{loop.name} {known.body.get('metadata', {}).get('name')}",
        )
        return _Running(task, stopped)

    async def _supervise(
        self,
        loop: Loop,
        body: MutableMapping[str, Any],
        memo: Any,
        stopped: Stopped,
        logger: Any,
    ) -> None:
        """Run the loop; after a crash, run it again (a bug must not stop it for good)."""
        while not stopped:
            try:
                await loop.run(body, memo, stopped, logger)
                return  # ended by itself: it had nothing more to do
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.exception(f"the {loop.name} loop crashed, restarting: {e}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=self._restart_delay)

    def _forget(self, key: Key) -> None:
        known = self._objects.pop(key, None)
        if known is not None:
            for running in known.running.values():
                self._stop(running)

    def _stop(self, running: _Running) -> None:
        running.stopped.set()
        stopper = asyncio.create_task(self._reap(running), name="stopping a loop")
        self._stopping.add(stopper)
        stopper.add_done_callback(self._stopping.discard)

    async def _reap(self, running: _Running) -> None:
        """Give the loop `cancellation_timeout` to end by itself, then cancel it."""
        done, _ = await asyncio.wait({running.task}, timeout=self._cancellation_timeout)
        if not done:
            running.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await running.task

    async def stop_all(self) -> None:
        """Stop every loop and wait until they ended (the operator shuts down)."""
        for key in list(self._objects):
            self._forget(key)
        while self._stopping:
            await asyncio.gather(*list(self._stopping), return_exceptions=True)
