"""The proposers' interface, and the one a speculative config asks for."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Optional

import torch
from torch import nn

from pagedllm.config import EngineConfig
from pagedllm.worker.input_state import WorkerRequest

# A request that sampled this step and its tokens with the new ones appended (the worker's copy of it gets
# them only with the next step).
DraftContext = tuple[WorkerRequest, list[int]]


class Proposer(ABC):
    """Proposes each request's next tokens after a step, on the worker that samples."""

    @abstractmethod
    def propose(self, contexts: list[DraftContext], num_tokens: int) -> dict[str, list[int]]:
        """Up to `num_tokens` proposed next tokens per request (none is a valid answer)."""

    def block_bytes(self) -> int:
        """Bytes of KV cache the proposer keeps per block of the target's cache."""
        return 0

    def initialize_cache(self, num_blocks: int, target_kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Allocate any cache of its own, block for block with the target's (same ids, same slots), or use the
        target's (`target_kv_caches`, one (keys, values) per layer)."""

    def release_cache(self) -> None:
        """Drop its KV cache, or its hold on the target's (sleep mode)."""

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop what it keeps of finished or preempted requests."""

    def release_weights(self, level: int) -> None:
        """Release any model weights of its own (sleep mode): level 1 keeps a copy to restore, level 2 none."""

    def restore_weights(self) -> None:
        """Bring back what `release_weights` released."""


def build_proposer(config: EngineConfig, device: torch.device, whole_target: Optional[nn.Module]) -> Proposer:
    """`whole_target`: the target model where this worker holds all of its layers and KV heads (no parallelism),
    so that a self-draft can read and write the target's own KV cache; else None."""
    spec = config.speculative_config
    if spec.method == "ngram":
        from pagedllm.spec_decode.ngram import NgramProposer

        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    from pagedllm.spec_decode.draft_model import DraftModelProposer, warn_unless_cheaper

    proposer = DraftModelProposer(config, device, share_target_cache=whole_target is not None and spec.model is None)
    if whole_target is not None:
        warn_unless_cheaper(proposer.model, whole_target)
    return proposer
