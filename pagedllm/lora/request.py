"""A request's LoRA adapter: the name users see, the id the engine keys it by, and where its files are."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True, eq=False)
class LoRARequest:
    """An adapter in PEFT's format in the folder `lora_path`. `lora_int_id` (at least 1) identifies it
    everywhere: in the workers' slots and caches and in the prefix cache's block keys, so two adapters
    must never share an id."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_local_path: Optional[str] = field(default=None, repr=False)
    long_lora_max_len: Optional[int] = None
    base_model_name: Optional[str] = None

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        if self.long_lora_max_len is not None:
            raise ValueError("long_lora_max_len is not supported by pagedllm: long-context LoRA is not implemented.")
        if not self.lora_path and self.lora_local_path:
            object.__setattr__(self, "lora_path", self.lora_local_path)
        if not self.lora_path:
            raise ValueError("lora_path must name the adapter's folder.")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    # Equal by name, as vLLM's: the server looks adapters up by the name a request gives.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
