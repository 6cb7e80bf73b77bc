"""A worker's adapters: a host cache of up to `max_cpu_loras` read adapters and `max_loras` slots in the model's
layers, both evicting the least recently used; each step maps its rows to their adapters' slots.

A pinned adapter stays in the host cache and keeps its slot while any other slot can be given up; the
scheduler lets at most `max_loras` adapters into a step, so a step always finds slots for all of its own.
An adapter a request needs but the host cache no longer holds is read again from the request's path.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional, Sequence

import torch
from torch import nn

from pagedllm.config import LoRAConfig
from pagedllm.lora.layers import LoRALinear, LoRAStep
from pagedllm.lora.peft import LoRAAdapter, read_adapter
from pagedllm.lora.request import LoRARequest


class LoRAManager:
    def __init__(self, model: nn.Module, config: LoRAConfig, hf_config: Any, device: torch.device) -> None:
        self.config, self.hf_config, self.device = config, hf_config, device
        self.step = LoRAStep()
        self.targets: dict[str, tuple[LoRALinear, int]] = {}  # checkpoint projection name -> (slots, shard)
        wrapped: dict[int, LoRALinear] = {}
        for name, (layer, shard) in model.lora_targets().items():
            if id(layer) not in wrapped:
                wrapped[id(layer)] = layer.lora = LoRALinear(layer, self.step, config.max_loras,
                                                             config.max_lora_rank, config.lora_dtype, device)
            self.targets[name] = (wrapped[id(layer)], shard)
        self.linears = list(wrapped.values())
        self.host: OrderedDict[int, LoRAAdapter] = OrderedDict()  # least recently used first
        self.slots: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, least recently used first
        self.pinned: set[int] = set()

    def attach(self, model: nn.Module) -> None:
        """Hook the slots into the layers of a reloaded copy of the model (sleep mode's level 2)."""
        for name, (layer, _) in model.lora_targets().items():
            linear = self.targets[name][0]
            linear.layer, layer.lora = layer, linear

    # --- the engine's calls (collective_rpc) ------------------------------------------------------------------

    def add(self, request: LoRARequest) -> bool:
        """Read the adapter into the host cache; False if it is there already."""
        if request.lora_int_id in self.host:
            self.host.move_to_end(request.lora_int_id)
            return False
        adapter = read_adapter(request, self.config.max_lora_rank, self.hf_config, self.config.lora_dtype)
        evictable = [i for i in self.host if i not in self.pinned]
        if len(self.host) >= self.config.max_cpu_loras and evictable:
            del self.host[evictable[0]]
        self.host[request.lora_int_id] = adapter
        return True

    def remove(self, lora_id: int) -> bool:
        self.pinned.discard(lora_id)
        slot = self.slots.pop(lora_id, None)
        if slot is not None:
            for linear in self.linears:
                linear.clear(slot)
        return self.host.pop(lora_id, None) is not None

    def pin(self, lora_id: int) -> bool:
        if lora_id not in self.host:
            raise ValueError(f"LoRA adapter {lora_id} is not loaded: add it before pinning it.")
        self.pinned.add(lora_id)
        return True

    def list(self) -> set[int]:
        return set(self.host)

    # --- each step ------------------------------------------------------------------------------------------

    def prepare(self, requests: Sequence[Any], num_tokens: Sequence[int], starts: Sequence[int]) -> bool:
        """Give each adapter of this step's rows a slot and map the rows (request i has num_tokens[i] rows from
        starts[i]) to it; whether any row uses an adapter."""
        rows: dict[int, list[int]] = {}
        in_use: set[int] = set()
        for request, n, start in zip(requests, num_tokens, starts):
            if request.lora_request is not None:
                slot = self._activate(request.lora_request, in_use)
                rows.setdefault(slot, []).extend(range(start, start + n))
        self._lay_out(rows, sum(num_tokens))
        return self.step.active

    def _activate(self, request: LoRARequest, in_use: set[int]) -> int:
        lora_id = request.lora_int_id
        in_use.add(lora_id)
        if lora_id in self.slots:
            self.slots.move_to_end(lora_id)
            return self.slots[lora_id]
        self.add(request)  # back from its path if the host cache let it go
        slot = self._free_slot(in_use)
        for linear in self.linears:
            linear.clear(slot)
        for name, weights in self.host[lora_id].weights.items():
            target = self.targets.get(name)
            if target is not None:  # another pipeline stage's layer otherwise
                target[0].load(slot, target[1], weights)
        self.slots[lora_id] = slot
        return slot

    def _free_slot(self, in_use: set[int]) -> int:
        """An empty slot, else the slot of the least recently used adapter this step does not use (unpinned
        ones first)."""
        taken = set(self.slots.values())
        free = [s for s in range(self.config.max_loras) if s not in taken]
        if free:
            return free[0]
        candidates = [i for i in self.slots if i not in in_use]
        victim: Optional[int] = next((i for i in candidates if i not in self.pinned), None)
        if victim is None and candidates:
            victim = candidates[0]
        if victim is None:
            raise RuntimeError(f"A step uses more than max_loras ({self.config.max_loras}) LoRA adapters.")
        return self.slots.pop(victim)

    def _lay_out(self, rows: dict[int, list[int]], num_rows: int) -> None:
        """The step's rows by slot as LoRAStep describes them."""
        step = self.step
        step.active, step.whole = bool(rows), None
        if not rows:
            return
        if len(rows) == 1 and len(next(iter(rows.values()))) == num_rows:
            step.whole = next(iter(rows))
            return
        slots = sorted(rows)
        width = max(len(r) for r in rows.values())
        gather = torch.tensor([rows[s] + [rows[s][0]] * (width - len(rows[s])) for s in slots])
        mask = torch.tensor([[1.0] * len(rows[s]) + [0.0] * (width - len(rows[s])) for s in slots])
        step.gather = gather.to(self.device)
        step.mask = mask.to(self.device, self.config.lora_dtype).unsqueeze(-1)
        every_slot = slots == list(range(self.config.max_loras))
        step.slots = None if every_slot else torch.tensor(slots, device=self.device)
