"""Tensor and pipeline parallelism: ranks, process groups, the collectives a sharded model runs, and which
part of the model each rank holds."""
from __future__ import annotations

from pagedllm.distributed.communication import (SINGLE_PROCESS, IntermediateTensors, ParallelContext,
                                                PipelineChannel, TensorParallelGroup)
from pagedllm.distributed.partition import KVCacheShape, local_kv_cache_shape, verify_parallel_sizes
from pagedllm.distributed.process_groups import destroy_distributed, free_port, init_distributed
from pagedllm.distributed.ranks import ParallelRanks

__all__ = ["SINGLE_PROCESS", "IntermediateTensors", "KVCacheShape", "ParallelContext", "ParallelRanks",
           "PipelineChannel", "TensorParallelGroup", "destroy_distributed", "free_port", "init_distributed",
           "local_kv_cache_shape", "verify_parallel_sizes"]
