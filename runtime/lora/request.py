"""Which adapter a request runs with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter, as a request names it (vLLM's shape).

    `lora_int_id` identifies these exact weights: loading another folder
    under the same name gives a new id, so requests in flight keep the old
    weights, new ones get the new, and the two never share prefix-cache
    blocks (the id is part of every block key).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be at least 1, got {self.lora_int_id}")
