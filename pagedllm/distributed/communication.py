"""The collectives a sharded model runs: within a pipeline stage's tensor-parallel ranks, and from one stage
to the next. With one rank (tensor) or one stage (pipeline) nothing is ever sent: every call returns at once,
so the single-process model pays nothing for them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _get_current_dispatch_mode

from pagedllm.distributed.ranks import ParallelRanks
from pagedllm.distributed.shared_memory_reduce import SharedMemoryAllReduce


class IntermediateTensors(NamedTuple):
    """What a pipeline stage hands the next: hidden states and the residual stream, each [T, hidden]."""

    hidden: torch.Tensor
    residual: torch.Tensor


class TensorParallelGroup:
    """The ranks of one pipeline stage, which hold slices of the same layers."""

    def __init__(self, rank: int = 0, size: int = 1, group: Optional[dist.ProcessGroup] = None,
                 first_global_rank: int = 0, shared_memory: Optional[SharedMemoryAllReduce] = None) -> None:
        self.rank, self.size, self.group = rank, size, group
        self.first_global_rank = first_global_rank  # where gather() delivers
        self.shared_memory = shared_memory  # float32 sums on CPU where all ranks share a machine

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the group's ranks, in place."""
        if self.size == 1:
            return x
        # Under a dispatch mode (a CPU graph's capture) the sum goes to torch.distributed, which the capture sees
        # and refuses: a replay would leave out a call it cannot see.
        if (self.shared_memory is not None and x.dtype == torch.float32 and x.device.type == "cpu"
                and _get_current_dispatch_mode() is None):
            return self.shared_memory(x)
        dist.all_reduce(x, group=self.group)
        return x

    def gather(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Every rank's x [N, n] side by side, [N, size * n], on TP rank 0; None on the others."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=self.first_global_rank, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else None


class PipelineChannel:
    """Point-to-point links to the same TP rank of the previous and the next stage. Each message is a small
    header with its shape, then the tensors stacked into one, so the receiver needs to know nothing but the
    dtype in advance."""

    def __init__(self, previous_rank: Optional[int] = None, next_rank: Optional[int] = None,
                 device: torch.device = torch.device("cpu")) -> None:
        self.previous_rank, self.next_rank, self.device = previous_rank, next_rank, device

    def send(self, tensors: IntermediateTensors) -> None:
        """Hand this stage's output to the next stage (blocks until it is taken)."""
        payload = torch.stack(tuple(tensors))
        dist.send(torch.tensor(payload.shape, dtype=torch.long, device=self.device), self.next_rank)
        dist.send(payload, self.next_rank)

    def recv(self, dtype: torch.dtype) -> IntermediateTensors:
        """The previous stage's output for this forward pass."""
        shape = torch.empty(3, dtype=torch.long, device=self.device)
        dist.recv(shape, self.previous_rank)
        payload = torch.empty(*shape.tolist(), dtype=dtype, device=self.device)
        dist.recv(payload, self.previous_rank)
        return IntermediateTensors(*payload.unbind(0))


@dataclass(frozen=True)
class ParallelContext:
    """A worker's ranks and its links to the others, handed to the model it builds."""

    ranks: ParallelRanks
    tp: TensorParallelGroup
    pipeline: PipelineChannel


SINGLE_PROCESS = ParallelContext(ParallelRanks(), TensorParallelGroup(), PipelineChannel())
