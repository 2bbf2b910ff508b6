"""One writer, N readers: a ring of fixed-size slots in shared memory.

The engine core sends each step's `SchedulerOutput` to every tensor-parallel
worker through it (vLLM's `shm_broadcast.MessageQueue` plays this part).
Writing a slot is one memcpy, and a reader that is already waiting sees the
message without a system call, so a step costs microseconds rather than a
socket round trip per worker.

Layout of the shared block: `num_slots` slot headers (the sequence number of
the chunk written there, its length, and whether the message continues in
the next chunk), one "consumed up to" counter per reader, then the slots.
Chunk `k` goes to slot `k % num_slots`; the writer may overwrite a slot only
once every reader has consumed the chunk written there before. A message
longer than a slot is split into consecutive chunks, so any size passes
(bounded by back-pressure, never by the ring's capacity) and no second
channel is needed.

Memory ordering: a chunk's bytes are written before its sequence number, and
a reader reads the bytes only after it sees the number. x86-64 keeps stores
in order, which is what this relies on (as vLLM's queue does); counters are
aligned 8-byte integers, read and written whole.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

_HEADER_FIELDS = 3  # seq, length, continues


class BroadcastTimeout(TimeoutError):
    """Nothing arrived (reader) or a reader did not keep up (writer) in time."""


@dataclass(frozen=True)
class BroadcastHandle:
    """What a reader process needs to attach (picklable)."""

    name: str
    num_readers: int
    num_slots: int
    slot_bytes: int


class _Ring:
    def __init__(self, shm: shared_memory.SharedMemory, handle: BroadcastHandle):
        self.shm = shm
        self.handle = handle
        n, r = handle.num_slots, handle.num_readers
        buf = shm.buf
        self.headers = np.ndarray((n, _HEADER_FIELDS), dtype=np.int64, buffer=buf)
        self.consumed = np.ndarray((r,), dtype=np.int64, buffer=buf, offset=self.headers.nbytes)
        self.data_offset = self.headers.nbytes + self.consumed.nbytes
        self.buf = buf

    def slot(self, index: int) -> memoryview:
        start = self.data_offset + index * self.handle.slot_bytes
        return self.buf[start : start + self.handle.slot_bytes]

    def close(self) -> None:
        # numpy views pin the buffer: drop them before closing the mapping.
        del self.headers, self.consumed
        self.buf.release()
        self.shm.close()


def _wait(ready: Callable[[], bool], timeout: float | None, alive: Callable[[], bool]) -> None:
    """Spin briefly, then back off to short sleeps, until `ready()`.

    A busy worker sees the next step within microseconds; an idle one costs
    a wake-up every few milliseconds. `alive()` is asked every half second,
    so a reader whose writer died does not wait forever.
    """
    start = time.monotonic()
    spins = 0
    next_check = start + 0.5
    while not ready():
        spins += 1
        if spins < 2000:
            continue
        now = time.monotonic()
        if timeout is not None and now - start > timeout:
            raise BroadcastTimeout(f"nothing arrived in {timeout:.1f} s")
        if now > next_check:
            if not alive():
                raise BroadcastTimeout("the other side of the broadcast is gone")
            next_check = now + 0.5
        time.sleep(0 if now - start < 0.01 else 0.0005 if now - start < 1.0 else 0.005)


class BroadcastWriter:
    """The single writer; owns (creates and unlinks) the shared memory."""

    def __init__(self, num_readers: int, num_slots: int = 8, slot_bytes: int = 1 << 20):
        n = num_slots * _HEADER_FIELDS * 8 + num_readers * 8 + num_slots * slot_bytes
        shm = shared_memory.SharedMemory(create=True, size=n)
        self.handle = BroadcastHandle(shm.name, num_readers, num_slots, slot_bytes)
        self._ring = _Ring(shm, self.handle)
        self._ring.headers[:] = -1
        self._ring.consumed[:] = 0
        self._next = 0  # sequence number of the next chunk
        self.bytes_sent = 0
        self.messages_sent = 0

    def send(self, obj: object, timeout: float | None = None, alive=lambda: True) -> int:
        """Pickle `obj` and publish it to every reader; returns its size in bytes.

        Blocks while the ring is full (a reader behind); `alive()` is asked
        meanwhile so a dead reader raises instead of blocking forever.
        """
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        ring, size = self._ring, self.handle.slot_bytes
        num_slots = self.handle.num_slots
        chunks = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
        for i, chunk in enumerate(chunks):
            seq = self._next
            index = seq % num_slots
            # The chunk this slot held before must be consumed by every reader.
            _wait(lambda seq=seq: int(ring.consumed.min()) > seq - num_slots, timeout, alive)
            ring.slot(index)[: len(chunk)] = chunk
            header = ring.headers[index]
            header[1] = len(chunk)
            header[2] = int(i < len(chunks) - 1)
            header[0] = seq  # last: publishes the chunk
            self._next += 1
        self.bytes_sent += len(payload)
        self.messages_sent += 1
        return len(payload)

    def close(self) -> None:
        shm = self._ring.shm
        self._ring.close()
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()


class BroadcastReader:
    """One reader (a worker process), attached by name."""

    def __init__(self, handle: BroadcastHandle, reader_index: int):
        shm = _attach(handle.name)
        self._ring = _Ring(shm, handle)
        self.handle = handle
        self.index = reader_index
        self._next = int(self._ring.consumed[reader_index])

    def recv(self, timeout: float | None = None, alive=lambda: True) -> object:
        ring, num_slots = self._ring, self.handle.num_slots
        parts = []
        while True:
            seq = self._next
            header = ring.headers[seq % num_slots]
            _wait(lambda header=header, seq=seq: int(header[0]) == seq, timeout, alive)
            length, continues = int(header[1]), int(header[2])
            parts.append(bytes(ring.slot(seq % num_slots)[:length]))
            self._next += 1
            ring.consumed[self.index] = self._next
            if not continues:
                return pickle.loads(b"".join(parts))

    def close(self) -> None:
        self._ring.close()


def _attach(name: str) -> shared_memory.SharedMemory:
    """Open an existing block without adopting it: the writer owns and unlinks it.

    Before Python 3.13 attaching registers the name with the resource
    tracker; readers are spawned children of the writer and share its
    tracker, where the name is already registered, so that is harmless (and
    unregistering here would make the writer's unlink fail in the tracker).
    """
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    return shared_memory.SharedMemory(name=name)


def parent_alive(parent_pid: int) -> Callable[[], bool]:
    """A liveness test for `_wait`: the process that started us still is our parent."""
    return lambda: os.getppid() == parent_pid
