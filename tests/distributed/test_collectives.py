"""The tensor-parallel collectives over gloo and shared memory, and how they meet CPU graph capture. (Pipeline
sends and tensor-parallel groups within stages run in test_sharded_model.py's models.)"""
from __future__ import annotations

import os

import pytest
import torch

from pagedllm.distributed import SINGLE_PROCESS, ParallelContext, shared_memory_reduce
from pagedllm.distributed.shared_memory_reduce import SLOT_FLOATS, SharedMemoryAllReduce
from pagedllm.worker.cpu_graph import CaptureRefused, _OnlyKernels
from spawn import spawn_ranks


def _exercise_collectives(parallel: ParallelContext) -> None:
    tp = parallel.tp
    rank, size = tp.rank, tp.size
    x = torch.full((4,), float(rank + 1))
    # A CPU graph cannot replay an all-reduce: capture refuses it before it runs, on every rank alike, and
    # the group stays usable for the eager step that follows.
    with pytest.raises(CaptureRefused, match="allreduce"), torch.inference_mode(), _OnlyKernels():
        tp.all_reduce(x)
    assert torch.equal(x, torch.full((4,), float(rank + 1)))
    assert torch.equal(tp.all_reduce(x), torch.full((4,), 6.0))

    gathered = tp.gather(torch.full((2, 3), float(rank)))
    if rank == 0:
        assert torch.equal(gathered, torch.tensor([0.0, 1.0, 2.0]).repeat_interleave(3).expand(2, -1))
    else:
        assert gathered is None

    # On one machine, float32 sums go through shared memory: larger than a slot (reduced a slot at a time),
    # strided views, exact where the values are integers; rounded sums the same bits on every rank.
    assert tp.shared_memory is not None
    big = torch.arange(SLOT_FLOATS * 2 + 5, dtype=torch.float32) * (rank + 1)
    assert torch.equal(tp.all_reduce(big), torch.arange(SLOT_FLOATS * 2 + 5, dtype=torch.float32) * 6)
    strided = torch.full((6, 4), float(rank + 1)).t()
    tp.all_reduce(strided)
    assert not strided.is_contiguous() and torch.equal(strided, torch.full((4, 6), 6.0))
    noise = torch.randn(7, 576, generator=torch.Generator().manual_seed(rank))
    summed = tp.all_reduce(noise.clone())
    everyone = [torch.empty_like(summed) for _ in range(size)]
    torch.distributed.all_gather(everyone, summed, group=tp.group)
    assert all(torch.equal(summed, other) for other in everyone)
    torch.testing.assert_close(summed, sum(torch.randn(7, 576, generator=torch.Generator().manual_seed(r))
                                           for r in range(size)))
    # Other dtypes go through gloo.
    assert torch.equal(tp.all_reduce(torch.full((3,), rank + 1, dtype=torch.int64)), torch.full((3,), 6))

    # Where one rank cannot map the segment (it runs on another machine), no rank uses one, and it is gone.
    before = set(os.listdir("/dev/shm"))
    if rank == 1:
        shared_memory_reduce._map = lambda path, size: None
    assert SharedMemoryAllReduce.create(tp.group, rank, size, 0, 60.0) is None
    torch.distributed.barrier(group=tp.group)  # rank 0 has removed its file
    assert not {name for name in set(os.listdir("/dev/shm")) - before if name.startswith("pagedllm-all-reduce-")}


def test_tensor_parallel_collectives():
    spawn_ranks(_exercise_collectives, 3, 1)


def test_single_process_collectives_are_free_and_capturable():
    x = torch.randn(3, 4)
    with torch.inference_mode(), _OnlyKernels():
        assert SINGLE_PROCESS.tp.all_reduce(x) is x
        assert SINGLE_PROCESS.tp.gather(x) is x
