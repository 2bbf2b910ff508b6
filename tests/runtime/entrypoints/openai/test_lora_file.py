"""The adapters file and the operator's calls, ordered by the LLMService's
generation: a file that lags the spec cannot bring back an adapter the
operator has unloaded over HTTP, a newer file is applied, a hand-written list
always is, and a malformed generation is refused like any invalid file.

A real LoRARegistry with the engine core's calls replaced by a recorder: no
model, no server, no sleeps (each step is driven by `sync()` directly).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pagoda.runtime.engine.lora_registry import (
    LoRANotFoundError,
    LoRARegistry,
    StaleGenerationError,
)
from pagoda.runtime.entrypoints.openai.lora_file import (
    AdaptersFile,
    AdaptersFileError,
    AdaptersFileWatcher,
    parse_adapters_file,
)
from pagoda.runtime.sampling_params import INT64_MAX

SQL, FR = "/adapters/sql", "/adapters/fr"


class Engine:
    """The engine core's side of the registry: records add/remove, or holds
    an add until `release` is set (to interleave a call with a file)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.hold: str | None = None  # the adapter whose add waits for `release`
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, method: str, **kwargs: Any) -> None:
        lora = kwargs.get("lora_request")
        self.calls.append((method, lora.lora_name if lora else kwargs.get("lora_int_id")))
        if lora is not None and lora.lora_name == self.hold:
            self.held.set()
            await self.release.wait()


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def registry(engine: Engine) -> LoRARegistry:
    return LoRARegistry(engine, "base")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "adapters.json"


def write(path: Path, adapters: dict[str, str], generation: int | None = None) -> None:
    """The file as the operator renders it (or a plain list without a generation)."""
    entries = [{"name": n, "path": p} for n, p in adapters.items()]
    data: Any = entries if generation is None else {"generation": generation, "adapters": entries}
    path.write_text(json.dumps(data))


# -- the file's format ---------------------------------------------------------------------------


def test_the_operators_form_and_the_legacy_list_parse_alike() -> None:
    listed = [{"name": "sql", "path": SQL}, {"name": "fr", "path": FR}]
    assert parse_adapters_file(json.dumps({"generation": 3, "adapters": listed})) == AdaptersFile(
        {"sql": SQL, "fr": FR}, generation=3
    )
    assert parse_adapters_file(json.dumps(listed)) == AdaptersFile({"sql": SQL, "fr": FR})
    assert parse_adapters_file("") == AdaptersFile()
    # A null or absent generation is a hand-written file; unknown keys are a
    # newer operator's, ignored; the bounds are int64's.
    assert parse_adapters_file('{"generation": null, "adapters": []}').generation is None
    assert parse_adapters_file('{"adapters": [], "note": "x"}') == AdaptersFile()
    assert parse_adapters_file('{"generation": 0, "adapters": []}').generation == 0
    top = json.dumps({"generation": INT64_MAX, "adapters": []})
    assert parse_adapters_file(top).generation == INT64_MAX


@pytest.mark.parametrize("generation", ["3", 3.0, 2.5, True, -1, INT64_MAX + 1, [3], {"g": 3}])
def test_a_malformed_generation_is_refused_naming_it(generation: Any) -> None:
    text = json.dumps({"generation": generation, "adapters": []})
    with pytest.raises(AdaptersFileError, match=r"generation must be an integer from 0 to 92"):
        parse_adapters_file(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"generation": 2}', '"adapters" list'),
        ('{"generation": 2, "adapters": {"sql": "/a"}}', '"adapters" list'),
        ("null", "JSON list"),
        ('[{"name": "sql"}]', "entry 0"),
        ("{", "not valid JSON"),
    ],
)
def test_other_malformed_files_are_refused(text: str, message: str) -> None:
    with pytest.raises(AdaptersFileError, match=message):
        parse_adapters_file(text)


# -- the registry's ordering -----------------------------------------------------------------------


async def test_calls_with_a_generation_raise_it_and_calls_without_leave_it(
    registry: LoRARegistry,
) -> None:
    await registry.load("sql", SQL, generation=4)
    assert registry.generation == 4
    await registry.load("fr", FR)  # a user's own call: orders nothing
    assert registry.generation == 4
    # An older call is still applied (the operator is the authority), and
    # the generation never goes down.
    await registry.unload("fr", generation=2)
    assert registry.generation == 4 and "fr" not in registry.adapters
    # An unload of nothing is a 404 but still says what generation 5 wants.
    with pytest.raises(LoRANotFoundError):
        await registry.unload("fr", generation=5)
    assert registry.generation == 5


async def test_a_stale_change_if_current_is_refused_and_changes_nothing(
    registry: LoRARegistry, engine: Engine
) -> None:
    await registry.load("fr", FR, generation=3)
    engine.calls.clear()
    with pytest.raises(StaleGenerationError, match="generation 2 is older than generation 3"):
        await registry.load("sql", SQL, generation=2, if_current=True)
    with pytest.raises(StaleGenerationError):
        await registry.unload("fr", generation=2, if_current=True)
    assert engine.calls == [] and set(registry.adapters) == {"fr"}
    await registry.load("sql", SQL, generation=3, if_current=True)  # the same one: current
    assert set(registry.adapters) == {"fr", "sql"}


