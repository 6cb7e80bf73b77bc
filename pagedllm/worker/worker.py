"""A worker: the model, its KV cache and a model runner on one device."""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from pagedllm.config import EngineConfig
from pagedllm.core.runner_output import ModelRunnerOutput
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.distributed.communication import SINGLE_PROCESS, ParallelContext
from pagedllm.distributed.partition import local_kv_cache_shape
from pagedllm.distributed.process_groups import destroy_distributed, init_distributed
from pagedllm.distributed.ranks import ParallelRanks
from pagedllm.lora.request import LoRARequest
from pagedllm.model.loader import load_model
from pagedllm.pooling.config import is_encoder
from pagedllm.worker.model_runner import ModelRunner
from pagedllm.worker.pooling_runner import PoolingModelRunner, encoder_num_blocks
from pagedllm.worker.profiler import WorkerProfiler
from pagedllm.worker.sleep import OffloadedWeights, release_free_memory
from pagedllm.worker.swap import SwapSpace

logger = logging.getLogger(__name__)


class Worker:
    """One rank of the model: under tensor or pipeline parallelism its shard, its own KV heads and layers."""

    def __init__(self, config: EngineConfig, rank: int = 0, distributed_init_method: Optional[str] = None) -> None:
        self.config = config
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.device = torch.device(config.device_config.device)
        self.model_runner: ModelRunner | PoolingModelRunner | None = None
        self.swap_space: SwapSpace | None = None
        self.profiler = WorkerProfiler(rank, self.device)
        parallel = config.parallel_config
        self.ranks = ParallelRanks.from_rank(rank, parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
        self.parallel: ParallelContext = SINGLE_PROCESS
        self.num_blocks = 0
        # Sleep mode: what is asleep; level 1's saved weights (None at level 2: they reload from the files).
        self.asleep: set[str] = set()
        self.offloaded: OffloadedWeights | None = None

    def load_model(self) -> None:
        if self.ranks.world_size > 1:
            # Workers on one machine share its cores.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.ranks.world_size))
            self.parallel = init_distributed(self.ranks, self.distributed_init_method, self.device)
        torch.manual_seed(self.config.model_config.seed)
        model = load_model(self.config.model_config, str(self.device), self.parallel)
        runner = PoolingModelRunner if self.config.model_config.runner_type == "pooling" else ModelRunner
        self.model_runner = runner(self.config, model, self.device, self.ranks)
        if self.config.speculative_config is not None and self.ranks.is_output_rank:
            # Proposals need only token ids: the rank that samples proposes, with a whole draft model of its own.
            from pagedllm.spec_decode.proposer import build_proposer

            self.model_runner.proposer = build_proposer(self.config, self.device,
                                                        model if self.ranks.world_size == 1 else None)

    def block_bytes(self) -> int:
        """Bytes of one KV cache block over this worker's layers and KV heads, keys and values."""
        shape = local_kv_cache_shape(self.config.model_config.hf_config, self.ranks)
        element = torch.tensor([], dtype=self.config.model_config.activation_dtype).element_size()
        return 2 * shape.num_layers * self.config.cache_config.block_size * shape.num_kv_heads * shape.head_dim * element

    def determine_num_available_blocks(self) -> int:
        cache = self.config.cache_config
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override
        if is_encoder(self.config.model_config.hf_config):  # no KV cache to size
            return encoder_num_blocks(self.config)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - total * (1 - cache.gpu_memory_utilization)
        else:
            budget = cache.kv_cache_memory
        # Each virtual engine (one per pipeline stage) has a cache of its own; a draft model's cache follows the
        # target's block for block.
        proposer = self.model_runner.proposer
        draft_bytes = proposer.block_bytes() if proposer is not None else 0
        num_blocks = int(budget // ((self.block_bytes() + draft_bytes) * self.ranks.pp_size))
        if num_blocks < 1:
            raise ValueError(f"No room for the KV cache: {budget / 2**30:.2f} GiB available, "
                             f"{self.block_bytes()} bytes needed per block.")
        return num_blocks

    def num_swap_blocks(self) -> int:
        """Blocks that fit in `swap_space` GiB of host memory (none unless preempting by swap)."""
        if self.config.scheduler_config.preemption_mode != "swap":
            return 0
        return self.config.cache_config.swap_space_bytes // self.block_bytes()

    def initialize_cache(self, num_blocks: int) -> None:
        """`num_blocks` for each virtual engine (one per pipeline stage)."""
        self.num_blocks = num_blocks
        self.model_runner.initialize_cache(num_blocks)
        if self.model_runner.proposer is not None:
            self.model_runner.proposer.initialize_cache(num_blocks, self.model_runner.kv_caches[0])
        if self.num_swap_blocks():
            self.swap_space = SwapSpace(self.model_runner.kv_caches[0], self.num_swap_blocks())

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step: the block copies of preempted and resumed requests, then the forward pass."""
        if scheduler_output.blocks_to_swap_out:
            self.swap_space.swap_out(scheduler_output.blocks_to_swap_out)
        if scheduler_output.blocks_to_swap_in:
            self.swap_space.swap_in(scheduler_output.blocks_to_swap_in)
        return self.model_runner.execute_model(scheduler_output)

    def sleep(self, level: int) -> None:
        """Release the KV cache and the weights: level 1 keeps a copy of the weights to restore from (a file,
        so resident memory drops), level 2 keeps none."""
        runner = self.model_runner
        runner.release_cache()
        self.swap_space = None
        if runner.proposer is not None:
            runner.proposer.release_weights(level)
        if level == 1:
            self.offloaded = OffloadedWeights(runner.model)
        else:
            runner.model = None  # its memory goes with the last reference
            release_free_memory()
        self.asleep = {"weights", "kv_cache"}
        logger.info("Asleep (level %d): weights and KV cache released.", level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore what `tags` names ("weights", "kv_cache"; all when None) of what is asleep."""
        waking = self.asleep & set(tags or ("weights", "kv_cache"))
        runner = self.model_runner
        if "weights" in waking:
            if self.offloaded is not None:
                self.offloaded.restore()
                self.offloaded = None
            else:
                runner.model = load_model(self.config.model_config, str(self.device), self.parallel)
                if runner.lora is not None:
                    runner.lora.attach(runner.model)
            if runner.proposer is not None:
                runner.proposer.restore_weights()
        if "kv_cache" in waking:
            self.initialize_cache(self.num_blocks)
        self.asleep -= waking
        if waking and not self.asleep:
            runner.reset_decode_graphs()  # the weights or the cache moved: recorded pointers are stale

    # LoRA adapters, through the engine's collective_rpc (LoRA must be enabled).
    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self.model_runner.lora.add(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.model_runner.lora.remove(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        return self.model_runner.lora.pin(lora_id)

    def list_loras(self) -> set[int]:
        return self.model_runner.lora.list()

    def start_profile(self) -> None:
        self.profiler.start()

    def stop_profile(self) -> None:
        self.profiler.stop()

    def check_health(self) -> None:
        if self.model_runner is None:
            raise RuntimeError("The worker has no model loaded.")

    def shutdown(self) -> None:
        """Leave the workers' process group (a no-op in a single process)."""
        destroy_distributed()
