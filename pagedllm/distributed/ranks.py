"""Where one worker sits among the tensor- and pipeline-parallel ranks."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelRanks:
    """A worker's tensor-parallel rank within its pipeline stage and its stage. Global ranks follow vLLM's
    layout, rank = pp_rank * tp_size + tp_rank: the ranks of one stage are consecutive."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def __post_init__(self) -> None:
        for size in ("tp_size", "pp_size"):
            if getattr(self, size) < 1:
                raise ValueError(f"{size} must be at least 1, got {getattr(self, size)}.")
        for rank, size in (("tp_rank", "tp_size"), ("pp_rank", "pp_size")):
            if not 0 <= getattr(self, rank) < getattr(self, size):
                raise ValueError(f"{rank} must be in [0, {size}={getattr(self, size)}), got {getattr(self, rank)}.")

    @classmethod
    def from_rank(cls, rank: int, tp_size: int, pp_size: int) -> ParallelRanks:
        if not 0 <= rank < tp_size * pp_size:
            raise ValueError(f"rank must be in [0, world_size={tp_size * pp_size}), got {rank}.")
        return cls(rank % tp_size, tp_size, rank // tp_size, pp_size)

    @property
    def rank(self) -> int:
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_output_rank(self) -> bool:
        """TP rank 0 of the last stage: the one rank that gets the full logits (and samples)."""
        return self.tp_rank == 0 and self.is_last_stage

    def stage_ranks(self, pp_rank: int) -> list[int]:
        """The global ranks of a stage, in TP rank order."""
        return list(range(pp_rank * self.tp_size, (pp_rank + 1) * self.tp_size))
