"""How many torch threads a CPU EngineCore gets beside its API server."""

from __future__ import annotations

from pagoda.runtime.engine.core_client import default_core_threads


def test_core_leaves_one_core_to_the_api_server():
    assert default_core_threads(2) == 1
    assert default_core_threads(16) == 15


def test_core_gets_a_thread_on_a_single_core():
    assert default_core_threads(1) == 1
    assert default_core_threads(0) == 1
