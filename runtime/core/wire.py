"""msgspec (msgpack) encoding of the messages between the API server process
and the EngineCore process.

The message classes stay plain dataclasses in `core/outputs.py` (msgspec
encodes and decodes dataclasses natively), so the offline engine never imports
msgspec. Every message is a ZMQ multipart: one type byte, then payload frames.
"""

from __future__ import annotations

import msgspec
from pagoda.runtime.core.outputs import EngineCoreOutputs, EngineCoreRequest

# API server -> EngineCore.
ADD = b"\x00"
ABORT = b"\x01"
SHUTDOWN = b"\x02"
# EngineCore -> API server.
OUTPUTS = b"\x10"
READY = b"\x11"
FAILED = b"\x12"  # start-up failed or the busy loop died; payload: the error text
HEARTBEAT = b"\x13"  # every second, whatever the load; payload: Heartbeat


class ReadyInfo(msgspec.Struct):
    """What the engine core tells the front end once it can take requests."""

    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int
    memory_summary: str


class Heartbeat(msgspec.Struct):
    """The core is alive; `stalled_s` is how long its busy loop has been in
    one iteration (one step, or one wait for input), so the front end can
    tell a slow step from a stuck one."""

    stalled_s: float


class Encoder:
    """One reusable msgpack encoder (it keeps an internal buffer)."""

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()

    def encode(self, obj: object) -> bytes:
        return self._enc.encode(obj)


class CoreInputDecoder:
    """Decodes what the engine core receives."""

    def __init__(self) -> None:
        self._request = msgspec.msgpack.Decoder(EngineCoreRequest)
        self._ids = msgspec.msgpack.Decoder(list[str])

    def decode(self, frames: list[bytes]) -> tuple[bytes, object]:
        """Raises (msgspec.DecodeError, ValueError, IndexError) on a malformed message."""
        kind = frames[0]
        if kind == ADD:
            return kind, self._request.decode(frames[1])
        if kind == ABORT:
            return kind, self._ids.decode(frames[1])
        if kind == SHUTDOWN:
            return kind, None
        raise ValueError(f"unknown message type {kind!r}")


class CoreOutputDecoder:
    """Decodes what the front end receives from the engine core."""

    def __init__(self) -> None:
        self._outputs = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._ready = msgspec.msgpack.Decoder(ReadyInfo)
        self._heartbeat = msgspec.msgpack.Decoder(Heartbeat)

    def decode(self, frames: list[bytes]) -> tuple[bytes, object]:
        kind = frames[0]
        if kind == OUTPUTS:
            return kind, self._outputs.decode(frames[1])
        if kind == READY:
            return kind, self._ready.decode(frames[1])
        if kind == FAILED:
            return kind, frames[1].decode("utf-8", "replace")
        if kind == HEARTBEAT:
            return kind, self._heartbeat.decode(frames[1])
        raise ValueError(f"unknown message type {kind!r}")
