"""Run a function on every rank of a tensor- and pipeline-parallel world of spawned CPU processes (gloo)."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from pagedllm.distributed import (ParallelContext, ParallelRanks, destroy_distributed, free_port,
                                  init_distributed)


def spawn_ranks(fn: Callable[..., None], tp_size: int, pp_size: int, *args: Any) -> None:
    """fn(parallel_context, *args) on each of tp_size * pp_size processes; raises if any of them fails. fn
    must be importable by name (a module-level function)."""
    mp.spawn(_rank_main, args=(tp_size, pp_size, free_port(), fn, args), nprocs=tp_size * pp_size)


def _rank_main(rank: int, tp_size: int, pp_size: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    torch.set_num_threads(1)  # several ranks share two cores
    parallel: ParallelContext = init_distributed(ParallelRanks.from_rank(rank, tp_size, pp_size),
                                                 f"tcp://127.0.0.1:{port}", timeout_s=120)
    try:
        fn(parallel, *args)
    finally:
        destroy_distributed()
