"""How many torch threads a CPU EngineCore gets beside its API server."""

from __future__ import annotations

from pagoda.runtime.engine.core_client import default_core_threads


def test_core_takes_every_core():
    assert default_core_threads(2) == 2
    assert default_core_threads(16) == 16


def test_core_gets_a_thread_when_no_core_is_counted():
    assert default_core_threads(1) == 1
    assert default_core_threads(0) == 1
