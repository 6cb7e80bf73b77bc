"""The engine's LoRA calls: vLLM's add_lora, remove_lora, list_loras and pin_lora, each a collective_rpc so that
every worker (under mp, Ray and tensor parallelism) holds the same adapters.

An adapter is read and checked in the engine's process before any worker sees it: a bad one (missing files,
rank above max_lora_rank, unknown target module) is a ValueError for that request or call, while a worker's
failure would stop the engine.
"""
from __future__ import annotations

from typing import Any

from pagedllm.lora.peft import read_adapter
from pagedllm.lora.request import LoRARequest


class LoRAEngineMixin:
    """Mixed into LLMEngine, which provides `config` and `collective_rpc`."""

    config: Any
    _checked_loras: dict[int, str]  # adapter id -> the path it was checked at

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read the adapter into every worker's host cache; False if it was there already."""
        self.check_lora_request(lora_request)
        return all(self.collective_rpc("add_lora", args=(lora_request,)))

    def remove_lora(self, lora_id: int) -> bool:
        self._require_lora()
        self._checked_loras.pop(lora_id, None)
        return all(self.collective_rpc("remove_lora", args=(lora_id,)))

    def list_loras(self) -> set[int]:
        """The ids of the adapters the workers hold read."""
        self._require_lora()
        return set.intersection(*self.collective_rpc("list_loras"))

    def pin_lora(self, lora_id: int) -> bool:
        """Keep an added adapter in the workers' host cache and, while another slot can be freed, in its slot."""
        if lora_id not in self.list_loras():
            raise ValueError(f"LoRA adapter {lora_id} is not loaded: add it with add_lora before pinning it.")
        return all(self.collective_rpc("pin_lora", args=(lora_id,)))

    def check_lora_request(self, lora_request: Any) -> None:
        """Raise a ValueError naming the problem if the adapter cannot be applied to this model."""
        self._require_lora(lora_request)
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}.")
        if self._checked_loras.get(lora_request.lora_int_id) == lora_request.lora_path:
            return
        config = self.config.lora_config
        read_adapter(lora_request, config.max_lora_rank, self.config.model_config.hf_config, config.lora_dtype)
        self._checked_loras[lora_request.lora_int_id] = lora_request.lora_path

    def _require_lora(self, lora_request: Any = None) -> None:
        if self.config.lora_config is None:
            what = f"Got lora_request {lora_request}" if lora_request is not None else "Got a LoRA call"
            raise ValueError(f"{what} but LoRA is not enabled!")
