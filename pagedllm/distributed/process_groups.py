"""Start and stop torch.distributed for one worker: gloo on CPU, NCCL on CUDA."""
from __future__ import annotations

import datetime
import socket
from typing import Optional, Union

import torch
import torch.distributed as dist

from pagedllm.distributed.communication import (SINGLE_PROCESS, ParallelContext, PipelineChannel,
                                                TensorParallelGroup)
from pagedllm.distributed.ranks import ParallelRanks
from pagedllm.distributed.shared_memory_reduce import SharedMemoryAllReduce


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now; the OS picks it, so parallel launches do not collide."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(ranks: ParallelRanks, init_method: str, device: Union[str, torch.device] = "cpu",
                     backend: Optional[str] = None, timeout_s: float = 600.0) -> ParallelContext:
    """Join the workers' process group at `init_method` (e.g. tcp://127.0.0.1:PORT) and build this worker's
    groups. Every worker calls it at once with its own ranks. A world of one starts nothing."""
    if ranks.world_size == 1:
        return SINGLE_PROCESS
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend or ("nccl" if device.type == "cuda" else "gloo"), init_method=init_method,
                            rank=ranks.rank, world_size=ranks.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    tp_group, shared_memory = None, None
    first_stage_rank = ranks.stage_ranks(ranks.pp_rank)[0]
    if ranks.tp_size > 1:
        # new_group is collective over the whole world: every worker creates every stage's group, in order.
        groups = [dist.new_group(ranks.stage_ranks(stage)) for stage in range(ranks.pp_size)]
        tp_group = groups[ranks.pp_rank]
        if device.type == "cpu":
            shared_memory = SharedMemoryAllReduce.create(tp_group, ranks.tp_rank, ranks.tp_size, first_stage_rank,
                                                         timeout_s)
    tp = TensorParallelGroup(ranks.tp_rank, ranks.tp_size, tp_group, first_stage_rank, shared_memory)
    previous_rank = None if ranks.is_first_stage else ranks.rank - ranks.tp_size
    next_rank = None if ranks.is_last_stage else ranks.rank + ranks.tp_size
    return ParallelContext(ranks, tp, PipelineChannel(previous_rank, next_rank, device))


def destroy_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()
