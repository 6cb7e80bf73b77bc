"""The tensor-parallel collectives over gloo, and how they meet CPU graph capture. (Pipeline sends and
tensor-parallel groups within stages run in test_sharded_model.py's models.)"""
from __future__ import annotations

import pytest
import torch

from pagedllm.distributed import SINGLE_PROCESS, ParallelContext
from pagedllm.worker.cpu_graph import CaptureRefused, _OnlyKernels
from spawn import spawn_ranks


def _exercise_collectives(parallel: ParallelContext) -> None:
    ranks = parallel.ranks
    x = torch.full((4,), float(ranks.rank + 1))
    # A CPU graph cannot replay an all-reduce: capture refuses it before it runs, on every rank alike, and
    # the group stays usable for the eager step that follows.
    with pytest.raises(CaptureRefused, match="allreduce"), torch.inference_mode(), _OnlyKernels():
        parallel.tp.all_reduce(x)
    assert torch.equal(x, torch.full((4,), float(ranks.rank + 1)))
    assert torch.equal(parallel.tp.all_reduce(x), torch.full((4,), 3.0))

    gathered = parallel.tp.gather(torch.full((2, 3), float(ranks.rank)))
    if ranks.tp_rank == 0:
        assert torch.equal(gathered, torch.tensor([0.0, 1.0]).repeat_interleave(3).expand(2, -1))
    else:
        assert gathered is None


def test_tensor_parallel_collectives():
    spawn_ranks(_exercise_collectives, 2, 1)


def test_single_process_collectives_are_free_and_capturable():
    x = torch.randn(3, 4)
    with torch.inference_mode(), _OnlyKernels():
        assert SINGLE_PROCESS.tp.all_reduce(x) is x
        assert SINGLE_PROCESS.tp.gather(x) is x