# -- the watcher ---------------------------------------------------------------------------------


async def test_the_race_a_late_file_does_not_reload_an_adapter_unloaded_over_http(
    registry: LoRARegistry, path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The e2e flake, step by step: generation 2 adds sql, generation 3
    # removes it; the operator's calls reach the pod before the kubelet's
    # copy of the generation-2 file does.
    write(path, {}, generation=1)
    watcher = AdaptersFileWatcher(str(path), registry)
    assert await watcher.sync()
    await registry.load("sql", SQL, replace=True, generation=2)  # the operator's load
    await registry.unload("sql", generation=3)  # the operator's unload
    write(path, {"sql": SQL}, generation=2)  # the file catches up with the add
    with caplog.at_level(logging.INFO, logger="pagoda.runtime.entrypoints.openai.lora_file"):
        assert await watcher.sync()
    assert "sql" not in registry.adapters
    assert "generation 2 is older than generation 3" in caplog.text
    # The same stale content is not read again every poll.
    assert not await watcher.sync()
    # The file catches up with the removal: applied, nothing to do.
    write(path, {}, generation=3)
    assert await watcher.sync()
    assert registry.adapters == {} and registry.generation == 3


async def test_a_newer_file_is_applied(registry: LoRARegistry, path: Path) -> None:
    await registry.load("sql", SQL, generation=2)
    await registry.unload("sql", generation=3)
    watcher = AdaptersFileWatcher(str(path), registry)
    write(path, {"sql": SQL}, generation=2)
    await watcher.sync()
    assert "sql" not in registry.adapters
    # Added back (generation 4) before the operator reached this pod.
    write(path, {"sql": SQL, "fr": FR}, generation=4)
    assert await watcher.sync()
    assert set(registry.adapters) == {"sql", "fr"} and registry.generation == 4
    # And a later removal through the file unloads what it listed.
    write(path, {"fr": FR}, generation=5)
    assert await watcher.sync()
    assert set(registry.adapters) == {"fr"}


async def test_a_legacy_list_is_applied_whatever_came_before(
    registry: LoRARegistry, path: Path
) -> None:
    await registry.load("fr", FR, generation=9)
    watcher = AdaptersFileWatcher(str(path), registry)
    write(path, {"sql": SQL})  # hand-written: no generation
    assert await watcher.sync()
    assert set(registry.adapters) == {"fr", "sql"}
    assert registry.generation == 9  # and it orders nothing
    write(path, {})
    assert await watcher.sync()
    assert set(registry.adapters) == {"fr"}  # only what the file listed is unloaded


async def test_a_file_with_a_malformed_generation_keeps_what_is_loaded(
    registry: LoRARegistry, path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = AdaptersFileWatcher(str(path), registry)
    write(path, {"sql": SQL}, generation=1)
    assert await watcher.sync()
    path.write_text(json.dumps({"generation": "2", "adapters": []}))
    assert await watcher.sync()
    assert set(registry.adapters) == {"sql"} and registry.generation == 1
    assert 'generation must be an integer from 0 to 9223372036854775807, got "2"' in caplog.text
    write(path, {}, generation=2)  # fixed: read again and applied
    assert await watcher.sync()
    assert registry.adapters == {}


async def test_a_restarted_pod_applies_the_file_it_finds(engine: Engine, path: Path) -> None:
    before = LoRARegistry(engine, "base")
    await before.load("fr", FR, generation=7)
    # The process restarts: nothing is remembered, and the file (older than
    # what the old process had applied) is how the adapters come back.
    after = LoRARegistry(engine, "base")
    write(path, {"sql": SQL}, generation=6)
    assert await AdaptersFileWatcher(str(path), after).sync()
    assert set(after.adapters) == {"sql"} and after.generation == 6


async def test_a_call_during_a_files_application_stops_the_rest_of_it(
    registry: LoRARegistry, engine: Engine, path: Path
) -> None:
    # The file (generation 2) was current when it was read, but while its
    # first adapter loads the operator unloads its second (generation 3):
    # the watcher must not load it after that call.
    watcher = AdaptersFileWatcher(str(path), registry)
    write(path, {"sql": SQL, "fr": FR}, generation=2)
    engine.hold = "sql"
    applying = asyncio.ensure_future(watcher.sync())
    await engine.held.wait()  # the registry's lock is held by sql's load
    unloading = asyncio.ensure_future(registry.unload("fr", generation=3))
    await asyncio.sleep(0)  # the unload queues on the lock before the file's next load
    engine.release.set()
    assert await applying
    with pytest.raises(LoRANotFoundError):  # fr was not loaded yet: a 404, as over HTTP
        await unloading
    assert set(registry.adapters) == {"sql"} and registry.generation == 3
    assert ("add_lora", "fr") not in engine.calls
