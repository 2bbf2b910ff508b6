"""The per-LLMService loops' supervisor: which loops run for which watch events."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from kubesim.testing import eventually
from pagoda.operator.loops import Loop, Loops, Stopped

KEY = ("llm", "chat")


def body(uid: str = "u1", deleting: bool = False, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "llm", "name": "chat", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T03:00:00Z"
    return {"metadata": meta, "spec": spec}


class Recorder:
    """Loops that record what they saw and run until stopped."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[str] = []
        self.bodies: dict[str, MutableMapping[str, Any]] = {}

    def loop(self, name: str, wanted: Any = lambda spec: True) -> Loop:
        async def run(
            live: MutableMapping[str, Any], memo: Any, stopped: Stopped, logger: Any
        ) -> None:
            self.started.append(name)
            self.bodies[name] = live
            try:
                await stopped.wait()
            finally:
                self.ended.append(name)

        return Loop(name, run, wanted)


def loops_of(recorder: Recorder, **options: Any) -> Loops:
    return Loops(
        (
            recorder.loop("sync"),
            recorder.loop("autoscale", lambda spec: bool(spec.get("autoscaling"))),
        ),
        **options,
    )


async def test_a_seen_object_gets_the_loops_its_spec_asks_for() -> None:
    recorder = Recorder()
    loops = loops_of(recorder)
    loops.observe(None, body(), memo={})  # the initial listing
    await eventually(lambda: recorder.started == ["sync"])
    assert loops.running(KEY) == {"sync"}
    loops.observe("MODIFIED", body(autoscaling={"maxReplicas": 2}), memo={})
    await eventually(lambda: sorted(recorder.started) == ["autoscale", "sync"])
    loops.observe("MODIFIED", body(autoscaling={"maxReplicas": 3}), memo={})
    await asyncio.sleep(0)
    assert sorted(recorder.started) == ["autoscale", "sync"]  # not started twice
    await loops.stop_all()


async def test_each_loop_reads_the_latest_body() -> None:
    recorder = Recorder()
    loops = loops_of(recorder)
    loops.observe("ADDED", body(replicas=1), memo={})
    await eventually(lambda: "sync" in recorder.bodies)
    loops.observe("MODIFIED", body(replicas=3), memo={})
    assert recorder.bodies["sync"]["spec"] == {"replicas": 3}
    await loops.stop_all()


async def test_a_loop_the_spec_no_longer_asks_for_is_stopped() -> None:
    recorder = Recorder()
    loops = loops_of(recorder)
    loops.observe("ADDED", body(autoscaling={"maxReplicas": 2}), memo={})
    await eventually(lambda: len(recorder.started) == 2)
    loops.observe("MODIFIED", body(), memo={})
    await eventually(lambda: recorder.ended == ["autoscale"])
    assert loops.running(KEY) == {"sync"}
    await loops.stop_all()


async def test_deletion_stops_every_loop_of_the_object() -> None:
    for event, deleted in (("MODIFIED", body(deleting=True)), ("DELETED", body())):
        recorder = Recorder()
        loops = loops_of(recorder)
        loops.observe("ADDED", body(autoscaling={"maxReplicas": 2}), memo={})
        await eventually(lambda: len(recorder.started) == 2)  # noqa: B023
        loops.observe(event, deleted, memo={})
        await eventually(lambda: sorted(recorder.ended) == ["autoscale", "sync"])  # noqa: B023
        assert loops.running(KEY) == set()
        # Later events of the dying object start nothing.
        loops.observe("MODIFIED", body(deleting=True), memo={})
        assert loops.running(KEY) == set()


async def test_an_object_created_again_under_the_same_name_gets_fresh_loops() -> None:
    recorder = Recorder()
    loops = loops_of(recorder)
    loops.observe("ADDED", body(uid="u1"), memo={})
    await eventually(lambda: recorder.started == ["sync"])
    loops.observe("ADDED", body(uid="u2"), memo={})  # its DELETED event was missed
    await eventually(lambda: recorder.started == ["sync", "sync"] and recorder.ended == ["sync"])
    await loops.stop_all()


async def test_a_loop_that_ignores_its_stop_flag_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def stubborn(live: Any, memo: Any, stopped: Stopped, logger: Any) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    loops = Loops((Loop("sync", stubborn),), cancellation_timeout=0.05)
    loops.observe("ADDED", body(), memo={})
    await asyncio.sleep(0)
    loops.observe("DELETED", body(), memo={})
    await asyncio.wait_for(cancelled.wait(), timeout=10)
    await loops.stop_all()


async def test_a_crashed_loop_runs_again() -> None:
    runs: list[int] = []

    async def flaky(live: Any, memo: Any, stopped: Stopped, logger: Any) -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise RuntimeError("a bug")
        await stopped.wait()

    loops = Loops((Loop("sync", flaky),), restart_delay=0.01)
    loops.observe("ADDED", body(), memo={})
    await eventually(lambda: runs == [0, 1])
    assert loops.running(KEY) == {"sync"}
    await loops.stop_all()
    assert loops.running(KEY) == set()


async def test_stop_all_waits_for_every_loop_to_end() -> None:
    recorder = Recorder()
    loops = loops_of(recorder)
    loops.observe("ADDED", body(autoscaling={"maxReplicas": 2}), memo={})
    await eventually(lambda: len(recorder.started) == 2)
    await loops.stop_all()
    assert sorted(recorder.ended) == ["autoscale", "sync"]
