"""The plain numbers the engine produces each step for its stat loggers.

Field names follow vLLM's V0 `Stats` so that stat loggers written for vLLM read them unchanged:
`_sys` fields are the system state at `now`, `_iter` fields cover this iteration only, and `_requests`
fields are parallel lists with one entry per request that finished in this iteration.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol


@dataclass
class Stats:
    now: float  # time.time() when the stats were taken

    # System state.
    num_running_sys: int = 0
    num_waiting_sys: int = 0
    num_swapped_sys: int = 0
    gpu_cache_usage_sys: float = 0.0  # fraction of the KV cache blocks in use
    cpu_cache_usage_sys: float = 0.0  # fraction of the swap space in use
    gpu_prefix_cache_hit_rate: float = 0.0  # prompt tokens found in the prefix cache / prompt tokens looked up
    cpu_prefix_cache_hit_rate: float = 0.0

    # This iteration.
    num_prompt_tokens_iter: int = 0
    num_generation_tokens_iter: int = 0
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    time_per_output_tokens_iter: list[float] = field(default_factory=list)
    num_preemption_iter: int = 0

    # Requests that finished in this iteration, one entry each.
    time_e2e_requests: list[float] = field(default_factory=list)
    time_queue_requests: list[float] = field(default_factory=list)
    time_inference_requests: list[float] = field(default_factory=list)
    time_prefill_requests: list[float] = field(default_factory=list)
    time_decode_requests: list[float] = field(default_factory=list)
    num_prompt_tokens_requests: list[int] = field(default_factory=list)
    num_generation_tokens_requests: list[int] = field(default_factory=list)
    max_num_generation_tokens_requests: list[int] = field(default_factory=list)
    n_requests: list[int] = field(default_factory=list)
    max_tokens_requests: list[int] = field(default_factory=list)
    finished_reason_requests: list[str] = field(default_factory=list)

    # LoRA adapters of the running and waiting requests, and the most that can be active at once.
    running_lora_adapters: list[str] = field(default_factory=list)
    waiting_lora_adapters: list[str] = field(default_factory=list)
    max_lora: str = "0"

    spec_decode_metrics: Optional["SpecDecodeStats"] = None  # running totals since start

    @property
    def num_tokens_iter(self) -> int:
        return self.num_prompt_tokens_iter + self.num_generation_tokens_iter


@dataclass
class SpecDecodeStats:
    """Speculative decoding's running totals, with the names vLLM's Prometheus metrics read: tokens proposed
    and verified, proposals accepted, tokens emitted by verifying steps (accepted plus the target's own)."""

    num_spec_tokens: int
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    max_emitted_tokens: int = 0  # what the verifying steps would emit had every proposal been accepted

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def system_efficiency(self) -> float:
        return self.emitted_tokens / self.max_emitted_tokens if self.max_emitted_tokens else 0.0

    def __str__(self) -> str:
        return (f"Draft acceptance rate: {self.draft_acceptance_rate:.3f}, System efficiency: "
                f"{self.system_efficiency:.3f}, Number of speculative tokens: {self.num_spec_tokens}, Number of "
                f"accepted tokens: {self.accepted_tokens}, Number of draft tokens: {self.draft_tokens}, Number of "
                f"emitted tokens: {self.emitted_tokens}.")


class SupportsMetricsInfo(Protocol):
    def metrics_info(self) -> dict[str, str]:
        ...


@dataclass(frozen=True)
class CacheMetricsInfo:
    """The cache settings plus the block counts found at start, as `vllm:cache_config_info` labels."""

    cache_config: Any
    num_gpu_blocks: int
    num_cpu_blocks: int = 0

    def metrics_info(self) -> dict[str, str]:
        info = {f.name: str(getattr(self.cache_config, f.name)) for f in dataclasses.fields(self.cache_config)}
        info.update(num_gpu_blocks=str(self.num_gpu_blocks), num_cpu_blocks=str(self.num_cpu_blocks))
        return info
