"""The Worker's watch on the CUDA caching allocator's retries."""

import logging

import pytest
import torch
from pagoda.runtime.worker.worker import AllocatorRetryWatch


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_retries_are_read_once_an_interval_and_warned_once(caplog):
    clock, retries, reads = FakeClock(), [3], []

    def read() -> int:
        reads.append(clock.now)
        return retries[0]

    watch = AllocatorRetryWatch(read, interval_s=10.0, clock=clock)
    retries[0] = 5
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.worker.worker"):
        clock.now += 9.9
        assert watch.check() == 0  # not yet due: the stats are not read
        clock.now += 0.2
        assert watch.check() == 2  # the retries before the watch began do not count
        clock.now += 10.1
        assert watch.check() == 0  # none since
    assert reads == pytest.approx([100.0, 110.1, 120.2])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "retried 2 allocation(s) (5 in all)" in warnings[0]
    assert "--gpu-memory-utilization" in warnings[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_real_retry_is_counted():
    # Two blocks of ~40% each; free the first (it stays cached) and ask for
    # ~50%: it fits neither the cached block nor the device's free memory,
    # so the allocator frees its cache and retries.
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    watch = AllocatorRetryWatch(
        lambda: torch.cuda.memory_stats().get("num_alloc_retries", 0), interval_s=0.0
    )
    first = torch.empty(int(free * 0.4), dtype=torch.uint8, device="cuda")
    second = torch.empty(int(free * 0.4), dtype=torch.uint8, device="cuda")
    del first
    third = torch.empty(int(free * 0.5), dtype=torch.uint8, device="cuda")
    assert watch.check() >= 1
    del second, third
    torch.cuda.empty_cache()
