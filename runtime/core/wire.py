"""msgspec (msgpack) encoding of the messages between the API server process
and the EngineCore process.

The message classes stay plain dataclasses in `core/outputs.py` (msgspec
encodes and decodes dataclasses natively), so the offline engine never imports
msgspec. Every message is a ZMQ multipart: one type byte, then payload frames.
"""

from __future__ import annotations

import msgspec
from pagoda.runtime.core.outputs import EngineCoreOutputs, EngineCoreRequest
from pagoda.runtime.lora.request import LoRARequest

# API server -> EngineCore.
ADD = b"\x00"
ABORT = b"\x01"
SHUTDOWN = b"\x02"
UTILITY = b"\x03"  # a call of an EngineCore method (load an adapter, say); payload: UtilityCall
# EngineCore -> API server.
OUTPUTS = b"\x10"
READY = b"\x11"
FAILED = b"\x12"  # start-up failed or the busy loop died; payload: the error text
HEARTBEAT = b"\x13"
UTILITY_RESULT = b"\x14"  # the answer to one UTILITY; payload: UtilityResult  # every second, whatever the load; payload: Heartbeat


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


# The EngineCore methods the front end may call between steps.
UTILITY_METHODS = frozenset({"add_lora", "remove_lora"})


class UtilityCall(msgspec.Struct):
    call_id: int
    method: str
    lora_request: LoRARequest | None = None
    lora_int_id: int = 0


class UtilityResult(msgspec.Struct):
    """`error` is None on success; `param` names the refused field (the
    caller's mistake: a 400, and the engine serves on)."""

    call_id: int
    error: str | None = None
    param: str | None = None


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
        self._utility = msgspec.msgpack.Decoder(UtilityCall)

    def decode(self, frames: list[bytes]) -> tuple[bytes, object]:
        """Raises (msgspec.DecodeError, ValueError, IndexError) on a malformed message."""
        kind = frames[0]
        if kind == ADD:
            return kind, self._request.decode(frames[1])
        if kind == ABORT:
            return kind, self._ids.decode(frames[1])
        if kind == SHUTDOWN:
            return kind, None
        if kind == UTILITY:
            return kind, self._utility.decode(frames[1])
        raise ValueError(f"unknown message type {kind!r}")


class CoreOutputDecoder:
    """Decodes what the front end receives from the engine core."""

    def __init__(self) -> None:
        self._outputs = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._ready = msgspec.msgpack.Decoder(ReadyInfo)
        self._heartbeat = msgspec.msgpack.Decoder(Heartbeat)
        self._utility = msgspec.msgpack.Decoder(UtilityResult)

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
        if kind == UTILITY_RESULT:
            return kind, self._utility.decode(frames[1])
        raise ValueError(f"unknown message type {kind!r}")
