"""EngineCore entry points with one fault injected, for test_engine_faults.py.

The EngineCore is a spawned process: a test cannot monkeypatch it from the
outside, so each function here patches the real code inside the child and
then runs the real entry point. (Importable by name: the test puts this
folder on sys.path, which spawn hands to the child.)
"""

from __future__ import annotations

import time

from pagoda.runtime.core import core_proc, wire
from pagoda.runtime.core.engine_core import EngineCore


def input_thread_raises(*args) -> None:
    def broken(self, frames):
        raise RuntimeError("injected fault in the input thread")

    wire.CoreInputDecoder.decode = broken
    core_proc.run_engine_core(*args)


def output_thread_raises(*args) -> None:
    real = core_proc.EngineCoreProc._encode

    def broken(encoder, item):
        if item[0] == wire.OUTPUTS:
            raise RuntimeError("injected fault in the output thread")
        return real(encoder, item)

    core_proc.EngineCoreProc._encode = staticmethod(broken)
    core_proc.run_engine_core(*args)


def step_hangs(*args) -> None:
    real = EngineCore.step

    def stuck(self):
        if self.has_unfinished_requests():
            time.sleep(3600)  # a step that never returns (a deadlocked kernel, say)
        return real(self)

    EngineCore.step = stuck
    core_proc.run_engine_core(*args)
