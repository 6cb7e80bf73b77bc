"""LoRA adapters: requests naming them, PEFT checkpoints read into per-projection weights, and the worker's slots
that apply several adapters to the rows of one batch."""
from pagedllm.lora.request import LoRARequest

__all__ = ["LoRARequest"]
