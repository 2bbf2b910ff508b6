"""The shared-memory broadcast ring: every reader gets every message, in
order, whatever its size; a full ring holds the writer back; a dead peer is
noticed instead of waited for; nothing is left in /dev/shm."""

import multiprocessing
import os
from pathlib import Path

import pytest
from pagoda.runtime.distributed.shm_broadcast import (
    BroadcastReader,
    BroadcastTimeout,
    BroadcastWriter,
)

MESSAGES = [1, b"x" * 5000, {"ids": list(range(3000))}, b"", "short", None]


def read_all(handle, index, count, out):
    reader = BroadcastReader(handle, index)
    out.put((index, [reader.recv(timeout=30) for _ in range(count)]))
    reader.close()


def test_every_reader_gets_every_message_in_order_across_chunks():
    # fork: the reader function lives in this test module, which a spawned
    # child could not import.
    ctx = multiprocessing.get_context("fork")
    # Slots of 1 KiB: most messages span several chunks, some more than the ring.
    writer = BroadcastWriter(num_readers=3, num_slots=4, slot_bytes=1024)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=read_all, args=(writer.handle, i, len(MESSAGES) * 5, out))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    for _ in range(5):
        for message in MESSAGES:
            writer.send(message, timeout=30)
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    writer.close()
    assert all(results[i] == MESSAGES * 5 for i in range(3))


def test_a_full_ring_holds_the_writer_until_readers_consume():
    writer = BroadcastWriter(num_readers=1, num_slots=2, slot_bytes=64)
    reader = BroadcastReader(writer.handle, 0)
    writer.send("a", timeout=1)
    writer.send("b", timeout=1)
    with pytest.raises(BroadcastTimeout):
        writer.send("c", timeout=0.2)  # both slots still unread
    assert reader.recv(timeout=1) == "a"
    writer.send("c", timeout=1)
    assert [reader.recv(timeout=1), reader.recv(timeout=1)] == ["b", "c"]
    reader.close()
    writer.close()


def test_a_reader_stops_waiting_when_its_writer_is_gone():
    writer = BroadcastWriter(num_readers=1)
    reader = BroadcastReader(writer.handle, 0)
    with pytest.raises(BroadcastTimeout, match="gone"):
        reader.recv(alive=lambda: False)
    reader.close()
    writer.close()


def test_close_removes_the_shared_memory():
    writer = BroadcastWriter(num_readers=2, num_slots=2, slot_bytes=4096)
    path = Path("/dev/shm") / writer.handle.name.lstrip("/")
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    assert path.exists()
    writer.close()
    assert not path.exists()
    assert os.getpid()  # the writer process is fine afterwards
