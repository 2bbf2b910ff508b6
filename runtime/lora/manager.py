"""A worker's adapters: loaded ones in host memory (LRU, `max_cpu_loras`),
active ones in the model's `max_loras` slots.

Each step the model runner asks `prepare` for a slot per adapter of the
step (the scheduler never schedules more than `max_loras` of them), then
sets the token -> slot mapping every LoRA layer reads. A slot is reused by
the adapter it holds; a new adapter takes a free slot, else the least
recently used one that this step does not need.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch
from pagoda.runtime.config import LoRAConfig
from pagoda.runtime.lora.layers import LORA_TARGETS, LinearWithLoRA, LoRABatch, wrap_with_lora
from pagoda.runtime.lora.peft import LoRAAdapter, load_peft_adapter
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.models.arch_config import ModelArchConfig
from torch import nn

logger = logging.getLogger(__name__)


class LoRAManager:
    def __init__(
        self, model: nn.Module, config: LoRAConfig, arch: ModelArchConfig, use_triton: bool
    ):
        self.config = config
        self.arch = arch
        self.batch = LoRABatch(use_triton=use_triton)
        # layer index -> attribute path -> wrapper
        self.layers: list[dict[str, LinearWithLoRA]] = []
        for decoder_layer in model.model.layers:
            wrapped = {}
            for path in dict.fromkeys(p for p, _ in LORA_TARGETS.values()):
                parent_name, attr = path.split(".")
                parent = getattr(decoder_layer, parent_name)
                wrapper = wrap_with_lora(
                    getattr(parent, attr), self.batch, config.max_loras, config.max_lora_rank
                )
                setattr(parent, attr, wrapper)
                wrapped[path] = wrapper
            self.layers.append(wrapped)
        self.adapters: OrderedDict[int, LoRAAdapter] = OrderedDict()  # LRU: oldest first
        self.requests: dict[int, LoRARequest] = {}
        self.slots: list[int | None] = [None] * config.max_loras  # lora_int_id per slot
        self.slot_lru: list[int] = list(range(config.max_loras))  # oldest first

    # -- adapters in host memory ------------------------------------------------

    def add_adapter(self, request: LoRARequest) -> LoRAAdapter:
        """Load (or refresh in the LRU) an adapter; raises AdapterError."""
        adapter = self.adapters.get(request.lora_int_id)
        if adapter is None:
            adapter = load_peft_adapter(request.lora_path, self.arch, self.config.max_lora_rank)
            self.adapters[request.lora_int_id] = adapter
            self.requests[request.lora_int_id] = request
            logger.info(
                "Loaded LoRA adapter %r (id %d, rank %d, %s) from %s",
                request.lora_name,
                request.lora_int_id,
                adapter.rank,
                ", ".join(sorted(adapter.target_modules)),
                request.lora_path,
            )
        self.adapters.move_to_end(request.lora_int_id)
        self._evict()
        return adapter

    def remove_adapter(self, lora_int_id: int) -> bool:
        """Forget an adapter (its slot is freed too); False if unknown."""
        known = self.adapters.pop(lora_int_id, None) is not None
        self.requests.pop(lora_int_id, None)
        if lora_int_id in self.slots:
            self.slots[self.slots.index(lora_int_id)] = None
            known = True
        return known

    def list_adapters(self) -> list[int]:
        return list(self.adapters)

    def _evict(self) -> None:
        # Adapters in a slot stay: their weights are in use, and a request
        # of theirs may be mid-generation.
        while len(self.adapters) > self.config.max_cpu_loras:
            victim = next((i for i in self.adapters if i not in self.slots), None)
            if victim is None:
                return
            del self.adapters[victim]

    # -- one step -------------------------------------------------------------

    def prepare(self, requests: list[LoRARequest]) -> dict[int, int]:
        """A slot for each adapter of the step: lora_int_id -> slot."""
        needed = {r.lora_int_id: r for r in requests}
        assert len(needed) <= len(self.slots), "the scheduler admits at most max_loras adapters"
        mapping = {}
        for lora_id in needed:
            if lora_id in self.slots:
                mapping[lora_id] = self.slots.index(lora_id)
        for lora_id, request in needed.items():
            if lora_id in mapping:
                continue
            slot = next(
                s for s in self.slot_lru if self.slots[s] is None or self.slots[s] not in needed
            )
            self._load_slot(slot, self.add_adapter(request))
            self.slots[slot] = lora_id
            mapping[lora_id] = slot
        for slot in mapping.values():
            self.slot_lru.remove(slot)
            self.slot_lru.append(slot)
        return mapping

    def set_token_slots(self, token_slots: torch.Tensor | None) -> None:
        self.batch.token_slots = token_slots

    def _load_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        for index, wrapped in enumerate(self.layers):
            per_path: dict[str, dict] = {}
            for module, (path, shard_id) in LORA_TARGETS.items():
                weights = adapter.weights.get((index, module))
                if weights is not None:
                    per_path.setdefault(path, {})[shard_id] = weights
            for path, wrapper in wrapped.items():
                wrapper.set_slot(slot, per_path.get(path, {}))
